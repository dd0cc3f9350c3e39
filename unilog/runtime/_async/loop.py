"""The worker contract, its two connections and its one loop, written once for both faces.

:class:`AsyncWorker` is the declared interface (``connect``, ``run_once``, ``drain``, ``run(stop_event)``,
``close``) that every long-running unilog process implements; :class:`AsyncLinks` opens a worker's Postgres and
Redis connections lazily, checks the schema once per Postgres session and pings Redis once per client, and drops
both on :meth:`AsyncLinks.close` (a restart: only committed state carries over). :func:`serve` is the one loop every
worker runs, ``run`` and ``drain`` alike, from ``connect`` on, with the one failure policy
(:func:`unilog.runtime.policy.decide`), one back-off and the worker's hooks (:mod:`unilog.runtime.hooks`).
"""

from __future__ import annotations

import abc
import inspect
import weakref
from collections.abc import Callable
from typing import Any, ClassVar, Self

import psycopg

from ..._acompat import AEvent, asleep_until
from ...config import Settings
from ...engine import aio as engine
from ...store import aio as store
from ..hooks import DEFAULT_HOOKS, Hook, Hooks
from ..policy import TRANSIENT, Backoff, decide, note_dropped_client, sweep_dropped_clients


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
            sweep_dropped_clients()  # a dropped client's parser is garbage in a cycle by now (unilog.runtime.policy)
            client = engine.connect_async(self.settings.redis_url, socket_timeout=self.redis_timeout)
            try:
                await engine.ping(client, self.settings.redis_url)
            except BaseException:
                await client.aclose()
                note_dropped_client()
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
            note_dropped_client()
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

    Both modes run :func:`serve`: one failure policy, one back-off, the worker's :attr:`hooks` (its own: see
    :class:`~unilog.runtime.hooks.Hooks`; a subclass changes its defaults with :attr:`default_hooks`). Subclasses
    set :attr:`links`, :attr:`restart_after_crash` and :attr:`max_backoff` in ``__init__`` and may override the
    loop's steps :meth:`prepare_pass`, :meth:`idle`, :meth:`restart`, :meth:`recover`, :meth:`forget`,
    :meth:`finish`, :meth:`is_handler_failure` and :meth:`after_handler_failure` (no step is named as a hook's
    method: those all start with ``on_``).
    """

    kind: ClassVar[str] = "worker"  # names the process in its log lines ("streamer started", ...)
    # failures of the infrastructure: reconnect, back off, retry; never held against a record
    retryable: ClassVar[tuple[type[BaseException], ...]] = TRANSIENT
    default_hooks: ClassVar[tuple[Hook, ...]] = DEFAULT_HOOKS  # each instance's hooks start as these
    links: AsyncLinks
    restart_after_crash: bool = True
    max_backoff: float = 10.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for old, new in _RENAMED_STEPS.items():
            if old in vars(cls):
                raise TypeError(f"{cls.__name__}.{old} is a step of the loop by an earlier name: it is now {new}")

    @property
    def hooks(self) -> Hooks:
        """This worker's hooks, in the order the loop calls them: its class's :attr:`default_hooks`, then what was
        added (``worker.hooks.add(hook, before=..., after=...)``); another worker's are not changed."""
        hooks = self.__dict__.get("_hooks")
        if hooks is None:
            hooks = self.__dict__["_hooks"] = Hooks(type(self).default_hooks)
        return hooks

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
        """Connect, then work until nothing is left (burst mode); return the records processed."""
        return await serve(self, None, drain=True)

    async def run(self, stop_event: AEvent | None = None) -> None:
        """Connect, then work until ``stop_event`` is set, finishing the pass in progress first (see :func:`serve`:
        a server that cannot be reached yet, or a read-only standby, is waited for, as while running); the
        connections are closed when it returns."""
        try:
            await serve(self, stop_event)
        finally:
            await self.close()

    async def close(self) -> None:
        """Close both connections; only committed state carries over."""
        self.forget()
        await self.links.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the loop's steps (what the loop asks of the worker; hooks only hear of it) -----------------------------------

    def describe(self) -> dict[str, Any]:
        """Extra fields for the start-up log line (servers, with passwords redacted)."""
        return self.links.settings.describe()

    def totals(self) -> dict[str, Any]:
        """Extra fields for the stop log line (what was processed)."""
        return {}

    def forget(self) -> None:  # noqa: B027 (an optional step)
        """Drop state cached from the connections (a checkpoint, a pending cursor) when they are closed."""

    async def prepare_pass(self, drain: bool) -> None:  # noqa: B027 (an optional step)
        """Called by the loop before each pass, in both modes (``drain``: burst mode's), after the hooks'
        ``on_pass_start``; raising here counts as the pass failing (the partition worker re-balances here)."""

    async def idle(self, result: Any, stop_event: AEvent) -> None:  # noqa: B027 (an optional step)
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

    def after_handler_failure(self, exc: Exception) -> None:  # noqa: B027 (an optional step)
        """Called by the loop when it carries out a handler failure's verdict (retry), before the back-off: drop
        what the rolled-back batch left in memory."""

    async def finish(self) -> None:  # noqa: B027 (an optional step)
        """Called once when the loop ends, in both modes and however it ends, before the hooks' ``on_stop`` (and
        before :meth:`run` closes the connections)."""


