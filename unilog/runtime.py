"""What every long-running unilog process shares: the worker contract, its two connections and its loop.

:class:`Worker` is the declared interface (``connect``, ``run_once``, ``drain``, ``run(stop_event)``, ``close``)
that the streamer, the checkpoint consumer, the group worker and the partition worker implement. :class:`Links`
opens a worker's Postgres and Redis connections lazily, checks the schema once per Postgres session, and drops both
on :meth:`Links.close` (a restart: only committed state carries over). :func:`serve` is the one loop they all run,
with one failure policy and hooks for what differs (the streamer's ``LISTEN`` wait, the partition worker's
re-balancing).
"""

from __future__ import annotations

import abc
import inspect
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, ClassVar, Self

import psycopg
import structlog

from . import engine, metrics, store
from .config import Settings
from .errors import (
    ConfigurationError,
    DataLoss,
    InjectedCrash,
    NotReplicated,
    PolicyStop,
    ServerUnreachable,
    UnilogError,
)
from .health import HEALTH

log = structlog.get_logger(__name__)

# Failures of the infrastructure rather than of a record: retried after reconnecting, never held against a record.
TRANSIENT: tuple[type[BaseException], ...] = (psycopg.OperationalError, engine.RedisError, OSError, ServerUnreachable)
# Failures of the set-up no retry can fix (a Redis replica, a refused privilege): the process stops with one line.
FATAL: tuple[type[Exception], ...] = (*engine.FATAL, *store.FATAL)


def fatal(exc: BaseException) -> UnilogError | None:
    """The one-line error for a server's refusal no retry can fix (a replica, a missing privilege), or None."""
    return engine.fatal(exc) or store.fatal(exc)


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

    @property
    def redis_open(self) -> engine.RedisStreams | None:
        """The Redis client if one was created, without creating one."""
        return self._redis

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


class Worker(abc.ABC):
    """The contract of every long-running unilog process: the streamer, the checkpoint consumer, the group worker
    and the partition worker.

    * :meth:`connect` opens both connections now and checks what must hold before work starts (schema, checkpoint,
      group, partition count); it raises a one-line-worthy :class:`~unilog.errors.UnilogError` if it cannot.
    * :meth:`run_once` does one pass (at most one batch per source) and returns what it did. A pass either commits
      its batch whole or raises with nothing committed; a record is never skipped because a pass failed.
    * :meth:`drain` is burst mode: passes until nothing is left to do, then returns the records processed.
    * :meth:`run` is the long-running mode: passes until ``stop_event`` is set, always finishing the pass in
      progress (SIGTERM lets the current batch finish); every worker runs the same loop, :func:`serve`.
    * :meth:`close` drops the connections (and with them the session's locks); only committed state carries over,
      so a closed worker can be connected again.

    Subclasses set :attr:`links`, :attr:`restart_after_crash` and :attr:`max_backoff` in ``__init__`` and may
    override the hooks :meth:`before_pass`, :meth:`idle`, :meth:`restart`, :meth:`recover` and
    :meth:`on_handler_error`.
    """

    kind: ClassVar[str] = "worker"  # names the process in its log lines ("streamer started", ...)
    # failures of the infrastructure: reconnect, back off, retry; never held against a record
    retryable: ClassVar[tuple[type[BaseException], ...]] = TRANSIENT
    links: Links
    restart_after_crash: bool = True
    max_backoff: float = 10.0

    @abc.abstractmethod
    def connect(self) -> None:
        """Connect to both servers and check the preconditions of work."""

    @abc.abstractmethod
    def run_once(self) -> Any:
        """One pass; returns a result that :meth:`idle` understands."""

    @abc.abstractmethod
    def drain(self) -> int:
        """Work until nothing is left (burst mode); return the records processed."""

    @property
    @abc.abstractmethod
    def label(self) -> dict[str, Any]:
        """What names this process in log lines (its stream, consumer, group or worker)."""

    def close(self) -> None:
        """Close both connections; only committed state carries over."""
        self.links.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, stop_event: threading.Event) -> None:
        """Work until ``stop_event`` is set, finishing the pass in progress first (see :func:`serve`)."""
        self.connect()
        log.info(f"{self.kind} started", **self.label, **self.describe())
        try:
            serve(self, stop_event)
        finally:
            self.stopped()
        log.info(f"{self.kind} stopped", **self.label, **self.totals())

    # -- hooks -------------------------------------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """Extra fields for the start-up log line (servers, with passwords redacted)."""
        return self.links.settings.describe()

    def totals(self) -> dict[str, Any]:
        """Extra fields for the stop log line (what was processed)."""
        return {}

    def before_pass(self) -> None:  # noqa: B027 (an optional hook)
        """Called by the loop before each pass (the partition worker re-balances here)."""

    def idle(self, result: Any, stop_event: threading.Event) -> None:  # noqa: B027 (an optional hook)
        """Called by the loop after a successful pass with its result: wait here when there was nothing to do and
        :meth:`run_once` does not block by itself (the streamer sleeps on ``LISTEN``)."""

    def restart(self) -> None:
        """After an injected crash: start over from committed state, in-process."""
        self.close()

    def recover(self) -> None:
        """After a connection failure, before the back-off: drop what may be broken."""
        self.close()

    def on_handler_error(self, exc: Exception) -> bool:
        """After any other exception from a pass: return True if it was a handler's failure that was rolled back
        (the loop backs off and retries the batch), False to let it propagate."""
        return False

    def stopped(self) -> None:  # noqa: B027 (an optional hook)
        """Called once when the loop ends, however it ends."""


