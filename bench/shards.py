"""``shards``: a partitioned stream (6 partitions) drained into a Redis Cluster of 1 shard and of 3 shards, then
consumed by a partition worker, in one run; with the CPU seconds each Redis node used.

Both clusters have no replicas and the same durability as the other workloads (AOF, fsync always). On a machine
with few cores the three shards compete with Postgres and the streamer for the same CPUs: the figure to read is the
CPU each shard used, which says what more cores would allow.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis

from unilog import PartitionConfig, PartitionedConsumer, Streamer, engine
from unilog.harness.embedded import EmbeddedRedisCluster

from .core import Profile, Results, in_fresh_process, interleaved, log
from .env import BenchEnv, Urls
from .handlers import count_records

VARIANTS = ("1 shard", "3 shards")
STREAM = "bench-shards"
PARTITIONS = 6


def _cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _drain(urls: Urls) -> tuple[int, float]:
    with Streamer(urls.settings()) as streamer:
        streamer.connect()
        started = time.perf_counter()
        count = streamer.drain()
        return count, time.perf_counter() - started


def _consume(urls: Urls) -> tuple[int, float]:
    config = PartitionConfig(name="bench-shards", worker="w0", batch_size=1000)
    with PartitionedConsumer(urls.settings(), config, count_records) as worker:
        worker.connect()
        started = time.perf_counter()
        count = worker.drain()
        return count, time.perf_counter() - started


def _reset(env: BenchEnv, cluster: EmbeddedRedisCluster) -> None:
    env.reset(keep_redis=True)
    for node in cluster.nodes:
        client = redis.Redis(host="127.0.0.1", port=node.port)
        client.flushall()
        client.close()
    api = engine.RedisStreams(engine.connect(cluster.cluster_url))
    api.set_partitions(STREAM, PARTITIONS)
    api.close()


def trial(
    env: BenchEnv, clusters: dict[str, EmbeddedRedisCluster], variant: str, size: int
) -> tuple[dict[str, float], dict[str, Any]]:
    cluster = clusters[variant]
    _reset(env, cluster)
    env.stage(size, [STREAM])
    urls = Urls(env.urls.database, cluster.cluster_url, STREAM)
    cpu = [_cpu_seconds(n.pid) for n in cluster.nodes]
    count, drained = in_fresh_process(_drain, urls)
    after = [_cpu_seconds(n.pid) for n in cluster.nodes]
    consumed, consumed_s = in_fresh_process(_consume, urls)
    notes: dict[str, Any] = {
        "drained": count,
        "consumed": consumed,
        "redis_cpu_s_per_shard": [round(b - a, 3) for a, b in zip(cpu, after, strict=True)],
    }
    if count != size or consumed != size:
        log(f"  WARNING shards {variant}: drained {count}, consumed {consumed} of {size}")
    metrics = {"drain records/s": size / drained, "consume records/s": consumed / consumed_s}
    return metrics, notes


def run_shards(env: BenchEnv, profile: Profile, results: Results) -> None:
    size = profile.drain_sizes[0]
    clusters = {
        "1 shard": EmbeddedRedisCluster(masters=1, replicas=0).start(),
        "3 shards": EmbeddedRedisCluster(masters=3, replicas=0).start(),
    }
    try:
        reps = profile.shards_reps or profile.drain_reps
        log(f"shards: {size:,} records over {PARTITIONS} partitions, {reps} rounds of {VARIANTS}")
        interleaved(
            results,
            "shards",
            f"{size:,} records",
            VARIANTS,
            reps,
            lambda v: trial(env, clusters, v, size),
        )
    finally:
        for cluster in clusters.values():
            cluster.stop(cleanup=True)
