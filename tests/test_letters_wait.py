"""Dead letters wait for replicas (issue 28, item 5): with ``wait_replicas`` a checkpoint consumer moves its checkpoint
past a dead-lettered record only once enough replicas acknowledged the letter (``WAIT`` on the connection that wrote
it); until then the transaction rolls back (no checkpoint, no held row) and the record is retried, leaving one copy
of its letter, not one per attempt. A group's letter and acknowledgement are one MULTI (a replica keeps both or
neither): a shortfall is logged and counted.

A real primary and replica (``replicaof``): the replica is stopped (SIGSTOP), so it acknowledges nothing, then
resumed. The failover on a real Redis Cluster is in tests/test_cluster_failover.py."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis
from test_conformance import Driver

from unilog import ConsumerConfig, Faults, GroupConfig, Settings, Streamer, emit
from unilog.errors import NotReplicated
from unilog.harness.embedded import EmbeddedRedis, ServerNotFound
from unilog.metrics import LETTERS_UNREPLICATED
from unilog.wire import dlq_key


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[EmbeddedRedis, EmbeddedRedis]]:
    """A primary and its one replica, online."""
    try:
        primary = EmbeddedRedis().start()
    except ServerNotFound as exc:
        pytest.skip(f"no redis-server to start: {exc}")
    replica = EmbeddedRedis(settings={"replicaof": f"127.0.0.1 {primary.port}"}).start()
    client = redis.Redis(host="127.0.0.1", port=primary.port, decode_responses=True)
    deadline = time.monotonic() + 30
    while client.info("replication").get("slave0", {}).get("state") != "online":
        assert time.monotonic() < deadline, "the replica did not come online"
        time.sleep(0.05)
    client.close()
    yield primary, replica
    replica.stop(cleanup=True)
    primary.stop(cleanup=True)


@pytest.fixture(params=["sync", "async"])
def face(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def on_primary(settings: Settings, pair: tuple[EmbeddedRedis, EmbeddedRedis]) -> Settings:
    """This test's database, the pair's primary and a stream of its own (the pair serves the whole module)."""
    return dataclasses.replace(settings, redis_url=pair[0].url, stream=f"rides{uuid.uuid4().hex[:8]}")


def produce(settings: Settings, count: int) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for n in range(count):
            emit(conn, action="create", object="ride", data={"n": n})
    with Streamer(settings) as streamer:
        streamer.drain()


def letters(node: EmbeddedRedis, stream: str) -> list[str]:
    """The original ids of ``stream``'s dead letters as ``node`` holds them."""
    client = redis.Redis(host="127.0.0.1", port=node.port, decode_responses=True)
    try:
        return [fields["dlq_original_id"] for _, fields in client.xrange(dlq_key(stream))]
    finally:
        client.close()


def checkpoint(pg: Any, name: str) -> str:
    return str(pg.execute("SELECT last_id FROM unilog_checkpoints WHERE name = %s", (name,)).fetchone()[0])


def test_the_checkpoint_passes_a_dead_letter_only_once_a_replica_acknowledged_it(
    face: str, pair: tuple[EmbeddedRedis, EmbeddedRedis], on_primary: Settings, pg: Any
) -> None:
    primary, replica = pair
    produce(on_primary, 6)
    ids = [
        eid for eid, _ in redis.Redis.from_url(on_primary.redis_url, decode_responses=True).xrange(on_primary.stream)
    ]
    config = ConsumerConfig(
        name="c0", max_attempts=1, on_poison="dead-letter", wait_replicas=1, wait_timeout_ms=300, block_ms=100
    )
    driver = Driver(face, on_primary, config, {3}, Faults())
    held = "SELECT origin_id FROM unilog_held_letters WHERE consumer = 'c0'"
    try:
        replica.pause()
        try:
            for _attempt in range(2):
                with pytest.raises(NotReplicated, match="acknowledged by 0 of 1 replicas within 300 ms"):
                    driver.drain()
                assert checkpoint(pg, "c0") == ids[2], "the records before it are applied; the checkpoint stops there"
                assert pg.execute(held).fetchall() == [], "the held row rolled back with the checkpoint"
                assert letters(primary, on_primary.stream) == [ids[3]], "one copy of the letter, not one per attempt"
        finally:
            replica.resume()
        driver.drain()
    finally:
        driver.close()
    assert checkpoint(pg, "c0") == ids[5], "acknowledged: the checkpoint moved past it"
    assert [r[0] for r in pg.execute(held)] == [ids[3]]
    assert letters(replica, on_primary.stream) == [ids[3]], "the replica has the letter the checkpoint passed"
    applied = [r[0] for r in pg.execute("SELECT n FROM applied WHERE consumer = 'c0' ORDER BY entry_id")]
    assert applied == [0, 1, 2, 4, 5]


def test_a_group_logs_and_counts_a_letter_no_replica_acknowledged(
    face: str, pair: tuple[EmbeddedRedis, EmbeddedRedis], on_primary: Settings, pg: Any
) -> None:
    """The letter and its XACK are one MULTI: a failover keeps both or neither, so the group goes on."""
    primary, replica = pair
    produce(on_primary, 3)
    config = GroupConfig(
        group="g", worker="w", max_deliveries=1, claim_idle_ms=0, wait_replicas=1, wait_timeout_ms=200, block_ms=100
    )
    driver = Driver(face, on_primary, config, {1}, Faults())
    before = LETTERS_UNREPLICATED.labels(on_primary.stream, "g")._value.get()
    try:
        replica.pause()
        try:
            driver.drain()
        finally:
            replica.resume()
    finally:
        driver.close()
    assert LETTERS_UNREPLICATED.labels(on_primary.stream, "g")._value.get() == before + 1
    assert len(letters(primary, on_primary.stream)) == 1
    pending = redis.Redis.from_url(on_primary.redis_url).xpending(on_primary.stream, "g")["pending"]
    assert pending == 0, "acknowledged with its letter"
