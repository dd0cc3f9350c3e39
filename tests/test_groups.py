"""Consumer groups on real servers: exactly-once effects under redelivery, SIGKILLed workers, dead letters, retention."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from dropped import assert_sessions_end, dropped, refcounting_only
from handlers import record_applied

from unilog import Faults, InjectedCrash, Record, Settings, Streamer, StreamerConfig, emit, store
from unilog.consume.group import GroupConfig, GroupConsumer
from unilog.wire import dlq_key

TESTS = Path(__file__).parent


def stage(settings: Settings, n: int, start: int = 0, poison: set[int] | None = None) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(start, start + n):
            emit(conn, action="create", object="ride", data={"n": i, "poison": i in (poison or set())})
        conn.commit()
    Streamer(settings).drain()


def counts(pg: psycopg.Connection[Any], consumer: str = "g") -> dict[int, int]:
    rows = pg.execute("SELECT n, count(*) FROM applied WHERE consumer = %s GROUP BY n", (consumer,)).fetchall()
    return {r[0]: r[1] for r in rows}


def worker(settings: Settings, name: str, faults: Faults | None = None, **kw: Any) -> GroupConsumer:
    def handler(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
        for record in records:
            if record.data.get("poison") and not os.environ.get("POISON_FIXED"):
                raise ValueError(f"cannot handle record {record.data['n']}")
        record_applied("g", conn, records)

    config = GroupConfig(group="g", worker=name, block_ms=50, claim_idle_ms=200, claim_interval=0, **kw)
    return GroupConsumer(settings, config, handler, faults=faults or Faults())


def test_workers_share_the_stream_and_apply_each_record_once(settings: Settings, pg: Any, rds: Any) -> None:
    stage(settings, 30)
    a, b = worker(settings, "a", batch_size=4), worker(settings, "b", batch_size=4)
    a.connect()
    b.connect()
    for _ in range(20):
        a.run_once(block_ms=-1)
        b.run_once(block_ms=-1)
    assert counts(pg) == {n: 1 for n in range(30)}
    assert a.handled_total > 0 and b.handled_total > 0, "both workers took a share"
    assert rds.xpending("test-stream", "g")["pending"] == 0
    a.close()
    b.close()


def test_crash_before_commit_and_before_ack_apply_once(settings: Settings, pg: Any, rds: Any) -> None:
    stage(settings, 6)
    crashing = worker(settings, "crashy", Faults.scripted(consumer__crash_before_commit=[True]), batch_size=3)
    crashing.connect()
    with pytest.raises(InjectedCrash):
        crashing.run_once(block_ms=-1)
    assert counts(pg) == {}, "rolled back"
    late_ack = worker(settings, "late", Faults.scripted(group__crash_before_ack=[True]), batch_size=3)
    late_ack.connect()
    with pytest.raises(InjectedCrash):
        late_ack.run_once(block_ms=-1)  # committed the next 3, never acknowledged them
    assert sorted(counts(pg)) == [3, 4, 5]
    crashing.close()
    late_ack.close()
    time.sleep(0.3)  # both workers' entries are now idle beyond claim_idle_ms
    rescuer = worker(settings, "rescuer")
    rescuer.drain()
    assert counts(pg) == {n: 1 for n in range(6)}, "claimed: applied once, the committed ones skipped"
    assert rescuer.skipped_total == 3
    assert rds.xpending("test-stream", "g")["pending"] == 0
    rescuer.close()


def test_poison_record_is_dead_lettered_while_the_rest_flow_then_replayed(
    settings: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage(settings, 10, poison={4})
    w = worker(settings, "w", batch_size=5, max_deliveries=3)
    w.connect()
    deadline = time.monotonic() + 10
    while not rds.exists(dlq_key("test-stream")):
        assert time.monotonic() < deadline, "never dead-lettered"
        w.run_once(block_ms=-1)
        time.sleep(0.1)
    assert counts(pg) == {n: 1 for n in range(10) if n != 4}, "the others flowed"
    [(letter_id, letter)] = rds.xrange(dlq_key("test-stream"))
    assert letter["dlq_group"] == "g" and letter["dlq_attempts"] == "3" and letter["dlq_consumer"] == "w"
    assert "cannot handle record 4" in letter["dlq_error"] and json.loads(letter["data"])["n"] == 4
    assert rds.xpending("test-stream", "g")["pending"] == 0, "acknowledged once dead-lettered"
    w.prune()
    marks = pg.execute("SELECT producer, seq FROM unilog_group_watermarks").fetchall()
    assert [m[1] for m in marks] == [4], "the watermark stops below the dead letter"
    # the fix ships; replay through the CLI
    monkeypatch.setenv("POISON_FIXED", "1")
    env = {
        **os.environ,
        "DATABASE_URL": settings.database_url,
        "REDIS_URL": settings.redis_url,
        "UNILOG_STREAM": "test-stream",
    }
    listed = subprocess.run(
        [sys.executable, "-m", "unilog", "dlq", "list", "--json"], env=env, capture_output=True, text=True, check=True
    )
    assert [d["id"] for d in json.loads(listed.stdout)] == [letter_id]
    subprocess.run(
        [sys.executable, "-m", "unilog", "dlq", "replay", letter_id], env=env, check=True, capture_output=True
    )
    w.drain()
    assert counts(pg) == {n: 1 for n in range(10)}
    assert rds.xlen(dlq_key("test-stream")) == 0
    w.prune()
    assert pg.execute("SELECT seq FROM unilog_group_watermarks").fetchone() == (10,)
    assert pg.execute("SELECT count(*) FROM unilog_processed").fetchone() == (0,), "pruned behind the watermark"
    w.close()


def test_dropped_dead_letter_lets_the_watermark_pass(settings: Settings, pg: Any, rds: Any) -> None:
    stage(settings, 3, poison={1})
    w = worker(settings, "w", max_deliveries=1)
    w.drain()
    [(letter_id, _)] = rds.xrange(dlq_key("test-stream"))
    env = {
        **os.environ,
        "DATABASE_URL": settings.database_url,
        "REDIS_URL": settings.redis_url,
        "UNILOG_STREAM": "test-stream",
    }
    subprocess.run([sys.executable, "-m", "unilog", "dlq", "drop", letter_id], env=env, check=True, capture_output=True)
    w.prune()
    assert pg.execute("SELECT seq FROM unilog_group_watermarks").fetchone() == (3,)
    assert rds.xlen(dlq_key("test-stream")) == 0
    w.close()


def test_redelivered_old_record_below_the_watermark_is_skipped(settings: Settings, pg: Any, rds: Any) -> None:
    stage(settings, 3)
    w = worker(settings, "w")
    w.drain()
    w.prune()
    first = rds.xrange("test-stream", count=1)[0][1]
    rds.xadd("test-stream", first)  # the same position again, its processed row long pruned
    w.drain()
    assert counts(pg) == {0: 1, 1: 1, 2: 1}
    w.close()


@pytest.mark.parametrize("isolation", ["read committed", "repeatable read"])
def test_a_prune_between_reading_the_watermark_and_claiming_does_not_apply_twice(
    settings: Settings, pg: Any, rds: Any, isolation: str
) -> None:
    """Another worker prunes at the exact step between a worker's read of the watermarks and its claim of the batch's
    identities: it moves the watermark past a record applied before and deletes that record's row, so the claim finds
    no conflict. Seen in the demo on a Redis Cluster (a redelivered ride applied twice). Here the prune holds its
    locks while the worker reads (its watermark not yet moved) and commits once the worker's claim waits on it. A
    database whose sessions default to REPEATABLE READ must not hide that commit from the worker's second read."""
    pg.execute(f"ALTER DATABASE {pg.info.dbname} SET default_transaction_isolation = '{isolation}'")
    stage(settings, 3)
    w = worker(settings, "w")
    w.drain()
    first = rds.xrange("test-stream", count=1)[0][1]
    rds.xadd("test-stream", first)  # a double-sent copy: its identity's row is still there, above the watermark
    with psycopg.connect(settings.conninfo) as pruner:
        assert store.advance_watermarks(pruner, "g", "test-stream") == 3  # rows deleted, uncommitted: locked
        done = threading.Thread(target=w.drain)
        done.start()
        waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        deadline = time.monotonic() + 30
        while pg.execute(waiting).fetchone() != (1,):  # the worker's claim waits on the pruner's delete
            assert time.monotonic() < deadline and done.is_alive(), "the worker never waited on the prune"
            time.sleep(0.05)
        pruner.commit()
        done.join(30)
    assert counts(pg) == {0: 1, 1: 1, 2: 1}, "the copy was skipped, not applied again"
    w.close()


