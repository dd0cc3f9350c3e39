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
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
import pytest
from handlers import APPLIED_INSERT

from unilog import (
    AsyncConsumer,
    AsyncGroupConsumer,
    AsyncPartitionedConsumer,
    Consumer,
    ConsumerConfig,
    GroupConfig,
    GroupConsumer,
    PartitionConfig,
    PartitionedConsumer,
    Record,
    Settings,
    Streamer,
    emit,
)
from unilog.engine import RedisStreams, connect
from unilog.errors import InjectedCrash, SchemaMissing, ServerUnreachable
from unilog.harness.proxy import FaultProxy
from unilog.runtime import AsyncLinks, AsyncWorker, Links, Worker, decide

FACES = ["sync", "async"]
KINDS = ["checkpoint", "group", "partition"]


def _name(kind: str) -> str:
    return {"checkpoint": "c", "group": "g", "partition": "p"}[kind]


def build(face: str, kind: str, settings: Settings, gate: Gate | None = None, **config: Any) -> Any:
    """A worker of ``kind`` and ``face`` whose handler writes ``applied`` rows (after ``gate`` lets it)."""
    name = _name(kind)
    config.setdefault("block_ms", 100)
    if kind == "checkpoint":
        made: Any = ConsumerConfig(name=name, **config)
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

        kinds: Any = {"checkpoint": Consumer, "group": GroupConsumer, "partition": PartitionedConsumer}
        return kinds[kind](settings, made, handle)

    async def handle_async(conn: psycopg.AsyncConnection[Any], records: Sequence[Record]) -> None:
        if gate is not None:
            await gate.pass_async()
        async with conn.cursor() as cur:
            await cur.executemany(APPLIED_INSERT, rows(records))

    kinds = {"checkpoint": AsyncConsumer, "group": AsyncGroupConsumer, "partition": AsyncPartitionedConsumer}
    return kinds[kind](settings, made, handle_async)


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
    consumer = Consumer(settings, ConsumerConfig(name="pure"), lambda conn, records: None)
    before = dict(vars(consumer))
    consumer._checkpoint = checkpoint = object()  # type: ignore[assignment]
    assert decide(consumer, ValueError("handler")).cause == "handler"
    assert consumer._checkpoint is checkpoint, "decide dropped the consumer's checkpoint"
    consumer.after_handler_failure(ValueError("handler"))
    assert consumer._checkpoint is None, "the loop's action does"
    assert set(vars(consumer)) == set(before)
