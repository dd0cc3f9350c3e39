"""A real Redis Cluster from the harness (three masters, three replicas): it forms, and unilog's key layout puts a
stream and all of its keys in one slot while the partitions of a partitioned stream spread over the masters."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from unilog.harness.embedded import EmbeddedRedisCluster, ServerNotFound
from unilog.wire import attempts_key, dlq_key, hwm_key, meta_key, registry_key, workers_key


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedRedisCluster]:
    try:
        server = EmbeddedRedisCluster().start()
    except ServerNotFound as exc:
        pytest.skip(f"no redis-server to start: {exc}")
    yield server
    server.stop(cleanup=True)


def test_the_cluster_forms_with_a_replica_per_master(cluster: EmbeddedRedisCluster) -> None:
    client = redis.RedisCluster.from_url(cluster.url, decode_responses=True)
    try:
        roles = [n.redis_connection.info("replication")["role"] for n in client.get_nodes()]
        assert sorted(roles) == ["master"] * 3 + ["slave"] * 3
        client.set("{probe}:x", "1")
        assert client.get("{probe}:x") == "1"
    finally:
        client.close()


def test_a_streams_keys_share_its_slot_and_its_partitions_spread(cluster: EmbeddedRedisCluster) -> None:
    client = redis.RedisCluster.from_url(cluster.url)
    try:
        stream = "orders"
        keys = [
            stream,
            hwm_key(stream),
            meta_key(stream),
            dlq_key(stream),
            registry_key(stream),
            attempts_key(stream, "g"),
            workers_key(stream, "c"),
        ]
        assert len({client.keyslot(k) for k in keys}) == 1, "the publish script and MULTI blocks stay in one slot"
        partitions = [f"{stream}.p{i}" for i in range(8)]
        owners = {cluster.master_of(p).port for p in partitions}
        assert len(owners) >= 2, "partitions land on different masters"
        for p in partitions:
            assert client.keyslot(hwm_key(p)) == client.keyslot(p)
    finally:
        client.close()