def test_entries_trimmed_while_pending_are_acknowledged_not_crashed_on(settings: Settings, pg: Any, rds: Any) -> None:
    stage(settings, 4)
    doomed = worker(settings, "doomed", Faults.scripted(consumer__crash_before_commit=[True]))
    doomed.connect()
    with pytest.raises(InjectedCrash):
        doomed.run_once(block_ms=-1)
    doomed.close()
    rds.xtrim("test-stream", maxlen=0)  # an operator's hard cap, say
    time.sleep(0.3)
    rescuer = worker(settings, "rescuer")
    rescuer.drain()
    assert rds.xpending("test-stream", "g")["pending"] == 0
    rescuer.close()


def test_trimming_respects_pending_entries(settings: Settings, rds: Any) -> None:
    stage(settings, 5)
    doomed = worker(settings, "doomed", Faults.scripted(consumer__crash_before_commit=[True]), batch_size=2)
    doomed.connect()
    with pytest.raises(InjectedCrash):
        doomed.run_once(block_ms=-1)  # entries 1-2 stay pending
    doomed.close()
    streamer = Streamer(settings, StreamerConfig(retention_interval=0))
    assert streamer.trim("test-stream") == 0, "the group holds everything from its oldest pending entry"
    assert rds.xlen("test-stream") == 5
    time.sleep(0.3)
    rescuer = worker(settings, "rescuer")
    rescuer.drain()
    assert streamer.trim("test-stream") == 4, "acknowledged: trimmed up to the last delivered entry"
    rescuer.close()
    streamer.close()


