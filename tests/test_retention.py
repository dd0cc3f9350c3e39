"""Safe retention, lost or rewound Redis, and WAIT for replicas."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from handlers import record_applied

from unilog import Consumer, ConsumerConfig, Record, Settings, Streamer, StreamerConfig, emit
from unilog.errors import PublishError, StreamGap, StreamRewound
from unilog.harness.embedded import EmbeddedRedis, find_redis


def stage(settings: Settings, n: int, start: int = 0) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(start, start + n):
            emit(conn, action="create", object="ride", data={"n": i})
        conn.commit()


def consumer(settings: Settings, name: str, batch_size: int = 1000) -> Consumer:
    def handler(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
        record_applied(name, conn, records)

    return Consumer(settings, ConsumerConfig(name=name, batch_size=batch_size), handler)


def applied(pg: psycopg.Connection[Any], name: str) -> list[int]:
    return [r[0] for r in pg.execute("SELECT n FROM applied WHERE consumer = %s ORDER BY n", (name,))]


def test_trim_only_behind_the_slowest_registered_consumer(settings: Settings, pg: Any, rds: Any) -> None:
    stage(settings, 10)
    streamer = Streamer(settings, StreamerConfig(retention_interval=0))
    streamer.drain()
    fast, slow = consumer(settings, "fast"), consumer(settings, "slow", batch_size=3)
    fast.drain()
    slow.run_once(block_ms=-1)  # slow has consumed 3 of 10
    slow_checkpoint = slow.checkpoint.last_id
    assert streamer.trim("test-stream") == 2, "entries before the slow consumer's checkpoint entry"
    first_id = rds.xrange("test-stream", count=1)[0][0]
    assert first_id == slow_checkpoint
    slow.drain()
    assert applied(pg, "slow") == list(range(10)), "the slow consumer lost nothing"
    stage(settings, 5, start=10)
    streamer.drain()  # trims on its own (retention_interval=0) behind the slowest checkpoint
    fast.drain()
    slow.drain()
    assert streamer.trim("test-stream") > 0
    assert rds.xlen("test-stream") == 1, "only the last consumed entry is kept"
    for c in (fast, slow, streamer):
        c.close()


def test_unregistered_consumers_do_not_hold_back_trimming(settings: Settings, rds: Any) -> None:
    stage(settings, 4)
    streamer = Streamer(settings)
    streamer.drain()
    idle = consumer(settings, "idle")
    idle.connect()  # registers at the stream's beginning
    assert streamer.trim("test-stream") == 0, "a registered consumer at 0-0 holds everything"
    assert idle.links.redis().unregister("test-stream", "idle")
    assert streamer.trim("test-stream") == 0, "no registered consumer: nothing is trimmed"
    done = consumer(settings, "done")
    done.drain()
    assert streamer.trim("test-stream") == 3
    for c in (idle, done, streamer):
        c.close()


def test_hard_cap_past_a_slow_consumer_stops_it_with_a_clear_error(settings: Settings, pg: Any, rds: Any) -> None:
    stage(settings, 3)
    Streamer(settings).drain()
    slow = consumer(settings, "slow", batch_size=2)
    slow.run_once(block_ms=-1)
    stage(settings, 250, start=3)  # MAXLEN ~ trims whole nodes (100 entries each by default)
    capped = Streamer(settings, StreamerConfig(max_len=10, retention_interval=0, batch_size=100))
    capped.drain()
    assert rds.xlen("test-stream") < 253
    with pytest.raises(StreamGap) as info:
        slow.drain()
    message = str(info.value)
    assert "positions 1:3.." in message and "trimmed or Redis lost them" in message and "reconcile" in message
    assert applied(pg, "slow") == [0, 1], "nothing after the gap was applied"
    slow.close()
    capped.close()


def test_redis_process_killed_with_its_aof_on_loses_nothing(settings: Settings, pg: Any, tmp_path: Path) -> None:
    """A SIGKILL of the Redis process (its AOF on) loses no record the streamer took off the staged table: Redis
    wrote each batch to its AOF before it replied, and the streamer deletes only what Redis confirmed.

    What this does not prove: what ``appendfsync always`` adds. The kernel keeps a killed process's writes in its
    page cache, so this passes with ``appendfsync no`` too (it was run so, once); only a crash of the host (power,
    kernel) tells the policies apart, which a test on one machine cannot stage. Named for what it proves."""
    with EmbeddedRedis(tmp_path / "r", binary=find_redis()) as server:
        own = settings.with_(redis_url=server.url)
        stage(own, 20)
        Streamer(own).drain()
        server.restart(kill=True)  # SIGKILL: what Redis wrote to its AOF survives
        client = redis.Redis.from_url(server.url)
        try:
            assert client.xlen("test-stream") == 20, "the stream came back from the AOF"
        finally:
            client.close()
        stage(own, 5, start=20)
        with Streamer(own) as s:
            s.drain()
        with consumer(own, "c") as c:
            c.drain()
        assert applied(pg, "c") == list(range(25))


def test_rewound_redis_is_detected_at_startup_and_while_idle(settings: Settings, tmp_path: Path) -> None:
    """Restore an older copy of the AOF (a truncated AOF, a failover to a lagging replica): the stream goes back."""
    with EmbeddedRedis(tmp_path / "r") as server:
        own = settings.with_(redis_url=server.url)
        stage(own, 3)
        Streamer(own).drain()
        server.stop()
        shutil.copytree(tmp_path / "r", tmp_path / "old")
        server.start()
        stage(own, 3, start=3)
        Streamer(own).drain()
        idle = consumer(own, "c")
        idle.drain()
        server.stop()
        shutil.rmtree(tmp_path / "r")
        shutil.copytree(tmp_path / "old", tmp_path / "r")
        server.start()
        time.sleep(1.1)  # idle checks run at most once a second
        with pytest.raises(StreamRewound, match=r"below this consumer's checkpoint"):
            idle.run_once(block_ms=-1)  # still connected, idle: the next idle check notices
        idle.close()
        with pytest.raises(StreamRewound):
            consumer(own, "c").connect()  # and a restarted consumer refuses to start


def test_redis_without_persistence_loses_the_stream_and_consumers_stop(settings: Settings, tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path / "r", appendonly=False) as server:
        own = settings.with_(redis_url=server.url)
        stage(own, 3)
        Streamer(own).drain()
        c = consumer(own, "c")
        c.drain()
        server.restart(kill=True)
        time.sleep(1.1)
        with pytest.raises(StreamRewound, match="no such key"):
            c.run_once(block_ms=-1)
        c.close()


def test_wait_for_replicas_before_deleting(settings: Settings, pg: Any, tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path / "primary", settings={"repl-diskless-sync-delay": "0"}) as primary:
        own = settings.with_(redis_url=primary.url)
        stage(own, 3)
        lonely = Streamer(own, StreamerConfig(wait_replicas=1, wait_timeout_ms=200))
        with pytest.raises(PublishError, match="only 0 of 1 replicas acknowledged"):
            lonely.drain()
        lonely.close()
        assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone() == (3,), "kept staged"
        replica_settings = {"replicaof": f"127.0.0.1 {primary.port}"}  # no AOF: its post-sync rewrite slows shutdown
        with EmbeddedRedis(tmp_path / "replica", appendonly=False, settings=replica_settings) as replica:
            client = redis.Redis.from_url(replica.url)
            deadline = time.monotonic() + 10
            while client.info("replication").get("master_link_status") != "up":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            with Streamer(own, StreamerConfig(wait_replicas=1, wait_timeout_ms=2000)) as s:
                assert s.drain() == 3
            assert client.xlen("test-stream") == 3, "the replica has every entry (one appended before, deduped)"
            client.close()
