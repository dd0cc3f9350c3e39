"""One loop, two faces: ``run(stop_event)`` of every consumer kind, threaded and asyncio, through what a long-running
process meets: connections cut under it (the fault proxy), its schema gone, a stop that arrives mid-batch.

The worker loop, its links and the consumers are one asyncio source (``tools/faces.py`` generates the threaded face),
so these tests are parametrized over both faces and every kind; a difference between the faces fails here. The
differences found between the hand-written faces (issue 35) each have a test: ``AsyncLinks`` pinging Redis and
honouring ``pg_timeout``, one set of retryable failures, and ``run`` closing its connections when it returns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import inspect
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from handlers import APPLIED_INSERT

from unilog import (
    AsyncConsumer,
    AsyncGroupConsumer,
    AsyncMultiConsumer,
    AsyncPartitionedConsumer,
    Consumer,
    ConsumerConfig,
    GroupConfig,
    GroupConsumer,
    MultiConsumer,
    PartitionConfig,
    PartitionedConsumer,
    Record,
    Settings,
    Streamer,
    emit,
)
from unilog.engine import RedisStreams, connect
from unilog.errors import (
    CaptureRecreated,
    ConfigurationError,
    DataLoss,
    InjectedCrash,
    NotReplicated,
    PolicyStop,
    ReadOnlyServer,
    SchemaMissing,
    ServerUnreachable,
)
from unilog.faults import NO_FAULTS, Faults
from unilog.harness.proxy import FaultProxy
from unilog.health import HEALTH
from unilog.runtime import (
    DEFAULT_HOOKS,
    AsyncLinks,
    AsyncWorker,
    Hook,
    Hooks,
    Links,
    Verdict,
    Worker,
    decide,
    policy,
)
from unilog.runtime.hooks import HealthHook, LogHook

FACES = ["sync", "async"]
KINDS = ["checkpoint", "group", "partition", "multi"]  # multi: a MultiConsumer over the test's stream and another


def _name(kind: str) -> str:
    return {"checkpoint": "c", "group": "g", "partition": "p", "multi": "m"}[kind]


def build(
    face: str, kind: str, settings: Settings, gate: Gate | None = None, faults: Faults = NO_FAULTS, **config: Any
) -> Any:
    """A worker of ``kind`` and ``face`` whose handler writes ``applied`` rows (after ``gate`` lets it)."""
    name = _name(kind)
    config.setdefault("block_ms", 100)
    if kind == "checkpoint":
        made: Any = ConsumerConfig(name=name, **config)
    elif kind == "multi":
        made = ConsumerConfig(name=name, streams=(settings.stream, "other-stream"), **config)
    elif kind == "group":
        made = GroupConfig(group=name, worker="w1", claim_idle_ms=0, **config)
    else:
        made = PartitionConfig(name=name, worker="w1", rebalance_interval=0.2, **config)

    def rows(records: Sequence[Record]) -> list[tuple[Any, ...]]:
        return [(name, r.producer, r.seq, r.id, r.data["n"], r.raw_data.decode()) for r in records]

    if face == "sync":

        def handle(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
            if gate is not None:
                gate.pass_sync()
            with conn.cursor() as cur:
                cur.executemany(APPLIED_INSERT, rows(records))

        kinds: Any = {
            "checkpoint": Consumer,
            "group": GroupConsumer,
            "partition": PartitionedConsumer,
            "multi": MultiConsumer,
        }
        return kinds[kind](settings, made, handle, faults=faults)

    async def handle_async(conn: psycopg.AsyncConnection[Any], records: Sequence[Record]) -> None:
        if gate is not None:
            await gate.pass_async()
        async with conn.cursor() as cur:
            await cur.executemany(APPLIED_INSERT, rows(records))

    kinds = {
        "checkpoint": AsyncConsumer,
        "group": AsyncGroupConsumer,
        "partition": AsyncPartitionedConsumer,
        "multi": AsyncMultiConsumer,
    }
    return kinds[kind](settings, made, handle_async, faults=faults)


class Gate:
    """Holds the first batch inside the handler until :meth:`open`; :attr:`entered` is set once it is held."""

    def __init__(self) -> None:
        self.entered, self.opened = threading.Event(), threading.Event()

    def open(self) -> None:
        self.opened.set()

    def pass_sync(self) -> None:
        self.entered.set()
        assert self.opened.wait(20), "the test never opened the gate"

    async def pass_async(self) -> None:
        self.entered.set()
        for _ in range(2000):
            if self.opened.is_set():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the test never opened the gate")


class Running:
    """``worker.run(stop_event)`` in a thread (the asyncio face in its own event loop there)."""

    def __init__(self, worker: Any) -> None:
        self.worker, self.error, self.returned = worker, None, threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: Any = None
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()
        assert self._ready.wait(10)

    def _main(self) -> None:
        try:
            if isinstance(self.worker, AsyncWorker):
                asyncio.run(self._amain())
            else:
                self._stop = threading.Event()
                self._ready.set()
                self.worker.run(self._stop)
        except BaseException as exc:  # the test reads it
            self.error = exc
        finally:
            self._ready.set()
            self.returned.set()

    async def _amain(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._ready.set()
        await self.worker.run(self._stop)

    def stop(self, timeout: float = 30) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        else:
            self._stop.set()
        assert self.returned.wait(timeout), "run() did not return after its stop event was set"


@pytest.fixture
def running() -> Iterator[Callable[[Any], Running]]:
    started: list[Running] = []

    def start(worker: Any) -> Running:
        started.append(Running(worker))
        return started[-1]

    yield start
    for run in started:
        if not run.returned.is_set():
            run.stop()


def produce(settings: Settings, ns: Sequence[int]) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for n in ns:
            emit(conn, action="create", object="ride", data={"n": n}, key=f"ride-{n}")
    with Streamer(settings) as streamer:
        streamer.drain()


def applied(pg: Any, name: str) -> list[int]:
    return sorted(r[0] for r in pg.execute("SELECT n FROM applied WHERE consumer = %s", (name,)))


def wait_for(check: Callable[[], Any], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def sessions(pg: Any, app: str) -> list[int]:
    return [r[0] for r in pg.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,))]


@pytest.fixture
def partitioned(settings: Settings) -> Settings:
    api = RedisStreams(connect(settings.redis_url))
    api.set_partitions(settings.stream, 2)
    api.close()
    return settings


def prepare(kind: str, request: pytest.FixtureRequest) -> None:
    if kind == "partition":
        request.getfixturevalue("partitioned")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("face", FACES)
def test_run_applies_every_record_once_and_closes_its_connections_when_it_returns(
    face: str, kind: str, settings: Settings, pg: Any, running: Any, request: pytest.FixtureRequest
) -> None:
    """Difference: the threaded ``run`` left its connections open when it returned; the asyncio one closed them."""
    prepare(kind, request)
    produce(settings, range(8))
    worker = build(face, kind, settings, batch_size=3)
    run = running(worker)
    wait_for(lambda: applied(pg, _name(kind)) == list(range(8)), "every record")
    produce(settings, range(8, 12))
    wait_for(lambda: applied(pg, _name(kind)) == list(range(12)), "the records produced while it ran")
    run.stop()
    assert run.error is None
    assert worker.links.pg_open is None and worker.links.redis_open is None, "run() returned with connections open"
    assert applied(pg, _name(kind)) == list(range(12))


@pytest.mark.parametrize("kind", ["checkpoint", "group"])
@pytest.mark.parametrize("face", FACES)
def test_a_stop_mid_batch_finishes_and_commits_the_batch_first(
    face: str, kind: str, settings: Settings, pg: Any, running: Any
) -> None:
    produce(settings, range(5))
    gate = Gate()
    worker = build(face, kind, settings, gate=gate, batch_size=5)
    run = running(worker)
    assert gate.entered.wait(20), "the handler never ran"
    stopping = threading.Thread(target=run.stop)
    stopping.start()
    time.sleep(0.3)
    assert not run.returned.is_set(), "run() returned while its batch was still in the handler"
    gate.open()
    stopping.join(30)
    assert run.error is None and run.returned.is_set()
    assert applied(pg, _name(kind)) == [0, 1, 2, 3, 4], "the batch in progress was committed whole"


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("server", ["postgres", "redis"])
def test_run_reconnects_after_a_cut_connection_from_committed_state(
    face: str, server: str, settings: Settings, pg: Any, running: Any
) -> None:
    """A connection cut under a running worker (either server): it reconnects **both** (a reconnect starts over from
    committed state, so its Postgres session is a new one, and none is left behind) and applies every record once."""
    upstream = settings.conninfo if server == "postgres" else settings.redis_url
    host_port = psycopg.conninfo.conninfo_to_dict(settings.conninfo) if server == "postgres" else None
    if host_port is not None:
        proxy = FaultProxy(str(host_port.get("host", "127.0.0.1")), int(host_port.get("port", 5432)))
    else:
        from urllib.parse import urlsplit

        parts = urlsplit(upstream)
        proxy = FaultProxy(parts.hostname or "127.0.0.1", parts.port or 6379)
    with proxy:
        if server == "postgres":
            proxied = dataclasses.replace(settings, database_url=proxy.url_for(settings.database_url))
        else:
            proxied = dataclasses.replace(settings, redis_url=proxy.url_for(settings.redis_url))
        produce(settings, range(4))
        worker = build(face, "checkpoint", proxied, batch_size=2)
        run = running(worker)
        wait_for(lambda: applied(pg, "c") == list(range(4)), "the first records")
        (before,) = sessions(pg, "unilog-consumer-c")
        proxy.cut()
        produce(settings, range(4, 8))
        wait_for(lambda: applied(pg, "c") == list(range(8)), "the records after the cut")
        wait_for(lambda: sessions(pg, "unilog-consumer-c") not in ([], [before]), "a new session")
        (after,) = sessions(pg, "unilog-consumer-c")
        assert after != before, "the worker kept its Postgres session across a reconnect"
        run.stop()
        assert run.error is None
    assert applied(pg, "c") == list(range(8))


@pytest.mark.parametrize("face", FACES)
def test_a_schema_lost_under_a_running_worker_stops_it_at_its_next_session(
    face: str, settings: Settings, pg: Any, rds: Any, running: Any
) -> None:
    """The schema is checked on every new Postgres session, in both faces: a worker whose session was cut finds the
    schema gone when it reconnects and stops with the one-line error, instead of running on a database without it."""
    conninfo = psycopg.conninfo.conninfo_to_dict(settings.conninfo)
    with FaultProxy(str(conninfo.get("host", "127.0.0.1")), int(conninfo.get("port", 5432))) as proxy:
        proxied = dataclasses.replace(settings, database_url=proxy.url_for(settings.database_url))
        produce(settings, range(2))
        worker = build(face, "checkpoint", proxied)
        run = running(worker)
        wait_for(lambda: applied(pg, "c") == [0, 1], "the first records")
        versions = [r[0] for r in pg.execute("SELECT version_num FROM unilog_alembic_version")]
        pg.execute("DELETE FROM unilog_alembic_version")
        try:
            proxy.cut()
            # a copy of the last entry (a double send) makes the worker use its Postgres session again
            rds.xadd(settings.stream, rds.xrange(settings.stream)[-1][1])
            assert run.returned.wait(30), "the worker ran on without its schema"
        finally:
            for version in versions:
                pg.execute("INSERT INTO unilog_alembic_version (version_num) VALUES (%s)", (version,))
    assert isinstance(run.error, SchemaMissing), repr(run.error)


# -- the differences between the hand-written faces, decided ------------------------------------------------------------


@pytest.mark.parametrize("face", FACES)
def test_the_links_ping_redis_when_they_open_it(face: str, settings: Settings) -> None:
    """Difference: ``AsyncLinks.redis()`` handed out a client without asking the server anything, so a wrong URL
    surfaced at the first command, not as the one line naming the server."""
    with FaultProxy("127.0.0.1", 1) as proxy:  # nothing listens upstream: every connection is refused
        broken = dataclasses.replace(settings, redis_url=proxy.url_for(settings.redis_url))
        if face == "sync":
            with pytest.raises(ServerUnreachable, match="cannot connect to Redis"):
                Links(broken, app_name="t", pg_timeout=None, redis_timeout=2).redis()
        else:
            links = AsyncLinks(broken, app_name="t", pg_timeout=None, redis_timeout=2)
            with pytest.raises(ServerUnreachable, match="cannot connect to Redis"):
                asyncio.run(links.redis())


@pytest.mark.parametrize("face", FACES)
def test_the_links_honour_pg_timeout(face: str, settings: Settings) -> None:
    """Difference: ``AsyncLinks`` ignored ``pg_timeout`` (its connect timeout stayed 10 s)."""
    if face == "sync":
        links: Any = Links(settings, app_name="t", pg_timeout=3, redis_timeout=None)
        params = links.pg().info.get_parameters()
        links.close()
    else:

        async def parameters() -> dict[str, str]:
            links = AsyncLinks(settings, app_name="t", pg_timeout=3, redis_timeout=None)
            try:
                return (await links.pg()).info.get_parameters()
            finally:
                await links.close()

        params = asyncio.run(parameters())
    assert params["connect_timeout"] == "3"


def _redis_parsers() -> int:
    """How many of redis-py's response parsers are alive (one per connection; its encoders and policies live there
    too)."""
    kinds = (type(o) for o in gc.get_objects())
    return sum(
        1 for k in kinds if str(getattr(k, "__module__", "")).startswith("redis._parsers") and "Parser" in k.__name__
    )


@pytest.mark.parametrize("face", FACES)
def test_a_redis_client_the_links_dropped_is_freed_before_they_make_the_next(
    face: str, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py's parser sits in a reference cycle with a 64 kB buffer: a client dropped after each failure (a restart,
    a reconnect) was left to a full collection, and a process restarting thousands of times an hour piled them up
    (its RSS crept in the soak). With the cyclic collector off, every dropped client's parser would stay; the links
    collect them before they make the next client (the sweep's rate limit set aside: it is timed, not tested)."""
    gc.collect()
    before = _redis_parsers()
    gc.disable()
    try:
        if face == "sync":
            links: Any = Links(settings, app_name="t", pg_timeout=None, redis_timeout=2)
            for _ in range(3):
                links.redis()
                links.drop_redis()
                monkeypatch.setitem(policy._sweep, "next", 0.0)
            links.redis()
            alive = _redis_parsers() - before
            links.close()
        else:

            async def cycle() -> int:
                links = AsyncLinks(settings, app_name="t", pg_timeout=None, redis_timeout=2)
                for _ in range(3):
                    await links.redis()
                    await links.drop_redis()
                    monkeypatch.setitem(policy._sweep, "next", 0.0)
                await links.redis()
                alive = _redis_parsers() - before
                await links.close()
                return alive

            alive = asyncio.run(cycle())
    finally:
        gc.enable()
    assert alive == 1, f"{alive} redis-py parsers alive, one client open"


