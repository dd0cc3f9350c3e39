"""What the asyncio workers share: their two connections and their loop, under the threaded workers' contract and
failure policy (:func:`unilog.runtime.failure_action`).

:class:`AsyncWorker` is :class:`~unilog.runtime.Worker`'s contract with every method awaited: ``connect()``,
``run_once()``, ``drain()``, ``run(stop)`` (``stop`` an ``asyncio.Event``; the pass in progress finishes) and
``close()``, and ``async with``; :class:`AsyncLinks` is :class:`~unilog.runtime.Links` with every method awaited.
The workers built on them are the source of the threaded ones (see :mod:`unilog.consume`), so both faces check the
same preconditions and run the same sequence.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import inspect
import weakref
from collections.abc import Callable
from typing import Any, ClassVar, Self

import psycopg
import structlog

from .config import Settings
from .engine.aio import AsyncRedisStreams, connect_async
from .health import HEALTH
from .runtime import TRANSIENT, failure_action, health_name
from .store import aio as store

log = structlog.get_logger(__name__)


class AsyncLinks:
    """The asyncio face of :class:`~unilog.runtime.Links`: a worker's Postgres connection (schema-checked once per
    session) and Redis client, opened on first use, with the same methods awaited."""

    def __init__(
        self,
        settings: Settings,
        *,
        app_name: str,
        pg_timeout: float | None,
        redis_timeout: float | None,
        on_pg_connect: Callable[[psycopg.AsyncConnection[Any]], Any] | None = None,
    ) -> None:
        self.settings = settings
        self.app_name = app_name[:63]
        self.pg_timeout, self.redis_timeout = pg_timeout, redis_timeout
        # weak, as in Links: no cycle through a bound method of the owner
        self._on_pg_connect = weakref.WeakMethod(on_pg_connect) if inspect.ismethod(on_pg_connect) else None
        self._on_pg_connect_fn = None if inspect.ismethod(on_pg_connect) else on_pg_connect
        self._pg: psycopg.AsyncConnection[Any] | None = None
        self._redis: AsyncRedisStreams | None = None

    async def pg(self) -> psycopg.AsyncConnection[Any]:
        """The Postgres connection, (re)opened and schema-checked if needed."""
        if self._pg is None or self._pg.closed:
            conn = await store.connect_async(self.settings.conninfo, application_name=self.app_name)
            await store.check_schema(conn)
            await conn.commit()
            self._pg = conn
            callback = self._on_pg_connect() if self._on_pg_connect is not None else self._on_pg_connect_fn
            if callback is not None:
                callback(conn)
        return self._pg

    async def redis(self) -> AsyncRedisStreams:
        """The Redis client (it connects on first command)."""
        if self._redis is None:
            self._redis = AsyncRedisStreams(connect_async(self.settings.redis_url, socket_timeout=self.redis_timeout))
        return self._redis

    @property
    def pg_open(self) -> psycopg.AsyncConnection[Any] | None:
        return self._pg if self._pg is not None and not self._pg.closed else None

    async def discard_failed_transaction(self) -> None:
        """After a failure: drop the Postgres connection if it is broken or still inside a transaction."""
        pg = self.pg_open
        if pg is not None and (pg.broken or pg.info.transaction_status != psycopg.pq.TransactionStatus.IDLE):
            await pg.close()
            self._pg = None

    async def close(self) -> None:
        pg, redis_api = self._pg, self._redis
        self._pg, self._redis = None, None
        if pg is not None and not pg.closed:
            await pg.close()
        if redis_api is not None:
            await redis_api.aclose()


class AsyncWorker(abc.ABC):
    """The asyncio twin of :class:`~unilog.runtime.Worker`. Subclasses set ``links`` (an :class:`AsyncLinks`),
    ``restart_after_crash`` and ``max_backoff`` in ``__init__``, and implement :meth:`connect`, :meth:`run_once`,
    :meth:`drain` and :attr:`label` (and may override :meth:`on_handler_error` and :meth:`forget`). The workers'
    own subclasses are generated into the threaded face too (see :mod:`unilog.consume`)."""

    kind: ClassVar[str] = "worker"
    retryable: ClassVar[tuple[type[BaseException], ...]] = (*TRANSIENT, TimeoutError)  # TimeoutError: a deadline
    links: AsyncLinks
    restart_after_crash: bool = True
    max_backoff: float = 10.0

    @abc.abstractmethod
    async def connect(self) -> None:
        """Connect to both servers and check the preconditions of work."""

    @abc.abstractmethod
    async def run_once(self) -> Any:
        """One pass."""

    @abc.abstractmethod
    async def drain(self) -> int:
        """Work until nothing is left (burst mode); return the records processed."""

    @property
    @abc.abstractmethod
    def label(self) -> dict[str, Any]:
        """What names this worker in log lines."""

    def describe(self) -> dict[str, Any]:
        """Extra fields for the start-up log line (its stream, the servers with passwords redacted)."""
        return self.links.settings.describe()

    def on_handler_error(self, exc: Exception) -> bool:
        """After a pass raised ``exc``: True if it was a handler's failure, rolled back (back off and retry)."""
        return False

    def forget(self) -> None:  # noqa: B027 (an optional hook)
        """Drop state cached from the connections (a checkpoint, a pending cursor) when they are closed."""

    async def close(self) -> None:
        """Close both connections; only committed state carries over."""
        self.forget()
        await self.links.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Work until ``stop`` is set (forever without one), finishing the pass in progress first; failures follow
        :func:`~unilog.runtime.failure_action`. Closes the connections when it returns."""
        stop = stop or asyncio.Event()
        await self.connect()
        log.info(f"{self.kind} started", asyncio=True, **self.label, **self.describe())
        delay, loop = 0.1, health_name(self)
        HEALTH.turned(loop)
        try:
            while not stop.is_set():
                try:
                    await self.run_once()
                except BaseException as exc:
                    action = failure_action(self, exc, delay)
                    HEALTH.turned(loop, ready=action != "reconnect", reason=str(exc))
                    if action != "retry":  # a restart and a reconnect start over from committed state
                        await self.close()
                    if action != "restart":
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop.wait(), delay)
                        delay = min(delay * 2, self.max_backoff)
                    continue
                HEALTH.turned(loop)
                delay = 0.1
        finally:
            HEALTH.stopped(loop)
            await self.close()
        log.info(f"{self.kind} stopped", **self.label)
