"""What every long-running unilog process shares: its two connections and its retry loop.

:class:`Links` opens the Postgres and Redis connections lazily, checks the schema once per Postgres session, and
drops both on :meth:`Links.close` (a restart: only committed state carries over). :func:`run_loop` drives a
``step`` until a stop is requested, with the same failure policy everywhere: data loss stops the process, an
injected crash restarts it in-process (or propagates), a connection failure reconnects with exponential back-off,
and anything else is handed to ``on_error`` (a handler failure: roll back and retry).
"""

from __future__ import annotations

import inspect
import threading
import weakref
from collections.abc import Callable
from typing import Any

import psycopg
import redis
import structlog

from . import engine, store
from .config import Settings
from .errors import DataLoss, InjectedCrash, ServerUnreachable

log = structlog.get_logger(__name__)

# Failures of the infrastructure rather than of a record: retried after reconnecting, never held against a record.
TRANSIENT: tuple[type[BaseException], ...] = (psycopg.OperationalError, redis.RedisError, OSError, ServerUnreachable)


class Links:
    """A process's Postgres connection and Redis client, opened on first use.

    ``on_pg_connect(conn)`` runs after each new Postgres session is opened and its schema checked (resolve the
    producer identity, forget a cached checkpoint, ...).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        app_name: str,
        pg_timeout: float | None,
        redis_timeout: float | None,
        autocommit: bool = False,
        on_pg_connect: Callable[[psycopg.Connection[Any]], Any] | None = None,
    ) -> None:
        self.settings = settings
        self.app_name = app_name[:63]  # Postgres truncates application_name there
        self.pg_timeout = pg_timeout
        self.redis_timeout = redis_timeout
        self.autocommit = autocommit
        # a weak reference: a bound method of the owner would make a cycle, and an owner dropped without close()
        # would then keep its session (and a streamer's stream lock) until the garbage collector ran
        self._on_pg_connect = weakref.WeakMethod(on_pg_connect) if inspect.ismethod(on_pg_connect) else None
        self._on_pg_connect_fn = None if inspect.ismethod(on_pg_connect) else on_pg_connect
        self._pg: psycopg.Connection[Any] | None = None
        self._redis: engine.RedisStreams | None = None

    def pg(self) -> psycopg.Connection[Any]:
        """The Postgres connection, (re)opened and schema-checked if needed."""
        if self._pg is None or self._pg.closed:
            conn = store.connect(
                self.settings.conninfo,
                autocommit=self.autocommit,
                application_name=self.app_name,
                timeout=self.pg_timeout,
            )
            store.check_schema(conn)
            if not self.autocommit:
                conn.commit()
            self._pg = conn
            callback = self._on_pg_connect() if self._on_pg_connect is not None else self._on_pg_connect_fn
            if callback is not None:
                callback(conn)
        return self._pg

    def redis(self) -> engine.RedisStreams:
        """The Redis client, created and pinged if needed."""
        if self._redis is None:
            client = engine.connect(self.settings.redis_url, socket_timeout=self.redis_timeout)
            engine.ping(client, self.settings.redis_url)
            self._redis = engine.RedisStreams(client)
        return self._redis

    @property
    def pg_open(self) -> psycopg.Connection[Any] | None:
        """The Postgres connection if one is open, without opening one."""
        return self._pg if self._pg is not None and not self._pg.closed else None

    def discard_failed_transaction(self) -> None:
        """After a failure: drop the Postgres connection if it is broken or still inside a transaction."""
        pg = self.pg_open
        if pg is not None and (pg.broken or pg.info.transaction_status != psycopg.pq.TransactionStatus.IDLE):
            pg.close()
            self._pg = None

    def drop_redis(self) -> None:
        """Close the Redis client; the next call reconnects (after a timeout its connection state is unknown)."""
        if self._redis is not None:
            self._redis.close()
            self._redis = None

    def close(self) -> None:
        """Close both connections."""
        if self._pg is not None and not self._pg.closed:
            self._pg.close()
        self._pg = None
        if self._redis is not None:
            self._redis.close()
            self._redis = None


def run_loop(
    step: Callable[[], Any],
    stop_event: threading.Event,
    *,
    label: dict[str, Any],
    restart_after_crash: bool,
    restart: Callable[[], None],
    on_error: Callable[[Exception], None] | None = None,
    max_backoff: float = 10.0,
) -> None:
    """Call ``step`` until ``stop_event`` is set (the step in progress always finishes).

    ``restart`` drops the process's connections and caches; ``label`` names the process in logs.
    """
    backoff = 0.1

    def pause() -> None:
        nonlocal backoff
        stop_event.wait(backoff)
        backoff = min(backoff * 2, max_backoff)

    while not stop_event.is_set():
        try:
            step()
            backoff = 0.1
        except DataLoss:
            raise
        except InjectedCrash as exc:
            if not restart_after_crash:
                raise
            log.warning("crashed (injected); restarting in-process", point=exc.point, **label)
            restart()
        except TRANSIENT as exc:
            log.error("connection failed; retrying", error=str(exc), retry_in=backoff, **label)
            restart()
            pause()
        except Exception as exc:
            if on_error is None:
                raise
            log.exception("handler failed; rolled back, retrying", error=str(exc), retry_in=backoff, **label)
            on_error(exc)
            pause()
