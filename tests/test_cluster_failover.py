"""A Redis Cluster master dies and its replica takes over. With ``--wait-replicas 1`` the streamer deletes a staged
record only after the replica has it, so every committed record is applied once across the failover. Without it,
the tail the replica never got is lost, and the consumer stops with ``StreamRewound`` instead of skipping it.

The lost tail is made deterministic: the replica is paused (SIGSTOP) and its link cut while the streamer publishes,
then the master is killed (SIGKILL) and the replica resumed, so it is promoted without those entries.

Dead letters the same way (issue 28, item 5): on a cluster a checkpoint consumer waits for a replica to acknowledge a
dead letter before its checkpoint passes the record, so a master killed right after the checkpoint moved leaves the
letter on the promoted replica; without the wait it is lost, and only its held row in Postgres remains."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from clusters import embedded_cluster

from unilog import Consumer, ConsumerConfig, Settings, emit
from unilog.cli import ExitCode
from unilog.harness.embedded import EmbeddedRedis, EmbeddedRedisCluster
from unilog.harness.pytest_plugin import running
from unilog.metrics import LETTERS_UNREPLICATED
from unilog.wire import dlq_key

# Redis Cluster failovers take about a minute in all: the whole suite (`pytest -m ""`, .ci/run) runs them
pytestmark = pytest.mark.slow

TESTS = Path(__file__).parent


@pytest.fixture
def cluster() -> Iterator[Any]:
    yield from embedded_cluster()


def replica_of(cluster: EmbeddedRedisCluster, master: EmbeddedRedis) -> EmbeddedRedis:
    for node in cluster.nodes:
        info = redis.Redis(host="127.0.0.1", port=node.port).info("replication")
        if info.get("role") == "slave" and int(info.get("master_port", 0)) == master.port:
            return node
    raise AssertionError("no replica found")


def wait_promoted(node: EmbeddedRedis, timeout: float = 30) -> None:
    client = redis.Redis(host="127.0.0.1", port=node.port)
    deadline = time.monotonic() + timeout
    while (
        client.info("replication").get("role") != "master"
        or "cluster_state:ok" not in client.execute_command("CLUSTER", "INFO").decode()
    ):
        assert time.monotonic() < deadline, "the replica was not promoted"
        time.sleep(0.1)


def wait_for_replica(node: EmbeddedRedis, timeout: float = 30) -> None:
    client = redis.Redis(host="127.0.0.1", port=node.port)
    deadline = time.monotonic() + timeout
    while not any(isinstance(v, dict) and v.get("state") == "online" for v in client.info("replication").values()):
        assert time.monotonic() < deadline, "the old master did not rejoin as a replica"
        time.sleep(0.1)


class Fleet:
    def __init__(self, settings: Settings, cluster: EmbeddedRedisCluster) -> None:
        self.settings = settings
        self.stream = f"rides{uuid.uuid4().hex[:6]}"
        self.env = {
            **os.environ,
            "DATABASE_URL": settings.database_url,
            "REDIS_URL": cluster.cluster_url,
            "UNILOG_STREAM": self.stream,
        }

    def unilog(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "unilog", "--log-json", *args]
        return subprocess.run(argv, env=self.env, cwd=TESTS, capture_output=True, text=True, timeout=90)

    def stage(self, first: int, count: int) -> None:
        with psycopg.connect(self.settings.conninfo) as conn:
            for n in range(first, first + count):
                emit(conn, action="create", object="ride", data={"n": n})

    def consume(self) -> subprocess.CompletedProcess[str]:
        return self.unilog("consume", "handlers:cli_handler", "--name", "cli", "--once")


def test_with_wait_replicas_every_record_is_applied_once_across_a_failover(
    cluster: EmbeddedRedisCluster, settings: Settings, pg: Any
) -> None:
    fleet = Fleet(settings, cluster)
    wait = ["--wait-replicas", "1", "--wait-timeout-ms", "3000"]
    fleet.stage(0, 10)
    assert fleet.unilog("streamer", "--once", *wait).returncode == 0
    assert fleet.consume().returncode == 0
    master = cluster.master_of(fleet.stream)
    replica = replica_of(cluster, master)
    replica.pause()
    fleet.stage(10, 10)
    unconfirmed = fleet.unilog("streamer", "--once", *wait)
    assert unconfirmed.returncode != 0 and "replicas acknowledged" in unconfirmed.stderr, unconfirmed.stderr
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone() == (10,), "kept until a replica has them"
    master.kill()
    replica.resume()
    wait_promoted(replica)
    master.start()  # the old master comes back as the new one's replica: --wait-replicas 1 can be met again
    wait_for_replica(replica)
    done = fleet.unilog("streamer", "--once", *wait)
    assert done.returncode == 0 and "streamed 10 records" in done.stdout, done.stderr
    assert fleet.consume().returncode == 0
    applied = [r[0] for r in pg.execute("SELECT n FROM applied WHERE consumer = 'cli' ORDER BY n")]
    assert applied == list(range(20)), "every committed record applied once"


def test_without_wait_replicas_a_lost_tail_stops_the_consumer(
    cluster: EmbeddedRedisCluster, settings: Settings, pg: Any
) -> None:
    fleet = Fleet(settings, cluster)
    fleet.stage(0, 10)
    assert fleet.unilog("streamer", "--once").returncode == 0
    master = cluster.master_of(fleet.stream)
    replica = replica_of(cluster, master)
    replica.pause()
    # cut the link too: what the master sent a paused replica would still wait in its socket, and arrive on resume
    redis.Redis(host="127.0.0.1", port=master.port).client_kill_filter(_type="replica")
    fleet.stage(10, 10)
    assert fleet.unilog("streamer", "--once").returncode == 0, "acknowledged by the master alone"
    assert fleet.consume().returncode == 0
    master.kill()
    replica.resume()
    wait_promoted(replica)
    stopped = fleet.consume()
    assert stopped.returncode == ExitCode.DATA_LOSS, stopped.stderr
    assert "Redis lost entries" in stopped.stderr, stopped.stderr
    applied = [r[0] for r in pg.execute("SELECT n FROM applied WHERE consumer = 'cli' ORDER BY n")]
    assert applied == list(range(20)), "what was applied stays applied once; nothing is skipped silently"


def test_with_wait_replicas_a_consumer_waits_out_a_rewind_and_skips_the_resent_records(
    cluster: EmbeddedRedisCluster, settings: Settings, pg: Any
) -> None:
    """A consumer can read entries before the replica has them; after the failover the stream ends below its
    checkpoint. The streamer kept those records staged (the replica never acknowledged them) and re-sends them at the
    same positions: with --rewind-grace the consumer waits for them and skips them instead of stopping."""
    fleet = Fleet(settings, cluster)
    wait = ["--wait-replicas", "1", "--wait-timeout-ms", "1000"]
    fleet.stage(0, 10)
    assert fleet.unilog("streamer", "--once", *wait).returncode == 0
    master = cluster.master_of(fleet.stream)
    replica = replica_of(cluster, master)
    replica.pause()
    redis.Redis(host="127.0.0.1", port=master.port).client_kill_filter(_type="replica")
    fleet.stage(10, 10)
    assert fleet.unilog("streamer", "--once", *wait).returncode != 0, "not acknowledged by a replica: kept staged"
    assert fleet.consume().returncode == 0, "read from the master before the replica had them"
    master.kill()
    replica.resume()
    wait_promoted(replica)
    master.start()
    wait_for_replica(replica)
    stopped = fleet.consume()
    assert stopped.returncode == ExitCode.DATA_LOSS and "Redis lost entries" in stopped.stderr, stopped.stderr
    grace = ["--rewind-grace", "30"]
    waiting = fleet.unilog("consume", "handlers:cli_handler", "--name", "cli", "--once", *grace)
    assert waiting.returncode == 0, waiting.stderr
    assert "re-send what it kept staged" in waiting.stdout + waiting.stderr
    resent = fleet.unilog("streamer", "--once", *wait)
    assert resent.returncode == 0 and "streamed 10 records" in resent.stdout, resent.stderr
    assert fleet.unilog("consume", "handlers:cli_handler", "--name", "cli", "--once", *grace).returncode == 0
    applied = [r[0] for r in pg.execute("SELECT n FROM applied WHERE consumer = 'cli' ORDER BY n")]
    assert applied == list(range(20)), "the re-sent records are skipped, not applied twice"
    top = redis.Redis(host="127.0.0.1", port=replica.port).xinfo_stream(fleet.stream)["length"]
    assert top == 20, "the stream holds every record again"


def checkpoint(pg: Any, name: str) -> str | None:
    row = pg.execute("SELECT last_id FROM unilog_checkpoints WHERE name = %s", (name,)).fetchone()
    return None if row is None else str(row[0])


def until(check: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def dead_letter_then_failover(
    cluster: EmbeddedRedisCluster, settings: Settings, pg: Any, **wait: Any
) -> tuple[str, list[str]]:
    """A poison record dead-lettered while the replica of the master owning the dead-letter stream's slot is paused
    and cut off; the replica resumed once the consumer refused to pass the record (``wait``ing) or after; the master
    killed right after the checkpoint passed the record; the replica promoted. Returns the poison's id and the
    original ids of the dead letters the promoted replica holds."""
    fleet = Fleet(settings, cluster)
    fleet.stage(0, 4)
    assert fleet.unilog("streamer", "--once", "--wait-replicas", "1", "--wait-timeout-ms", "3000").returncode == 0
    master = cluster.master_of(dlq_key(fleet.stream))
    replica = replica_of(cluster, master)
    ids = [e[0].decode() for e in redis.Redis(host="127.0.0.1", port=master.port).xrange(fleet.stream)]

    def handle(conn: psycopg.Connection[Any], records: Any) -> None:
        if any(r.data["n"] == 2 for r in records):
            raise ValueError("cannot apply 2")

    config = ConsumerConfig(
        name="c0", max_attempts=1, on_poison="dead-letter", wait_timeout_ms=300, max_backoff=0.2, block_ms=100, **wait
    )
    on_cluster = dataclasses.replace(settings, redis_url=cluster.cluster_url, stream=fleet.stream)
    replica.pause()
    redis.Redis(host="127.0.0.1", port=master.port).client_kill_filter(_type="replica")  # nothing left in flight
    refused = LETTERS_UNREPLICATED.labels(fleet.stream, "c0")
    with Consumer(on_cluster, config, handle) as consumer, running(consumer.run):
        passed = lambda: checkpoint(pg, "c0") == ids[3]  # noqa: E731
        assert until(lambda: passed() or refused._value.get() > 0, 60), "neither passed nor refused"
        if not passed():
            assert checkpoint(pg, "c0") == ids[1], "kept before the record whose letter no replica acknowledged"
            replica.resume()
            assert until(passed, 60), "acknowledged once the replica is back"
        master.kill()  # right after the checkpoint moved past the record
    replica.resume()
    wait_promoted(replica)
    promoted = redis.Redis(host="127.0.0.1", port=replica.port, decode_responses=True)
    held = pg.execute("SELECT origin_id FROM unilog_held_letters WHERE consumer = 'c0'").fetchall()
    assert held == [(ids[2],)], "the held row in Postgres is there either way"
    return ids[2], [fields["dlq_original_id"] for _, fields in promoted.xrange(dlq_key(fleet.stream))]


def test_a_dead_letter_survives_a_failover_right_after_the_checkpoint_passed_its_record(
    cluster: EmbeddedRedisCluster, settings: Settings, pg: Any
) -> None:
    """On a cluster a consumer waits for 1 replica by default."""
    poison, letters = dead_letter_then_failover(cluster, settings, pg)
    assert letters == [poison], "the promoted replica has the dead letter"


def test_without_the_wait_a_failover_loses_the_dead_letter(
    cluster: EmbeddedRedisCluster, settings: Settings, pg: Any
) -> None:
    _poison, letters = dead_letter_then_failover(cluster, settings, pg, wait_replicas=0)
    assert letters == [], "acknowledged by the master alone: lost with it"