def account_batch(
    owner: Any, kind: str, name: str, entries: list[engine.Entry], handled: int, started: float, **fields: Any
) -> int:
    """Count a committed batch of ``owner``, a consumer (``kind``: checkpoint, group, partition): its totals, the
    metrics and the ``batch consumed`` log line (with ``fields``); return the entries skipped."""
    skipped = len(entries) - handled
    owner.handled_total += handled
    owner.skipped_total += skipped
    seconds = time.perf_counter() - started
    metrics.batch_consumed(
        kind, owner.stream, name, handled=handled, skipped=skipped, seconds=seconds, first_id=entries[0][0]
    )
    log.info("batch consumed", records=handled, skipped=skipped, ms=round(seconds * 1000, 2), **fields)
    return skipped


def _count_retry(process: str, cause: str, exc: BaseException, delay: float) -> None:
    metrics.RETRIES.labels(process, cause).inc()
    metrics.ERRORS.labels(process, type(exc).__name__).inc()
    metrics.BACKOFF_SECONDS.labels(process).inc(delay)


class Backoff:
    """Exponential back-off between failed passes: 0.1 s, doubling up to ``maximum``; reset by a success."""

    def __init__(self, maximum: float) -> None:
        self.maximum = maximum
        self.delay = 0.1

    def wait(self, stop_event: threading.Event) -> None:
        stop_event.wait(self.delay)
        self.delay = min(self.delay * 2, self.maximum)

    def reset(self) -> None:
        self.delay = 0.1


def serve(worker: Worker, stop_event: threading.Event) -> None:
    """The loop every worker shares: passes until ``stop_event`` is set (the pass in progress always finishes),
    with the one failure policy of :func:`failure_action`, for the pass and for the wait after it alike (a WAL-mode
    streamer reads its slot's connection while it waits: a connection lost then is reconnected, not fatal)."""
    backoff = Backoff(worker.max_backoff)
    loop = health_name(worker)
    HEALTH.turned(loop)  # the loop exists from here: a first pass that hangs makes /healthz fail too
    try:
        while not stop_event.is_set():
            try:
                worker.before_pass()
                result = worker.run_once()
                HEALTH.turned(loop)
                backoff.reset()
                worker.idle(result, stop_event)
            except BaseException as exc:
                action = failure_action(worker, exc, backoff.delay)
                HEALTH.turned(loop, ready=action != "reconnect", reason=str(exc))
                if action == "restart":
                    worker.restart()
                    continue
                if action == "reconnect":
                    worker.recover()
                backoff.wait(stop_event)
    finally:
        HEALTH.stopped(loop)


def health_name(worker: Any) -> str:
    """How ``/healthz`` and ``/readyz`` name a worker's loop: its kind and label (``streamer streamer=a``)."""
    return " ".join([worker.kind, *(f"{k}={v}" for k, v in worker.label.items())])


def failure_action(worker: Any, exc: BaseException, delay: float) -> str:
    """The failure policy of every loop (threads and asyncio alike), for a pass that raised ``exc``: raise to stop,
    or return what to do before the next pass, after a back-off of ``delay`` seconds unless it says ``restart``.

    Data loss (:class:`~unilog.errors.DataLoss`), a configuration no retry can fix and a worker's policy to stop
    (:class:`~unilog.errors.PolicyStop`) stop the process, as does a server's refusal no retry can fix (raised as
    its one line); an injected crash restarts the worker in-process (``"restart"``; or propagates, without
    ``restart_after_crash``); a connection failure reconnects (``"reconnect"``); a dead letter too few replicas
    acknowledged (:class:`~unilog.errors.NotReplicated`) is retried on the same connections (``"retry"``); a handler
    failure is rolled back and retried (``"retry"``) if the worker says so (``worker.on_handler_error``); anything
    else propagates.
    """
    if not isinstance(exc, Exception) and not isinstance(exc, InjectedCrash):
        raise exc  # KeyboardInterrupt, SystemExit, a cancelled task
    if isinstance(exc, (DataLoss, ConfigurationError, PolicyStop)):
        metrics.ERRORS.labels(worker.kind, type(exc).__name__).inc()
        raise exc  # data loss, a setup no retry can fix (a key of the wrong type, say) and a policy's stop end it
    if isinstance(exc, FATAL):
        metrics.ERRORS.labels(worker.kind, type(exc).__name__).inc()
        raise fatal(exc) or exc from None  # the same, as the server said it
    if isinstance(exc, InjectedCrash):
        if not worker.restart_after_crash:
            raise exc
        metrics.RESTARTS.labels(worker.kind).inc()
        log.warning("crashed (injected); restarting in-process", point=exc.point, **worker.label)
        return "restart"
    if isinstance(exc, NotReplicated):  # rolled back before the checkpoint passed the record; connections are fine
        _count_retry(worker.kind, "replicas", exc, delay)
        log.error(
            "too few replicas acknowledged a dead letter; retrying", error=str(exc), retry_in=delay, **worker.label
        )
        return "retry"
    if isinstance(exc, worker.retryable):
        _count_retry(worker.kind, "connection", exc, delay)
        advice = {"hint": hint} if (hint := engine.hint(exc)) else {}
        log.error("connection failed; retrying", error=str(exc), retry_in=delay, **advice, **worker.label)
        return "reconnect"
    if not worker.on_handler_error(exc):
        metrics.ERRORS.labels(worker.kind, type(exc).__name__).inc()
        raise exc
    _count_retry(worker.kind, "handler", exc, delay)
    log.error("handler failed; rolled back, retrying", error=str(exc), retry_in=delay, exc_info=exc, **worker.label)
    return "retry"
