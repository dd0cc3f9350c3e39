"""The worker contract, its two connections and its one loop, written once for both faces.

:class:`AsyncWorker` is the declared interface (``connect``, ``run_once``, ``drain``, ``run(stop_event)``,
``close``) that every long-running unilog process implements; :class:`AsyncLinks` opens a worker's Postgres and
Redis connections lazily, checks the schema once per Postgres session and pings Redis once per client, and drops
both on :meth:`AsyncLinks.close` (a restart: only committed state carries over). :func:`serve` is the one loop every
worker runs, ``run`` and ``drain`` alike, with the one failure policy (:func:`unilog.runtime.policy.decide`) and
the loop's hooks (:mod:`unilog.runtime.hooks`).
"""

from __future__ import annotations

import abc
import inspect
import weakref
from collections.abc import Callable
from typing import Any, ClassVar, Self

import psycopg
import structlog

from ..._acompat import AEvent, asleep_until
from ...config import Settings
from ...engine import aio as engine
from ...errors import ReadOnlyServer
from ...store import aio as store
from ..hooks import DEFAULT_HOOKS, Hook
from ..policy import TRANSIENT, Backoff, decide

log = structlog.get_logger("unilog.runtime")


class AsyncLinks:
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
        on_pg_connect: Callable[[psycopg.AsyncConnection[Any]], Any] | None = None,
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
        self._pg: psycopg.AsyncConnection[Any] | None = None
        self._redis: engine.AsyncRedisStreams | None = None

    async def pg(self) -> psycopg.AsyncConnection[Any]:
        """The Postgres connection, (re)opened and schema-checked if needed."""
        conn = await self.session()
        if conn is not self._pg:
            try:
                await store.check_schema(conn)
                if not self.autocommit:
                    await conn.commit()
            except BaseException:
                await self.end_session(conn)
                raise
            self._pg = conn
            callback = self._on_pg_connect() if self._on_pg_connect is not None else self._on_pg_connect_fn
            if callback is not None:
                callback(conn)
        return conn

    async def session(self) -> psycopg.AsyncConnection[Any]:
        """The Postgres session to use: the open one, else a new one; :meth:`pg` checks the schema of each new one.
        A subclass may lend a session of its own (Django's links lend Django's)."""
        if self._pg is not None and not self._pg.closed:
            return self._pg
        return await store.connect_async(
            self.settings.conninfo,
            autocommit=self.autocommit,
            application_name=self.app_name,
            timeout=self.pg_timeout,
        )

    async def end_session(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Close a session :meth:`session` gave (a subclass that lends one of its own gives it back instead)."""
        if not conn.closed:
            await conn.close()

    async def redis(self) -> engine.AsyncRedisStreams:
        """The Redis client, created and pinged if needed."""
        if self._redis is None:
            client = engine.connect_async(self.settings.redis_url, socket_timeout=self.redis_timeout)
            try:
                await engine.ping(client, self.settings.redis_url)
            except BaseException:
                await client.aclose()
                raise
            self._redis = engine.AsyncRedisStreams(client)
        return self._redis

    @property
    def pg_open(self) -> psycopg.AsyncConnection[Any] | None:
        """The Postgres connection if one is open, without opening one."""
        return self._pg if self._pg is not None and not self._pg.closed else None

    @property
    def redis_open(self) -> engine.AsyncRedisStreams | None:
        """The Redis client if one was created, without creating one."""
        return self._redis

    async def discard_failed_transaction(self) -> None:
        """After a failure: drop the Postgres connection if it is closed, broken or still inside a transaction."""
        pg = self._pg
        idle = psycopg.pq.TransactionStatus.IDLE
        if pg is not None and (pg.closed or pg.broken or pg.info.transaction_status != idle):
            self._pg = None
            await self.end_session(pg)

    async def drop_redis(self) -> None:
        """Close the Redis client; the next call reconnects (after a timeout its connection state is unknown)."""
        redis_api, self._redis = self._redis, None
        if redis_api is not None:
            await redis_api.aclose()

    async def close(self) -> None:
        """Close both connections."""
        pg, self._pg = self._pg, None
        if pg is not None:
            await self.end_session(pg)
        await self.drop_redis()


class AsyncWorker(abc.ABC):
    """The contract of every long-running unilog process: the streamer, the checkpoint consumer, the group worker,
    the partition worker and the backfill.

    * :meth:`connect` opens both connections now and checks what must hold before work starts (schema, checkpoint,
      group, partition count); it raises a one-line-worthy :class:`~unilog.errors.UnilogError` if it cannot.
    * :meth:`run_once` does one pass (at most one batch per source) and returns what it did. A pass either commits
      its batch whole or raises with nothing committed; a record is never skipped because a pass failed.
    * :meth:`drain` is burst mode: passes (:meth:`drain_pass`) until nothing is left to do, then returns the
      records processed; a handler's failure is retried as in :meth:`run`, any other failure raises.
    * :meth:`run` is the long-running mode: passes until ``stop_event`` is set (forever without one), always
      finishing the pass in progress (SIGTERM lets the current batch finish); it closes the connections when it
      returns, however it returns.
    * :meth:`close` drops the connections (and with them the session's locks); only committed state carries over,
      so a closed worker can be connected again.

    Both modes run :func:`serve`: one failure policy, one set of :attr:`hooks`. Subclasses set :attr:`links`,
    :attr:`restart_after_crash` and :attr:`max_backoff` in ``__init__`` and may override :meth:`before_pass`,
    :meth:`idle`, :meth:`restart`, :meth:`recover`, :meth:`forget`, :meth:`stopped`, :meth:`is_handler_failure` and
    :meth:`after_handler_failure`.
    """

    kind: ClassVar[str] = "worker"  # names the process in its log lines ("streamer started", ...)
    # failures of the infrastructure: reconnect, back off, retry; never held against a record
    retryable: ClassVar[tuple[type[BaseException], ...]] = TRANSIENT
    hooks: ClassVar[tuple[Hook, ...]] = DEFAULT_HOOKS
    links: AsyncLinks
    restart_after_crash: bool = True
    max_backoff: float = 10.0

    @abc.abstractmethod
    async def connect(self) -> None:
        """Connect to both servers and check the preconditions of work."""

    @abc.abstractmethod
    async def run_once(self) -> Any:
        """One pass; returns a result that :meth:`idle` understands."""

    @abc.abstractmethod
    async def drain_pass(self) -> tuple[int, bool]:
        """One pass of burst mode, never blocking for new work: (records processed, whether nothing is left)."""

    @property
    @abc.abstractmethod
    def label(self) -> dict[str, Any]:
        """What names this process in log lines (its stream, consumer, group or worker)."""

    async def drain(self) -> int:
        """Work until nothing is left (burst mode); return the records processed."""
        await self.connect()
        return await serve(self, None, drain=True)

    async def run(self, stop_event: AEvent | None = None) -> None:
        """Work until ``stop_event`` is set, finishing the pass in progress first (see :func:`serve`); the
        connections are closed when it returns."""
        stop_event = stop_event if stop_event is not None else AEvent()
        try:
            if not await self._connect_to_primary(stop_event):
                return
            log.info(f"{self.kind} started", **self.label, **self.describe())
            await serve(self, stop_event)
        finally:
            await self.stopped()
            await self.close()
        log.info(f"{self.kind} stopped", **self.label, **self.totals())

    async def _connect_to_primary(self, stop_event: AEvent) -> bool:
        """Connect (a server that cannot be reached or refuses raises: a process that cannot start says so at
        once), waiting while the Postgres reached is a read-only standby, as a failover promotes one; False if
        ``stop_event`` was set first."""
        backoff = Backoff(self.max_backoff)
        while True:
            try:
                await self.connect()
                return True
            except ReadOnlyServer as exc:
                log.warning("waiting for a primary", error=str(exc), retry_in=backoff.delay, **self.label)
                await self.close()
            await asleep_until(stop_event, backoff.delay)
            backoff.grow()
            if stop_event.is_set():
                return False

    async def close(self) -> None:
        """Close both connections; only committed state carries over."""
        self.forget()
        await self.links.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- hooks -------------------------------------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """Extra fields for the start-up log line (servers, with passwords redacted)."""
        return self.links.settings.describe()

    def totals(self) -> dict[str, Any]:
        """Extra fields for the stop log line (what was processed)."""
        return {}

    def forget(self) -> None:  # noqa: B027 (an optional hook)
        """Drop state cached from the connections (a checkpoint, a pending cursor) when they are closed."""

    async def before_pass(self) -> None:  # noqa: B027 (an optional hook)
        """Called by the loop before each pass of :meth:`run` (the partition worker re-balances here)."""

    async def idle(self, result: Any, stop_event: AEvent) -> None:  # noqa: B027 (an optional hook)
        """Called by the loop after a successful pass of :meth:`run` with its result: wait here when there was
        nothing to do and :meth:`run_once` does not block by itself (the streamer sleeps on ``LISTEN``)."""

    async def restart(self) -> None:
        """After an injected crash: start over from committed state, in-process."""
        await self.close()

    async def recover(self) -> None:
        """After a connection failure, before the back-off: drop what may be broken."""
        await self.close()

    def is_handler_failure(self, exc: Exception) -> bool:
        """Whether ``exc``, raised by a pass, was a handler's failure that was rolled back (the loop backs off and
        retries the batch) rather than one to let propagate. A question only: the failure policy
        (:func:`unilog.runtime.policy.decide`) asks it and must change nothing; what the worker does about the
        failure is :meth:`after_handler_failure`."""
        return False

    def after_handler_failure(self, exc: Exception) -> None:  # noqa: B027 (an optional hook)
        """Called by the loop when it carries out a handler failure's verdict (retry), before the back-off: drop
        what the rolled-back batch left in memory."""

    async def stopped(self) -> None:  # noqa: B027 (an optional hook)
        """Called once when :meth:`run` ends, however it ends, before the connections are closed."""


async def serve(worker: AsyncWorker, stop_event: AEvent | None, *, drain: bool = False) -> int:
    """The loop every worker runs: passes until ``stop_event`` is set (the pass in progress always finishes) or, in
    burst mode (``drain``), until a pass finds nothing left; returns the records processed in burst mode.

    A pass that raised is settled by :func:`~unilog.runtime.policy.decide`, for the pass and for the wait after it
    alike (a WAL-mode streamer reads its slot's connection while it waits: a connection lost then is reconnected,
    not fatal); ``worker.hooks`` hear of every pass and every failure.
    """
    stop_event = stop_event if stop_event is not None else AEvent()
    backoff, total = Backoff(worker.max_backoff), 0
    for hook in worker.hooks:
        hook.started(worker)
    try:
        while not stop_event.is_set():
            try:
                for hook in worker.hooks:
                    hook.before_pass(worker)
                if drain:
                    handled, done = await worker.drain_pass()
                    total += handled
                    result: Any = handled
                else:
                    await worker.before_pass()
                    result = await worker.run_once()
                for hook in worker.hooks:
                    hook.passed(worker, result)
                backoff.reset()
                if drain and done:
                    return total
                if not drain:
                    await worker.idle(result, stop_event)
            except BaseException as exc:
                await _settle(worker, exc, backoff, stop_event, drain)
    finally:
        for hook in worker.hooks:
            hook.stopped(worker)
    return total


async def _settle(worker: AsyncWorker, exc: BaseException, backoff: Backoff, stop_event: AEvent, drain: bool) -> None:
    """Act on the failure policy's verdict for ``exc``: raise it, restart, or reconnect/retry after the back-off."""
    verdict = decide(worker, exc, drain=drain)
    if verdict.cause == "handler" and isinstance(exc, Exception):
        worker.after_handler_failure(exc)
    for hook in worker.hooks:
        hook.failed(worker, exc, verdict, backoff.delay)
    if verdict.action == "stop":
        if verdict.error is exc:
            raise exc
        raise verdict.error from None  # a server's refusal, as its one line
    if verdict.action == "restart":
        await worker.restart()
        return
    if verdict.action == "reconnect":
        await worker.recover()
    await asleep_until(stop_event, backoff.delay)
    backoff.grow()