# the loop's steps by their earlier names (a subclass defining one would never be called): refused
_RENAMED_STEPS = {"before_pass": "prepare_pass", "stopped": "finish"}


async def serve(worker: AsyncWorker, stop_event: AEvent | None, *, drain: bool = False) -> int:
    """The loop every worker runs: connects the worker, then passes until ``stop_event`` is set (the pass in progress
    always finishes) or, in burst mode (``drain``), until a pass finds nothing left; returns the records processed
    in burst mode. It connects even if ``stop_event`` is already set.

    Whatever raised, ``connect``, a pass or the wait after it (a WAL-mode streamer reads its slot's connection while
    it waits: a connection lost then is reconnected, not fatal), is settled by
    :func:`~unilog.runtime.policy.decide` and this loop's one back-off: there is no other retry loop. The steps are
    the same in both modes: ``prepare_pass``, then ``run_once`` (``idle`` after it) or ``drain_pass``, and
    ``finish`` at the end; ``worker.hooks`` hear of the start, the connect, every pass, every failure and the stop.
    """
    stop_event = stop_event if stop_event is not None else AEvent()
    backoff, total, connected, first = Backoff(worker.max_backoff), 0, False, True
    for hook in worker.hooks:
        hook.on_start(worker)
    try:
        while first or not stop_event.is_set():
            first = False
            try:
                if not connected:
                    await worker.connect()
                    for hook in worker.hooks:
                        hook.on_connected(worker)
                    connected = True
                    backoff.reset()
                    continue
                for hook in worker.hooks:
                    hook.on_pass_start(worker)
                await worker.prepare_pass(drain)
                if drain:
                    handled, done = await worker.drain_pass()
                    total += handled
                    result: Any = handled
                else:
                    result = await worker.run_once()
                for hook in worker.hooks:
                    hook.on_pass_end(worker, result)
                backoff.reset()
                if drain and done:
                    return total
                if not drain:
                    await worker.idle(result, stop_event)
            except BaseException as exc:
                await _settle(worker, exc, backoff, stop_event, drain=drain, connecting=not connected)
    finally:
        try:
            await worker.finish()
        finally:
            for hook in worker.hooks:
                hook.on_stop(worker)
    return total


async def _settle(
    worker: AsyncWorker, exc: BaseException, backoff: Backoff, stop_event: AEvent, *, drain: bool, connecting: bool
) -> None:
    """Act on the failure policy's verdict for ``exc``: raise it, restart, or reconnect/retry after the back-off."""
    verdict = decide(worker, exc, drain=drain, connecting=connecting)
    if verdict.cause == "handler" and isinstance(exc, Exception):
        worker.after_handler_failure(exc)
    for hook in worker.hooks:
        hook.on_failure(worker, exc, verdict, backoff.delay)
    if verdict.action == "stop":
        error = verdict.error
        try:
            if error is exc:
                raise exc
            raise error from None  # a server's refusal, as its one line
        finally:
            # the error's traceback holds this frame: locals holding the error too would make a cycle, and a worker
            # whose drain failed (its sessions, its locks) would live on after its caller dropped it, until a full
            # garbage collection
            del exc, verdict, error
    if verdict.action == "restart":
        await worker.restart()
        return
    if verdict.action == "reconnect":
        await worker.recover()
    await asleep_until(stop_event, backoff.delay)
    backoff.grow()
