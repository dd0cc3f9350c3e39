"""End to end on real servers: producer -> streamer -> Redis -> consumer, with faults injected at exact steps."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
import redis
from handlers import record_applied

from unilog import Consumer, ConsumerConfig, Faults, InjectedCrash, Record, Settings, Streamer, StreamerConfig, emit
from unilog.harness.pytest_plugin import running


def produce(settings: Settings, n: int, start: int = 0, **kw: Any) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(start, start + n):
            emit(conn, action="create", object="ride", data={"n": i}, **kw)
        conn.commit()


def consumer(settings: Settings, name: str = "c0", faults: Faults | None = None, **kw: Any) -> Consumer:
    def handler(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
        record_applied(name, conn, records)

    return Consumer(settings, ConsumerConfig(name=name, **kw), handler, faults=faults or Faults())


def applied(pg: psycopg.Connection[Any], name: str = "c0") -> list[int]:
    return [r[0] for r in pg.execute("SELECT n FROM applied WHERE consumer = %s ORDER BY seq", (name,))]


def test_commit_streams_to_consumer_and_rollback_streams_nothing(settings: Settings, pg: Any, rds: Any) -> None:
    produce(settings, 3)
    with psycopg.connect(settings.conninfo) as conn:
        emit(conn, action="create", object="ride", data={"n": 99})
        conn.rollback()
    with Streamer(settings) as streamer:
        assert streamer.drain() == 3
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone() == (0,)
    assert rds.xlen("test-stream") == 3
    with consumer(settings) as c:
        assert c.drain() == 3
    assert applied(pg) == [0, 1, 2]
    row = pg.execute("SELECT last_id, positions FROM unilog_checkpoints WHERE name = 'c0'").fetchone()
    assert row[0] == rds.xrevrange("test-stream", count=1)[0][0]
    assert list(row[1].values()) == [[1, 3]]


def test_entry_carries_reference_data_field_and_metadata(settings: Settings, pg: Any, rds: redis.Redis) -> None:
    # the reference design's producer: a raw INSERT without unilog columns
    pg.execute(
        "INSERT INTO staged_log_records (action, object, data) VALUES ('create', 'ride', %s::jsonb)",
        (json.dumps({"id": 123, "distance": 456.7}),),
    )
    produce(settings, 1, key="ride-1")
    Streamer(settings).drain()
    # the reference design's reader: XRANGE, then JSON.parse(fields["data"])
    entries = rds.xrange("test-stream", "-", "+", count=10)
    assert json.loads(entries[0][1]["data"]) == {"id": 123, "distance": 456.7}
    first, second = entries[0][1], entries[1][1]
    producer_id = pg.execute("SELECT producer_id FROM unilog_producer").fetchone()[0]
    assert first["action"] == "create" and first["object"] == "ride"
    assert (first["producer"], first["epoch"], first["seq"]) == (producer_id, "1", "1")
    assert second["seq"] == "2" and second["key"] == "ride-1"
    assert abs(int(first["created"]) / 1000 - time.time()) < 60


def test_double_sent_batch_is_handled_once(settings: Settings, pg: Any, rds: Any) -> None:
    produce(settings, 5)
    with Streamer(settings, faults=Faults.scripted(streamer__double_send=[True])) as streamer:
        assert streamer.drain() == 5
    assert rds.xlen("test-stream") == 10, "the fault must really send the batch twice"
    with consumer(settings) as c:
        assert c.drain() == 5
        assert c.skipped_total == 5
    assert applied(pg) == [0, 1, 2, 3, 4]


def test_streamer_crash_after_publish_resends_same_positions(settings: Settings, pg: Any, rds: Any) -> None:
    produce(settings, 4)
    streamer = Streamer(
        settings, StreamerConfig(batch_size=3), faults=Faults.scripted(streamer__crash_after_publish=[True])
    )
    with pytest.raises(InjectedCrash):
        streamer.drain()
    streamer.close()
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone() == (4,), "nothing deleted before commit"
    assert rds.xlen("test-stream") == 3
    produce(settings, 2, start=4)  # new records become visible before the retry
    with Streamer(settings, StreamerConfig(batch_size=3)) as s2:
        assert s2.drain() == 6
    seqs = [int(f["seq"]) for _, f in rds.xrange("test-stream")]
    assert seqs == [1, 2, 3, 4, 5, 6], "the re-sent positions 1-3 were skipped by the broker"
    with consumer(settings) as c:
        c.drain()
    assert applied(pg) == [0, 1, 2, 3, 4, 5]


def test_crash_in_a_pipelined_pass_deletes_only_what_redis_confirmed(settings: Settings, pg: Any, rds: Any) -> None:
    """A pass publishes batch 3 while it deletes batch 2: a crash after batch 3's XADD leaves batches 1-2 deleted,
    batch 3 in Redis and still staged, and the retry re-sends it with the same positions."""
    produce(settings, 10)
    faults = Faults.scripted(streamer__crash_after_publish=[False, False, True])
    streamer = Streamer(settings, StreamerConfig(batch_size=3), faults=faults)
    with pytest.raises(InjectedCrash):
        streamer.run_once()  # one pass: batches 1, 2, 3 back to back
    streamer.close()
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone() == (4,), "batches 1 and 2 deleted"
    assert rds.xlen("test-stream") == 9
    with Streamer(settings, StreamerConfig(batch_size=3)) as s2:
        assert s2.drain() == 4
    seqs = [int(f["seq"]) for _, f in rds.xrange("test-stream")]
    assert seqs == list(range(1, 11)), "batch 3's re-sent positions were skipped by the broker"
    with consumer(settings) as c:
        c.drain()
    assert applied(pg) == list(range(10))


def test_consumer_crash_before_commit_replays_batch_without_double_effect(settings: Settings, pg: Any) -> None:
    produce(settings, 6)
    Streamer(settings).drain()
    faults = Faults.scripted(consumer__crash_before_commit=[True])
    with consumer(settings, faults=faults, batch_size=4) as c:
        with pytest.raises(InjectedCrash):
            c.run_once()
        assert applied(pg) == [], "the crashed batch's effects were rolled back"
        c.close()
        c.drain()
    assert applied(pg) == [0, 1, 2, 3, 4, 5]
    assert faults.counts["consumer.crash_before_commit"] == 1


def test_consumer_crash_mid_batch_rolls_back_partial_effects(settings: Settings, pg: Any) -> None:
    produce(settings, 5)
    Streamer(settings).drain()

    def handler(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
        for record in records:  # the injected crash fires while iterating
            record_applied("c0", conn, [record])

    faults = Faults.scripted(consumer__crash_mid_batch=[True])
    c = Consumer(settings, ConsumerConfig(name="c0"), handler, faults=faults)
    with pytest.raises(InjectedCrash, match="crash_mid_batch"):
        c.run_once()
    assert applied(pg) == []
    c.close()
    c.drain()
    c.close()
    assert applied(pg) == [0, 1, 2, 3, 4]


def test_crash_after_commit_replays_nothing(settings: Settings, pg: Any) -> None:
    """A process that dies right after a batch's commit restarts from the committed checkpoint. The crash is
    injected at the first step after the committed pass (``loop.crash_before_pass``, before the next pass), and the
    crashed consumer is not closed (a dead process closes nothing) before a new one takes over."""
    produce(settings, 3)
    Streamer(settings).drain()
    faults = Faults.scripted(loop__crash_before_pass=[False, True])
    crashed = consumer(settings, faults=faults, restart_after_crash=False)
    try:
        with pytest.raises(InjectedCrash, match="crash_before_pass"):
            crashed.drain()  # pass 1 applies the batch and commits; the crash lands before pass 2
        assert faults.counts["loop.crash_before_pass"] == 1
        assert applied(pg) == [0, 1, 2], "the batch was committed before the crash"
        produce(settings, 2, start=3)
        Streamer(settings).drain()
        with consumer(settings) as c:  # a new process: nothing but the committed checkpoint carries over
            assert c.drain() == 2, "only the records after the crash are handled"
    finally:
        crashed.close()
    assert applied(pg) == [0, 1, 2, 3, 4]


def test_handler_error_rolls_back_and_is_retried(settings: Settings, pg: Any) -> None:
    produce(settings, 3)
    Streamer(settings).drain()
    calls = []

    def flaky(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
        record_applied("c0", conn, records)
        calls.append(len(records))
        if len(calls) == 1:
            raise RuntimeError("transient")

    c = Consumer(settings, ConsumerConfig(name="c0", block_ms=50), flaky)
    with running(c.run):
        deadline = time.monotonic() + 10
        while len(calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    c.close()
    assert applied(pg) == [0, 1, 2]


def test_late_commit_is_not_skipped(settings: Settings, pg: Any, rds: Any) -> None:
    """The reference design's bug: a lower id committing after a higher one was streamed got dropped."""
    early = psycopg.connect(settings.conninfo)
    emit(early, action="create", object="ride", data={"n": 0})  # lower id, transaction left open
    produce(settings, 1, start=1)  # higher id, committed first
    with Streamer(settings) as streamer:
        streamer.run_once()
        assert rds.xlen("test-stream") == 1, "the committed record does not wait for the open transaction"
        early.commit()
        early.close()
        assert streamer.drain() == 1, "the late commit, below the published id, is found and published"
    with consumer(settings) as c:
        c.drain()
    assert sorted(applied(pg)) == [0, 1]
    assert pg.execute("SELECT count(DISTINCT seq) FROM applied").fetchone() == (2,)