@pytest.mark.slow(light=True)
def test_three_worker_processes_one_killed_mid_batch(settings: Settings, pg: Any, rds: redis.Redis) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        conn.execute(
            "INSERT INTO staged_log_records (action, object, data) "
            "SELECT 'create', 'ride', jsonb_build_object('n', g) FROM generate_series(0, 1999) g"
        )
        conn.commit()
    Streamer(settings).drain()
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNILOG_")}
    env.update(
        DATABASE_URL=settings.database_url,
        REDIS_URL=settings.redis_url,
        UNILOG_STREAM="test-stream",
        SLOW_HANDLER="0.05",
    )
    procs = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "unilog",
                "consume",
                "handlers:group_handler",
                "--group",
                "g",
                "--worker",
                name,
                "--batch-size",
                "50",
                "--block-ms",
                "100",
                "--claim-idle-ms",
                "1000",
            ],
            cwd=TESTS,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name in ("w1", "w2", "w3")
    }
    try:
        deadline = time.monotonic() + 30
        while len(counts(pg, "group")) < 100:
            assert time.monotonic() < deadline, "the workers did not start applying"
            time.sleep(0.05)
        victim = None
        while victim is None:
            assert time.monotonic() < deadline, "no worker was seen mid-batch"
            row = pg.execute(
                "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE 'unilog-group-g-w%%' "
                "AND state = 'idle in transaction' LIMIT 1"
            ).fetchone()
            if row:
                victim = row[0].rsplit("-", 1)[1]
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait(10)
        pending_of_victim = rds.xpending("test-stream", "g")["consumers"]
        assert any(c["name"] == victim and c["pending"] > 0 for c in pending_of_victim), "killed mid-batch"
        deadline = time.monotonic() + 60
        while len(counts(pg, "group")) < 2000 or rds.xpending("test-stream", "g")["pending"]:
            assert time.monotonic() < deadline, (len(counts(pg, "group")), rds.xpending("test-stream", "g"))
            time.sleep(0.1)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(20)
    applied = counts(pg, "group")
    assert applied == {n: 1 for n in range(2000)}, "every record applied exactly once"


def test_claiming_identities_reports_exactly_the_new_ones(settings: Settings, pg: Any) -> None:
    """Identities go to Postgres as runs of consecutive seqs; gaps, producers, epochs and partial repeats must not
    blur which ones were new."""
    from unilog import store

    first = [("p", 1, 1), ("p", 1, 2), ("p", 1, 3), ("q", 1, 7), ("p", 1, 5), ("p", 2, 6), ("", 1700000000000, 0)]
    assert store.claim_identities(pg, "g", "s", first) == set(first)
    again = [("p", 1, 3), ("p", 1, 4), ("p", 1, 5), ("q", 1, 7), ("q", 1, 8), ("p", 2, 6), ("", 1700000000000, 1)]
    assert store.claim_identities(pg, "g", "s", again) == {("p", 1, 4), ("q", 1, 8), ("", 1700000000000, 1)}
    assert store.claim_identities(pg, "g", "s", first) == set()
    assert store.claim_identities(pg, "other-group", "s", first[:2]) == set(first[:2])
    rows = pg.execute("SELECT count(*) FROM unilog_processed WHERE group_name = 'g'").fetchone()
    assert rows == (10,)


def test_a_group_worker_refused_by_redis_is_freed_when_its_caller_drops_it(
    settings: Settings, pg: Any, rds: Any
) -> None:
    """Redis refuses the worker's group (its stream's key holds a string: ``WRONGTYPE``); the caller catches the
    error and goes on. The worker's session must end with its last reference: the engine kept the refusal in a local
    as it raised it, a cycle through the traceback that kept the worker (its sessions, its Redis clients) alive until
    a full garbage collection."""
    rds.set(settings.stream, "not a stream")
    with refcounting_only():
        dropped(lambda: worker(settings, "refused").drain(), Exception)
        assert_sessions_end(pg, "unilog-group-g-refused", "the refused worker's session")