def test_redis_clients_that_failed_to_connect_are_freed_before_the_next_attempt(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker waiting for an unreachable Redis makes a client each attempt (redis-py makes the connection, and its
    parser, before the socket connects) and drops it: each left the same cycle behind (up to 360 an hour at the
    longest back-off), until the links noted those drops too. The threaded face: the asyncio one makes its parser
    once connected."""
    gc.collect()
    before = _redis_parsers()
    gc.disable()
    try:
        with FaultProxy("127.0.0.1", 1) as proxy:  # nothing listens upstream: every connection is refused
            broken = dataclasses.replace(settings, redis_url=proxy.url_for(settings.redis_url))
            links = Links(broken, app_name="t", pg_timeout=None, redis_timeout=2)
            for _ in range(4):
                monkeypatch.setitem(policy._sweep, "next", 0.0)
                with pytest.raises(ServerUnreachable):
                    links.redis()
            alive = _redis_parsers() - before
    finally:
        gc.enable()
    assert alive <= 1, f"{alive} redis-py parsers alive after four failed attempts (the last one's may stay)"


def test_both_faces_retry_the_same_failures() -> None:
    """Difference: ``AsyncWorker`` listed ``TimeoutError`` as retryable and ``Worker`` did not (a ``TimeoutError`` is
    an ``OSError``, so both retried it; now one list says so)."""
    assert Worker.retryable == AsyncWorker.retryable

    class Probe:
        kind, label, restart_after_crash, retryable = "probe", {}, True, Worker.retryable

        def is_handler_failure(self, exc: Exception) -> bool:
            return False

    assert decide(Probe(), TimeoutError("deadline")).action == "reconnect"
    assert decide(Probe(), TimeoutError("deadline"), drain=True).action == "stop"


def test_decide_is_pure_it_changes_nothing_on_a_frozen_worker(settings: Settings) -> None:
    """Issue 45: the failure policy only asks; what a worker does about a handler failure happens when the loop
    carries out the verdict (``after_handler_failure``). A worker that refuses every attribute write gets every
    verdict; a real consumer's state is the same before and after ``decide``."""

    @dataclasses.dataclass(frozen=True)
    class Frozen:
        kind: str = "frozen"
        restart_after_crash: bool = True
        retryable: tuple[type[BaseException], ...] = Worker.retryable

        def is_handler_failure(self, exc: Exception) -> bool:
            return isinstance(exc, ValueError)

    frozen = Frozen()
    assert decide(frozen, ValueError("handler")).action == "retry"
    assert decide(frozen, ConnectionError("gone")).action == "reconnect"
    assert decide(frozen, KeyError("bug")).action == "stop"
    assert decide(frozen, InjectedCrash("x")).action == "restart"
    assert decide(frozen, ReadOnlyServer("standby"), connecting=True) == Verdict("reconnect", "standby", ANY)
    assert decide(frozen, ReadOnlyServer("standby"), connecting=True, drain=True).action == "stop"
    assert decide(frozen, ServerUnreachable("gone"), connecting=True) == Verdict("reconnect", "connection", ANY)
    assert decide(frozen, ServerUnreachable("gone"), connecting=True, drain=True).action == "stop"
    assert decide(frozen, InjectedCrash("x"), connecting=True).action == "restart"
    consumer = Consumer(settings, ConsumerConfig(name="pure"), lambda conn, records: None)
    before = dict(vars(consumer))
    consumer._checkpoint = checkpoint = object()  # type: ignore[assignment]
    assert decide(consumer, ValueError("handler")).cause == "handler"
    assert consumer._checkpoint is checkpoint, "decide dropped the consumer's checkpoint"
    consumer.after_handler_failure(ValueError("handler"))
    assert consumer._checkpoint is None, "the loop's action does"
    assert set(vars(consumer)) == set(before)


class _Any:
    def __eq__(self, other: object) -> bool:
        return True


ANY: Any = _Any()
FAILURES = [
    KeyboardInterrupt(),
    InjectedCrash("x"),
    DataLoss("gone"),
    ConfigurationError("bad"),
    PolicyStop("stop"),
    psycopg.errors.InsufficientPrivilege("denied"),
    CaptureRecreated("slot"),
    NotReplicated("replicas"),
    ConnectionError("cut"),
    ReadOnlyServer("standby"),
    ValueError("handler"),
    KeyError("bug"),
]


def _state(worker: Any) -> dict[str, Any]:
    """Each attribute's identity and, for a container, its contents: what a write by ``decide`` would change."""
    return {
        name: (id(value), list(value.items()) if isinstance(value, dict) else list(value))
        if isinstance(value, dict | list | set)
        else (id(value), None)
        for name, value in vars(worker).items()
    }


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("kind", [*KINDS, "streamer"])
def test_decide_changes_no_worker_of_any_kind_for_any_failure(face: str, kind: str, settings: Settings) -> None:
    """Issue 45, done when ``decide`` has no side effects: every kind of worker, both faces, every path of the
    policy (a pass, burst mode, connecting at the start): the worker's state is the same afterwards."""
    if kind == "streamer":
        if face == "async":
            pytest.skip("the streamer has one face")
        worker: Any = Streamer(settings)
    else:
        worker = build(face, kind, settings)
    if hasattr(worker, "_checkpoint"):
        worker._checkpoint = object()  # what a handler failure's action drops
    try:
        before = _state(worker)
        verdicts = set()
        for exc in FAILURES:
            for drain_mode in (False, True):
                for connecting in (False, True):
                    verdicts.add(decide(worker, exc, drain=drain_mode, connecting=connecting).action)
                    assert _state(worker) == before, f"decide changed the {kind} worker for {exc!r}"
        assert verdicts == {"stop", "restart", "reconnect", "retry"}
    finally:
        close = worker.close()
        if inspect.isawaitable(close):
            asyncio.run(close)


# -- issue 45: the policy as documented: one retry loop, one hook system, hooks per worker -------------------------------


class Heard(Hook):
    """A hook that writes down what the loop tells it: ``(name, event)`` in ``events``, and each failure's verdict
    as ``(action, cause, delay)`` in :attr:`verdicts`."""

    def __init__(self, name: str = "heard", events: list[tuple[str, str]] | None = None) -> None:
        self.name, self.verdicts = name, []
        self.events: list[tuple[str, str]] = events if events is not None else []

    def on_start(self, worker: Any) -> None:
        self.events.append((self.name, "start"))

    def on_connected(self, worker: Any) -> None:
        self.events.append((self.name, "connected"))

    def on_pass_start(self, worker: Any) -> None:
        self.events.append((self.name, "pass"))

    def on_pass_end(self, worker: Any, result: Any) -> None:
        self.events.append((self.name, "passed"))

    def on_failure(self, worker: Any, exc: BaseException, verdict: Verdict, delay: float) -> None:
        self.events.append((self.name, "failure"))
        self.verdicts.append((verdict.action, verdict.cause, delay))

    def on_stop(self, worker: Any) -> None:
        self.events.append((self.name, "stop"))


def drain(worker: Any) -> int:
    return asyncio.run(worker.drain()) if isinstance(worker, AsyncWorker) else worker.drain()


def record_steps(worker: Any, events: list[tuple[str, str]]) -> None:
    """Write the worker's own steps ``prepare_pass`` and ``finish`` into ``events`` as the loop takes them."""
    prepare, finish = worker.prepare_pass, worker.finish
    if isinstance(worker, AsyncWorker):

        async def prepare_async(drain: bool) -> None:
            events.append(("worker", f"prepare drain={drain}"))
            await prepare(drain)

        async def finish_async() -> None:
            events.append(("worker", "finish"))
            await finish()

        worker.prepare_pass, worker.finish = prepare_async, finish_async
        return

    def prepare_sync(drain: bool) -> None:
        events.append(("worker", f"prepare drain={drain}"))
        prepare(drain)

    def finish_sync() -> None:
        events.append(("worker", "finish"))
        finish()

    worker.prepare_pass, worker.finish = prepare_sync, finish_sync


@pytest.mark.parametrize("face", FACES)
def test_hooks_added_to_one_worker_are_called_in_the_order_given_and_on_it_alone(
    face: str, settings: Settings, pg: Any
) -> None:
    """Hooks are the worker's own: added with ``before=``/``after=`` (a hook, or the first hook of a class) they are
    called in that order, for every event; another worker of the same class keeps its class's default hooks."""
    produce(settings, range(3))
    worker, other = build(face, "checkpoint", settings), build(face, "checkpoint", settings)
    events: list[tuple[str, str]] = []
    a = worker.hooks.add(Heard("a", events))
    b = worker.hooks.add(Heard("b", events), before=a)
    c = worker.hooks.add(Heard("c", events), after=LogHook)
    assert [type(h) for h in worker.hooks][:3] == [type(DEFAULT_HOOKS[0]), LogHook, Heard]
    assert [h for h in worker.hooks if isinstance(h, Heard)] == [c, b, a]
    assert worker.hooks.remove(HealthHook) is DEFAULT_HOOKS[-1] and HealthHook not in map(type, worker.hooks)
    assert drain(worker) == 3 and applied(pg, "c") == [0, 1, 2]
    assert events, "the added hooks were never called"
    for at in range(0, len(events), 3):
        assert [name for name, _ in events[at : at + 3]] == ["c", "b", "a"], events
        assert len({event for _, event in events[at : at + 3]}) == 1, events
    assert [event for name, event in events if name == "a"][:2] == ["start", "connected"]
    assert list(other.hooks) == list(DEFAULT_HOOKS) and list(type(worker).default_hooks) == list(DEFAULT_HOOKS)
    events.clear()
    drain(other)
    assert events == [], "a hook added to one worker was called for another"
    with pytest.raises(ValueError, match="before or after"):
        worker.hooks.add(Heard(), before=a, after=b)
    with pytest.raises(ValueError, match="already"):
        worker.hooks.add(a)
    with pytest.raises(ValueError, match="not one of"):
        worker.hooks.add(Heard(), before=HealthHook)


def test_hook_methods_and_the_workers_steps_never_share_a_name() -> None:
    """Issue 45: the worker's ``before_pass``/``stopped`` and the hooks' were two systems under one name. Every hook
    method starts with ``on_`` and no worker has one; a hook or a worker still using an earlier name is refused (the
    loop would never call it)."""
    from unilog import (
        AsyncConsumer,
        AsyncGroupConsumer,
        AsyncPartitionedConsumer,
        Consumer,
        GroupConsumer,
        PartitionedConsumer,
    )
    from unilog.produce.backfill import Backfill

    events = {name for name in vars(Hook) if not name.startswith("_")}
    assert events and all(name.startswith("on_") for name in events), events
    workers = [Worker, AsyncWorker, Streamer, Backfill, Consumer, GroupConsumer, PartitionedConsumer]
    workers += [AsyncConsumer, AsyncGroupConsumer, AsyncPartitionedConsumer]
    for worker in workers:
        assert not events & set(dir(worker)), f"{worker.__name__} has a hook's name: {events & set(dir(worker))}"
        assert not {"before_pass", "stopped"} & set(dir(worker)), worker.__name__

    class Old(Hook):
        def failed(self, worker: Any, exc: BaseException, verdict: Verdict, delay: float) -> None: ...

    with pytest.raises(TypeError, match="failed is now on_failure"):
        Hooks().add(Old())
    with pytest.raises(TypeError, match=r"before_pass .*prepare_pass"):

        class OldWorker(Consumer):
            def before_pass(self) -> None: ...


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("face", FACES)
def test_burst_mode_and_run_take_the_same_steps_and_tell_the_hooks_alike(
    face: str, kind: str, settings: Settings, pg: Any, running: Any, request: pytest.FixtureRequest
) -> None:
    """Issue 45: the worker's step before a pass was skipped in burst mode and the hooks' was not, and the worker's
    end step ran only in ``run``. Now both modes take the same steps: the hooks hear the start and the connect, each
    pass is the hooks' ``on_pass_start``, the worker's ``prepare_pass`` (told the mode), the hooks' ``on_pass_end``;
    the worker's ``finish`` and the hooks' ``on_stop`` end it."""
    prepare(kind, request)
    produce(settings, range(3))
    for mode in ("drain", "run"):
        events: list[tuple[str, str]] = []
        worker = build(face, kind, settings)
        worker.hooks.add(Heard("hook", events))
        record_steps(worker, events)
        if mode == "drain":
            drain(worker)
        else:
            run = running(worker)
            wait_for(lambda: events.count(("hook", "passed")) >= 2, "two passes")  # noqa: B023 (waited for here)
            run.stop()
            assert run.error is None
        assert applied(pg, _name(kind)) == [0, 1, 2]
        assert events[:2] == [("hook", "start"), ("hook", "connected")], (mode, events)
        assert events[-2:] == [("worker", "finish"), ("hook", "stop")], (mode, events)
        one_pass = [("hook", "pass"), ("worker", f"prepare drain={mode == 'drain'}"), ("hook", "passed")]
        passes = events[2:-2]
        assert passes and passes == one_pass * (len(passes) // 3), (mode, events)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("face", FACES)
def test_a_crash_right_after_connecting_is_settled_by_the_policy_like_a_pass(
    face: str, kind: str, settings: Settings, pg: Any, running: Any, request: pytest.FixtureRequest
) -> None:
    """Issue 45: connecting had a retry loop of its own beside the policy. Now ``connect`` is the loop's first step,
    settled by ``decide`` and the loop's one back-off: a crash injected right after it (``loop.crash_after_connect``)
    restarts the worker in-process (``run``), twice here, and every record is then applied once; the hooks heard
    each verdict. Burst mode raises it."""
    prepare(kind, request)
    produce(settings, range(4))
    faults = Faults.scripted(loop__crash_after_connect=[True, True])
    worker = build(face, kind, settings, faults=faults)
    heard = worker.hooks.add(Heard())
    run = running(worker)
    wait_for(lambda: applied(pg, _name(kind)) == list(range(4)), "every record after two crashes at the start")
    run.stop()
    assert run.error is None, repr(run.error)
    assert faults.counts["loop.crash_after_connect"] == 2
    assert [(action, cause) for action, cause, _ in heard.verdicts] == [("restart", "crash")] * 2
    assert heard.events.count(("heard", "connected")) == 1  # the fault hook comes first: it raised before this one
    burst = build(face, kind, settings, faults=Faults.scripted(loop__crash_after_connect=[True]))
    with pytest.raises(InjectedCrash, match="crash_after_connect"):
        drain(burst)
    assert applied(pg, _name(kind)) == list(range(4))


@pytest.mark.parametrize("face", FACES)
def test_a_server_unreachable_at_start_is_waited_for_by_run_and_stops_a_drain_at_once(
    face: str, settings: Settings, pg: Any, running: Any
) -> None:
    """Pinned the other way round until issue 47 (item 3): ``run`` stopped at once when a server could not be reached
    at its start, so a process started during a server's restart (or a cluster's failover) died. Now ``run`` waits
    for it as for a server lost while running (the policy's reconnect, cause ``connection``; ``/readyz`` unready),
    and starts once it answers; burst mode still stops at once, raised as it is (the command's exit code 4)."""
    produce(settings, range(2))
    parts = urlsplit(settings.redis_url)
    with FaultProxy(parts.hostname or "127.0.0.1", parts.port or 6379) as proxy:
        proxy.reset()  # every connection refused (reset) until the mode changes
        broken = dataclasses.replace(settings, redis_url=proxy.url_for(settings.redis_url))
        with pytest.raises(ServerUnreachable, match="cannot connect to Redis"):
            drain(build(face, "checkpoint", broken))
        worker = build(face, "checkpoint", broken)
        heard = worker.hooks.add(Heard())
        run = running(worker)
        wait_for(lambda: len(heard.verdicts) >= 2, "two retries of connecting")
        assert not run.returned.is_set(), repr(run.error)
        assert {(action, cause) for action, cause, _ in heard.verdicts} == {("reconnect", "connection")}
        assert not HEALTH.ready()[0], "/readyz while the server cannot be reached"
        proxy.pass_through()
        wait_for(lambda: applied(pg, "c") == [0, 1], "the records once the server answers")
        run.stop()
    assert run.error is None, repr(run.error)
    assert heard.events.count(("heard", "connected")) == 1


# -- issue 45: waiting for the servers outside a worker's loop is the loop itself ---------------------------------------


@pytest.mark.parametrize("exc", FAILURES, ids=lambda exc: type(exc).__name__)
def test_waiting_for_the_servers_retries_what_a_loop_reconnects_after_and_raises_the_rest(
    exc: BaseException, settings: Settings
) -> None:
    """``wait_for_servers`` (a consumer placing its group, a backfill's cursor, the Spark source and sink) was a
    second retry loop with its own classification. It now runs the step as a worker of the one loop: a step that
    fails once with ``exc`` is retried (``/readyz`` unready meanwhile) exactly when ``decide`` has the loop of a
    worker with no handler (the streamer's) retry after ``exc`` (``transient``: when it reconnects first); any other failure is raised at once, the step
    called once."""
    from unilog.runtime.policy import transient
    from unilog.runtime.waiting import wait_for_servers

    worker = Streamer(settings)
    try:
        action = decide(worker, exc).action
    finally:
        worker.close()
    assert transient(exc) == (action == "reconnect")
    calls: list[bool] = []

    def step() -> str:
        calls.append(HEALTH.ready()[0])
        if len(calls) == 1:
            raise exc
        return "answered"

    if action in ("reconnect", "retry"):
        assert wait_for_servers(step, name="conformance wait", max_backoff=0.1) == "answered"
        assert calls == [True, False], "/readyz is held back while the wait retries"
        assert HEALTH.ready()[0]
    else:
        with pytest.raises(type(exc)) as raised:
            wait_for_servers(step, name="conformance wait", max_backoff=0.1)
        assert raised.value is exc, "raised as the step raised it (a driver's refusal keeps its type)"
        assert len(calls) == 1


@pytest.mark.parametrize("kind", [ConnectionError, NotReplicated, CaptureRecreated])
def test_waiting_for_the_servers_gives_up_after_its_time_with_the_last_failure(kind: type[Exception]) -> None:
    """Whatever the policy retries (a reconnect, or a retry on the same connections): past ``give_up_after`` the
    next failure is raised, the step's own."""
    from unilog.runtime.waiting import wait_for_servers

    calls: list[float] = []

    def step() -> None:
        calls.append(time.monotonic())
        raise kind(f"refused, try {len(calls)}")

    with pytest.raises(kind, match="refused, try") as raised:
        wait_for_servers(step, name="conformance give-up", max_backoff=0.1, give_up_after=0.35)
    assert 3 <= len(calls) <= 6, calls
    assert str(raised.value) == f"refused, try {len(calls)}"
    assert HEALTH.ready()[0], "a wait that gave up holds /readyz back no longer"