def burn_xids_to_just_below_a_power_of_ten(pg: Any) -> int:
    """Advance the cluster's transaction ids (subtransactions that write, in one transaction) to 3 below the next
    power of ten; return that power."""
    current = int(pg.execute("SELECT pg_current_xact_id()::text").fetchone()[0])
    pg.commit()
    boundary = 10 ** len(str(current + 10))
    if boundary - current > 2_000_000:
        pytest.skip(f"transaction id {current} is too far from {boundary} to burn the difference")
    pg.execute("CREATE TEMP TABLE burn (x int)")
    pg.execute(
        "DO $$ BEGIN FOR i IN 1..%s LOOP BEGIN INSERT INTO burn VALUES (i); "
        "EXCEPTION WHEN division_by_zero THEN NULL; END; END LOOP; END $$" % (boundary - current - 4)
    )
    pg.commit()
    return boundary


def test_transaction_ids_crossing_a_power_of_ten_keep_numeric_order(settings: Settings, pg: Any, rds: Any) -> None:
    """(xid, id) order is numeric: sorted as text, xid 10000 comes before 9999, and a cursor past it skips 9999."""
    boundary = burn_xids_to_just_below_a_power_of_ten(pg)
    produce(settings, 1, start=0)
    for i in range(1, 6):  # one transaction each: xids on both sides of the boundary
        produce(settings, 1, start=i)
    xids = [int(r[0]) for r in pg.execute("SELECT xid::text FROM staged_log_records ORDER BY id")]
    pg.commit()
    assert min(xids) < boundary <= max(xids), xids
    with Streamer(settings, StreamerConfig(batch_size=2)) as streamer:
        assert streamer.drain(timeout=10) == 6
    entries = rds.xrange("test-stream")
    assert [json.loads(f["data"])["n"] for _, f in entries] == list(range(6))
    assert [int(f["seq"]) for _, f in entries] == list(range(1, 7))


