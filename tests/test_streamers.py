"""Concurrent streamers: one publisher per stream, takeover after SIGKILL, retried serialization failures."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from unilog_demo.migrate import prepare
from unilog_demo.records import RideCreated
from unilog_demo.rides import STREAM, canonical_totals, consumer_totals

from unilog import Settings, Streamer, StreamerConfig, UnilogError, emit
from unilog.harness.pytest_plugin import running
from unilog.wire import registry_key

ROOT = Path(__file__).parent.parent


def produce_rides(settings: Settings, stop: threading.Event, rate: float = 200.0) -> None:
    rng = random.Random(5)
    with psycopg.connect(settings.conninfo) as conn:
        while not stop.is_set():
            with conn.transaction():
                distance = Decimal(rng.randint(1, 10_000_000)) / 1000
                ride_id = conn.execute("INSERT INTO rides (distance) VALUES (%s) RETURNING id", (distance,)).fetchone()
                emit(conn, RideCreated(id=ride_id[0], distance=distance))
            time.sleep(1 / rate)


def lock_holder(pg: psycopg.Connection[Any]) -> str | None:
    row = pg.execute(
        """
        SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'advisory' AND l.granted
          AND ((l.classid::bigint << 32) | l.objid::bigint) <> hashtextextended('unilog.wakeup', 0)
        """
    ).fetchone()
    return row[0] if row else None


def spawn(settings: Settings, *argv: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNILOG_")}
    env.update(
        DATABASE_URL=settings.database_url, REDIS_URL=settings.redis_url, UNILOG_STREAM=STREAM, PYTHONPATH=str(ROOT)
    )
    return subprocess.Popen(
        [sys.executable, *argv], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


@pytest.mark.slow(light=True)
def test_two_streamers_two_consumers_survive_sigkill_of_the_active_streamer(
    settings: Settings, pg: psycopg.Connection[Any], rds: Any
) -> None:
    prepare(settings.database_url)
    for name in ("consumer0", "consumer1"):  # declared before traffic, as a deploy would: retention waits for them
        rds.hset(registry_key(STREAM), name, "0-0")
    streamers = {
        name: spawn(settings, "-m", "unilog", "streamer", "--name", name, "--poll-interval", "0.5")
        for name in ("sA", "sB")
    }
    consumers = [
        spawn(settings, "-m", "unilog_demo.consumer", name, "--block-ms", "200") for name in ("consumer0", "consumer1")
    ]
    stop = threading.Event()
    producer = threading.Thread(target=produce_rides, args=(settings, stop))
    producer.start()
    try:
        deadline = time.monotonic() + 20
        while (active := lock_holder(pg)) is None or rds.xlen(STREAM) < 200:
            assert time.monotonic() < deadline, "no streamer became active"
            time.sleep(0.05)
        name = active.removeprefix("unilog-")
        standby = "sB" if name == "sA" else "sA"
        streamers[name].send_signal(signal.SIGKILL)
        streamers[name].wait(10)
        killed_at, length_at_kill = time.monotonic(), rds.xlen(STREAM)
        while lock_holder(pg) != f"unilog-{standby}" or rds.xlen(STREAM) <= length_at_kill + 100:
            assert time.monotonic() - killed_at < 15, "the standby streamer did not take over"
            time.sleep(0.02)
        takeover = time.monotonic() - killed_at
        print(f"standby took over and published within {takeover:.2f}s")
        time.sleep(1)
    finally:
        stop.set()
        producer.join()
    deadline = time.monotonic() + 30
    with psycopg.connect(settings.conninfo, autocommit=True) as conn:
        canonical = canonical_totals(conn)
        while (
            consumer_totals(conn).get("consumer0") != canonical or consumer_totals(conn).get("consumer1") != canonical
        ):
            assert time.monotonic() < deadline, (consumer_totals(conn), canonical)
            time.sleep(0.1)
    for proc in [*streamers.values(), *consumers]:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(20) == 0
    seqs = [int(f["seq"]) for _, f in rds.xrange(STREAM)]  # what retention kept: the tail
    assert seqs == list(range(canonical.ride_count - len(seqs) + 1, canonical.ride_count + 1)), "dense, in order"
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone() == (0,)


def test_a_second_streamer_stands_by_while_the_first_holds_the_lock(settings: Settings, pg: Any, rds: Any) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        emit(conn, action="a", object="o", data={})
        conn.commit()
    first, second = Streamer(settings, name="first"), Streamer(settings, name="second")
    assert first.run_once().published == 1
    with psycopg.connect(settings.conninfo) as conn:
        emit(conn, action="a", object="o", data={})
        conn.commit()
    assert second.run_once().published == 0, "standby must not publish"
    first.close()  # session ends: the server releases the lock as soon as it notices
    assert second.drain(timeout=10) == 1
    second.close()
    assert [int(f["seq"]) for _, f in rds.xrange("test-stream")] == [1, 2]


def test_serialization_failure_in_the_delete_is_retried(settings: Settings, pg: Any, rds: Any) -> None:
    """A real SQLSTATE 40001 on the streamer's delete: the batch is rolled back, re-sent, deduplicated, deleted."""
    pg.execute("CREATE SEQUENCE fail_seq")
    pg.execute(
        """
        CREATE FUNCTION fail_once() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF nextval('fail_seq') = 1 THEN
                RAISE EXCEPTION 'injected conflict' USING ERRCODE = 'serialization_failure';
            END IF;
            RETURN NULL;
        END $$
        """
    )
    pg.execute(
        "CREATE TRIGGER fail_once AFTER DELETE ON staged_log_records FOR EACH STATEMENT EXECUTE FUNCTION fail_once()"
    )
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(5):
            emit(conn, action="a", object="o", data={"n": i})
        conn.commit()
    streamer = Streamer(settings, StreamerConfig(poll_interval=0.05))
    with running(streamer.run):
        deadline = time.monotonic() + 10
        while pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    streamer.close()
    assert pg.execute("SELECT last_value FROM fail_seq").fetchone()[0] >= 2, "the first delete failed"
    assert [int(f["seq"]) for _, f in rds.xrange("test-stream")] == [1, 2, 3, 4, 5]


def test_redis_client_never_retries_on_its_own(settings: Settings) -> None:
    from unilog.engine import connect

    client = connect(settings.redis_url)
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["retry"].get_retries() == 0
    assert not kwargs.get("retry_on_timeout")
    client.close()


def test_drain_waits_for_a_stream_another_session_holds(settings: Settings, pg: Any, rds: Any) -> None:
    """Found by the property tests: drain() returned 0 while another session held the stream lock."""
    holder = psycopg.connect(settings.conninfo, autocommit=True)
    holder.execute("SELECT pg_advisory_lock(hashtextextended('unilog.stream:' || 'test-stream', 0))")
    with psycopg.connect(settings.conninfo) as conn:
        emit(conn, action="a", object="o", data={})
        conn.commit()
    with Streamer(settings) as streamer:
        assert streamer.run_once().blocked
        with pytest.raises(UnilogError, match="another streamer holds"):
            streamer.drain(timeout=0.3)
        threading.Timer(0.3, holder.close).start()  # the other session ends: its lock is released
        assert streamer.drain(timeout=10) == 1
    assert rds.xlen("test-stream") == 1
