"""A Redis Cluster master dies and its replica takes over. With ``--wait-replicas 1`` the streamer deletes a staged
record only after the replica has it, so every committed record is applied once across the failover. Without it,
the tail the replica never got is lost, and the consumer stops with ``StreamRewound`` instead of skipping it.

The lost tail is made deterministic: the replica is paused (SIGSTOP) and its link cut while the streamer publishes,
then the master is killed (SIGKILL) and the replica resumed, so it is promoted without those entries."""

from __future__ import annotations

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

from unilog import Settings, emit
from unilog.cli import ExitCode
from unilog.harness.embedded import EmbeddedRedis, EmbeddedRedisCluster

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