@pytest.mark.slow(light=True)  # over 8 s: the default run stays near 12 minutes; .ci/run runs it
def test_backlog_larger_than_a_batch_arrives_complete_and_in_order(settings: Settings, pg: Any, rds: Any) -> None:
    n = 100_000
    pg.execute(
        "INSERT INTO staged_log_records (action, object, data) "
        "SELECT 'create', 'ride', jsonb_build_object('n', g, 'distance', g * 1.5) FROM generate_series(0, %s) g",
        (n - 1,),
    )
    with Streamer(settings, StreamerConfig(batch_size=1000)) as streamer:
        started = time.perf_counter()
        assert streamer.drain() == n
        elapsed = time.perf_counter() - started
    print(f"drained {n} records in {elapsed:.2f}s ({n / elapsed:,.0f}/s)")
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone() == (0,)
    entries = rds.xrange("test-stream")
    assert [json.loads(f["data"])["n"] for _, f in entries] == list(range(n))
    assert [int(f["seq"]) for _, f in entries] == list(range(1, n + 1))


def test_idle_consumer_and_streamer_react_within_milliseconds(settings: Settings, pg: Any) -> None:
    seen: list[float] = []
    done = threading.Event()

    def handler(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
        seen.extend(time.perf_counter() for _ in records)
        if len(seen) >= 20:
            done.set()

    latencies = []
    streamer = Streamer(settings, StreamerConfig(poll_interval=5.0))
    c = Consumer(settings, ConsumerConfig(name="lat", block_ms=5000), handler)
    with running(streamer.run), running(c.run):
        time.sleep(0.5)  # both idle: LISTEN and blocking XREAD
        with psycopg.connect(settings.conninfo) as conn:
            for i in range(20):
                emit(conn, action="create", object="ride", data={"n": i})
                t0 = time.perf_counter()
                conn.commit()
                deadline = time.monotonic() + 10
                while len(seen) <= i:
                    assert time.monotonic() < deadline, f"record {i} never reached the handler"
                    time.sleep(0.0005)
                latencies.append(seen[i] - t0)
        assert done.wait(5)
    streamer.close()
    c.close()
    latencies.sort()
    print(f"commit-to-handler latency ms: p50={latencies[10] * 1000:.1f} max={latencies[-1] * 1000:.1f}")
    # with 5-second poll intervals and blocks, only LISTEN/NOTIFY and a blocking XREAD can make this sub-second
    assert latencies[10] < 1.0
