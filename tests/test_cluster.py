"""A real Redis Cluster from the harness (three masters, three replicas): it forms, and unilog's key layout puts a
stream and all of its keys in one slot while the partitions of a partitioned stream spread over the masters."""

from __future__ import annotations

import json
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
from unilog.harness.embedded import EmbeddedRedisCluster
from unilog.wire import attempts_key, dlq_key, hwm_key, meta_key, registry_key, workers_key


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    yield from embedded_cluster()


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


def test_a_partitioned_stream_is_published_into_the_cluster_once_in_order(
    cluster: EmbeddedRedisCluster, settings: Settings, pg: Any
) -> None:
    url = cluster.url.replace("redis://", "redis+cluster://", 1)
    stream = f"orders{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "DATABASE_URL": settings.database_url, "REDIS_URL": url, "UNILOG_STREAM": stream}

    def unilog(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "unilog", "--log-json", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).parent,
        )

    assert unilog("stream", "partition", stream, "4").returncode == 0
    with psycopg.connect(settings.conninfo) as conn:
        for n in range(40):
            emit(conn, action="update", object="account", data={"key": f"k{n % 5}", "n": n}, key=f"k{n % 5}")
    first = unilog("streamer", "--once")
    assert first.returncode == 0 and "streamed 40 records" in first.stdout, first.stderr
    client = redis.RedisCluster.from_url(cluster.url, decode_responses=True)
    try:
        seen: dict[str, list[int]] = {}
        owners = set()
        for i in range(4):
            partition = f"{stream}.p{i}"
            entries = client.xrange(partition)
            if entries:
                owners.add(cluster.master_of(partition).port)
            assert [int(f["seq"]) for _, f in entries] == list(range(1, len(entries) + 1)), "dense positions"
            for _, fields in entries:
                seen.setdefault(fields["key"], []).append(json.loads(fields["data"])["n"])
        assert sorted(n for ns in seen.values() for n in ns) == list(range(40)), "each record once"
        assert all(ns == sorted(ns) for ns in seen.values()), "per-key order"
        assert len(owners) >= 2, "the partitions live on different masters"
    finally:
        client.close()
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone() == (0,)
    consumed = unilog("consume", "handlers:cli_handler", "--name", "cli", "--partitioned", "--once")
    assert consumed.returncode == 0, consumed.stderr
    busiest = max((f"{stream}.p{i}" for i in range(4)), key=lambda p: len(seen_in(cluster, p)))
    grouped = unilog("consume", "handlers:group_handler", "--group", "g", "--stream", busiest, "--once")
    assert grouped.returncode == 0, grouped.stderr
    rows = pg.execute("SELECT consumer, count(*), count(DISTINCT n) FROM applied GROUP BY consumer").fetchall()
    counts = {name: (n, distinct) for name, n, distinct in rows}
    assert counts["cli"] == (40, 40), "each record once through the partition workers"
    assert counts["group"][0] == counts["group"][1] == len(seen_in(cluster, busiest)) > 0
    for args in (["status", "--json"], ["dlq", "list", "--stream", busiest]):
        done = unilog(*args)
        assert done.returncode == 0, (args, done.stderr)

    # long-running partition workers wait on partitions in different slots (no one XREAD can span them)
    pg.execute("CREATE TABLE key_order (id BIGSERIAL PRIMARY KEY, key TEXT, n INT, worker TEXT)")
    argv = [
        sys.executable,
        "-m",
        "unilog",
        "consume",
        "handlers:ordered_handler",
        "--name",
        "live",
        "--partitioned",
        "--worker",
        "w1",
        "--block-ms",
        "100",
    ]
    worker = subprocess.Popen(
        argv, env=env, cwd=Path(__file__).parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    streamer = subprocess.Popen(
        [sys.executable, "-m", "unilog", "streamer", "--poll-interval", "0.2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with psycopg.connect(settings.conninfo) as conn:
            for n in range(40, 60):
                emit(conn, action="update", object="account", data={"key": f"k{n % 5}", "n": n}, key=f"k{n % 5}")
                conn.commit()
        deadline = time.monotonic() + 60
        while pg.execute("SELECT count(*) FROM key_order").fetchone()[0] < 60:
            assert time.monotonic() < deadline, "the live partition workers did not catch up"
            time.sleep(0.2)
    finally:
        for proc in (worker, streamer):
            proc.terminate()
            proc.wait(timeout=30)
    order = pg.execute("SELECT key, n FROM key_order ORDER BY id").fetchall()
    assert sorted(n for _, n in order) == list(range(60)), "each record once"
    for key in {k for k, _ in order}:
        ns = [n for k, n in order if k == key]
        assert ns == sorted(ns), f"per-key order for {key}"


def seen_in(cluster: EmbeddedRedisCluster, stream: str) -> list[Any]:
    client = redis.RedisCluster.from_url(cluster.url)
    try:
        return list(client.xrange(stream))
    finally:
        client.close()


def test_a_streams_batches_in_one_pipeline_follow_each_other(cluster: EmbeddedRedisCluster) -> None:
    """publish_many on a cluster sends each batch as a call of its own: a stream's later batches in the pipeline are
    marked as following (publish.lua's '2') and appended after the one before, each once when sent again."""
    from unilog.engine import RedisStreams, connect

    def rows(*ns: int) -> list[tuple[str, str, str, int, str | None]]:
        return [(f'{{"n":{n}}}', "a", "o", 1_700_000_000_000 + n, None) for n in ns]

    api = RedisStreams(connect(cluster.cluster_url))
    name = f"follows-{uuid.uuid4().hex[:8]}"
    try:
        batches = [(name, 1, rows(1, 2)), (f"{name}-b", 1, rows(1)), (name, 3, rows(3)), (name, 4, rows(4, 5))]
        results = api.publish_many(batches, "p1", 1)
        assert [r.appended for r in results] == [2, 1, 1, 2]
        results = api.publish_many(batches, "p1", 1)
        assert [(r.appended, r.skipped) for r in results] == [(0, 2), (0, 1), (0, 1), (0, 2)]
        assert [int(f[b"seq"]) for _, f in api.client.xrange(name)] == [1, 2, 3, 4, 5]
    finally:
        api.close()


def test_gaps_found_before_a_refused_call_are_logged_from_its_node_and_the_nodes_before(
    cluster: EmbeddedRedisCluster,
) -> None:
    """A batch across streams on a cluster, a call per stream in one pipeline per node, node after node: the streams
    sent first find positions Redis lost (a gap), on the nodes before and on the node whose later call is refused
    (here a stale epoch). Every gap is logged before the batch fails (its re-send finds none: Redis appended past
    it); before, the refusal was raised at once and every reply read before it dropped."""
    from structlog.testing import capture_logs

    from unilog.engine import RedisStreams, connect
    from unilog.errors import PublishError
    from unilog.store import ProducerIdentity
    from unilog.stream import sending
    from unilog.wire import pack_rows

    def rows(*ns: int) -> Any:
        return pack_rows([(f'{{"n":{n}}}', "a", "o", 1_700_000_000_000 + n, None) for n in ns])

    api = RedisStreams(connect(cluster.cluster_url))
    tag = uuid.uuid4().hex[:8]
    bad = f"stale-{tag}"
    identity = ProducerIdentity("p-gaps", 1)
    try:
        node = api._pool(bad)  # streams on bad's node (its pipeline, bad's call last) and on the others (sent before)
        candidates = [f"gap-{tag}-{k}" for k in range(200)]
        others = [n for n in candidates if api._pool(n) is not node][:4]
        names = others + [n for n in candidates if api._pool(n) is node][:4]
        api.publish(bad, "p-gaps", 2, 1, rows(1))  # at epoch 2: a batch at epoch 1 is refused
        sending.send_many(api, [(n, 1, rows(1, 2)) for n in names], identity, 0, 1000)
        with capture_logs() as logs, pytest.raises(PublishError, match="UNILOG_STALE_EPOCH"):
            sending.send_many(api, [*[(n, 6, rows(6)) for n in names], (bad, 2, rows(2))], identity, 0, 1000)
    finally:
        api.close()
    gaps = [e for e in logs if "missing confirmed positions" in e["event"]]
    assert [(e["streams"], e["high_water"], e["first_seq"]) for e in gaps] == [(8, 2, 6)], logs


def test_a_string_at_one_of_many_streams_is_named_on_a_cluster(cluster: EmbeddedRedisCluster) -> None:
    """A batch across streams on a cluster, one stream's key holding a string: the refused call's stream is named,
    as a batch of that stream alone is (exit 3 from the streamer), not a retried "did not confirm"."""
    from unilog.engine import RedisStreams, connect
    from unilog.errors import WrongKeyType
    from unilog.store import ProducerIdentity
    from unilog.stream import sending
    from unilog.wire import pack_rows

    api = RedisStreams(connect(cluster.cluster_url))
    names = [f"typed-{uuid.uuid4().hex[:8]}-{k}" for k in range(12)]
    try:
        api.client.set(names[7], "another application's value")
        batches = [(n, 1, pack_rows([('{"n":1}', "a", "o", 1_700_000_000_000, None)])) for n in names]
        with pytest.raises(WrongKeyType, match=f"the Redis key '{names[7]}' holds a string, not a stream"):
            sending.send_many(api, batches, ProducerIdentity("p-typed", 1), 0, 1000)
    finally:
        api.close()


def test_bulk_pages_read_the_same_from_a_cluster(cluster: EmbeddedRedisCluster) -> None:
    """The Spark source's reader: a cluster client's nodes parse XRANGE their own way; the pages come out alike."""
    from unilog import engine
    from unilog.engine.bulk import raw_pages

    api = engine.RedisStreams(engine.connect(cluster.cluster_url))
    try:
        api.publish("bulk", "p", 1, 1, [("{}", "a", "o", 1, None)] * 3)
    finally:
        api.close()
    (page,) = list(raw_pages(cluster.cluster_url, "bulk", "0-0", "+", 10))
    assert [fields[fields.index(b"seq") + 1] for _, fields in page] == [b"1", b"2", b"3"]


def test_dead_letters_wait_for_a_replica_of_their_slots_master_by_default(cluster: EmbeddedRedisCluster) -> None:
    """Both faces, both kinds of letter, on streams spread over the masters: ``WAIT`` goes to the node that owns the
    dead-letter stream's slot, on the connection that wrote the letter, and counts its replica (a keyless ``WAIT``
    sent through the cluster client would go to every master)."""
    import asyncio

    from unilog import engine
    from unilog.engine.aio import AsyncRedisStreams, connect_async

    prefix = f"letters{uuid.uuid4().hex[:6]}"
    streams = [f"{prefix}.p{i}" for i in range(4)]
    i = 4
    while len({cluster.master_of(s).port for s in streams}) < 2:  # random names can all hash to one master
        streams[-1], i = f"{prefix}.p{i}", i + 1
    assert len({cluster.master_of(s).port for s in streams}) > 1, "spread over the masters"
    api = engine.RedisStreams(engine.connect(cluster.cluster_url))
    written = []
    try:
        for stream in streams:
            eid = api.client.xadd(stream, {"data": "1"})
            api.ensure_group(stream, "g")
            api.read_group(stream, "g", "w", 10, None)
            written.append(
                api.dead_letter_entry(stream, eid, {b"data": b"1"}, error="e", consumer="c", wait_replicas=None)
            )
            written.append(
                api.dead_letter(stream, "g", eid, {}, error="e", consumer="w", attempts=1, wait_replicas=None)
            )
            assert api.client.xpending(stream, "g")["pending"] == 0, "acknowledged in the letter's MULTI"
    finally:
        api.close()

    async def both_kinds(stream: str) -> list[Any]:
        aapi = AsyncRedisStreams(connect_async(cluster.cluster_url))
        try:
            eid = await aapi.client.xadd(stream, {"data": "1"})
            await aapi.ensure_group(stream, "g")
            await aapi.read_group(stream, "g", "w", 10, None)
            entry = await aapi.dead_letter_entry(stream, eid, {}, error="e", consumer="c", wait_replicas=None)
            group = await aapi.dead_letter(
                stream, "g", eid, {}, error="e", consumer="w", attempts=1, wait_replicas=None
            )
            return [entry, group]
        finally:
            await aapi.aclose()

    for stream in streams:
        written += asyncio.run(both_kinds(stream + "a"))
    assert [(w.replicas, w.wanted) for w in written] == [(1, 1)] * 16
    client = redis.RedisCluster.from_url(cluster.url)
    try:
        assert sum(client.xlen(dlq_key(s)) for s in streams + [s + "a" for s in streams]) == 16
    finally:
        client.close()


def test_a_consumer_over_several_streams_reads_streams_of_every_master(
    cluster: EmbeddedRedisCluster, settings: Settings, pg: Any
) -> None:
    """Streams of different slots share no ``XREAD``: a ``MultiConsumer`` pipelines one per stream (redis-py sends
    each master its own), finds a prefix's streams on every master, and applies each once, in stream order; a group
    over them reads and acknowledges on every master."""
    from handlers import MULTI_DDL, multi_applied

    from unilog import ConsumerConfig, MultiConsumer, Streamer, emit_many

    here = Settings(database_url=settings.database_url, redis_url=cluster.url.replace("redis://", "redis+cluster://"))
    tag = uuid.uuid4().hex[:6]
    names = [f"mc{tag}-{i}" for i in range(12)]
    with psycopg.connect(settings.conninfo) as conn:
        emit_many(
            conn, [{"action": "a", "object": "o", "data": {"i": i}, "stream": s} for i in range(3) for s in names]
        )
    with Streamer(here) as streamer:
        streamer.drain()
    assert len({cluster.master_of(name).port for name in names}) >= 2, "the streams live on different masters"
    pg.execute(MULTI_DDL)
    config = ConsumerConfig(name="mc", stream_prefix=f"mc{tag}-", block_ms=100, batch_size=20)
    with MultiConsumer(here, config, multi_applied) as consumer:
        assert consumer.drain() == 36
        started = time.monotonic()
        assert consumer.run_once().read == 0, "nothing more"
        assert time.monotonic() - started >= 0.09, "an idle read waits its block_ms, polling"
        assert len(consumer.lanes) == 12
    seen: dict[str, list[int]] = {}
    for stream, i in pg.execute("SELECT stream, i FROM multi_applied ORDER BY id").fetchall():
        seen.setdefault(stream, []).append(i)
    assert seen == {name: [0, 1, 2] for name in names}
    # a group over the same streams: one XREADGROUP per stream in a pipeline, acknowledged on every master
    from unilog import GroupConfig, GroupConsumer

    group = GroupConfig(group="gc", stream_prefix=f"mc{tag}-", block_ms=100, batch_size=20)
    with GroupConsumer(here, group, multi_applied) as worker:
        assert worker.drain() == 36
        started = time.monotonic()
        assert worker.run_once().read == 0, "nothing more"
        assert time.monotonic() - started >= 0.09, "an idle read waits its block_ms, polling"
    client = redis.RedisCluster.from_url(cluster.url)
    try:
        assert [client.xpending(name, "gc")["pending"] for name in names] == [0] * 12
    finally:
        client.close()
    assert pg.execute("SELECT count(DISTINCT (stream, i)), count(*) FROM multi_applied").fetchone() == (36, 72)
