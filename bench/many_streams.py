"""``many_streams`` (issue 46): one backlog spread over 1, 2, 10, 100, 1,000 and 10,000 streams (two: ``orders`` and
``payments`` side by side), drained by one streamer in burst mode (what ``unilog streamer --once`` runs), in table and
in WAL capture mode. Compare each count's rate with one stream's, of the same mode and the same run: the drain's cost
should follow the records, not the streams.

The full run adds a Redis Cluster of three shards (table mode, 1 and 1,000 streams): the streams land in every
shard's slots, and a batch's script calls go to each node in one pipelined round trip.

Each trial starts from empty tables and Redis, stages the backlog as producers emitting in transactions of 1,000
(round-robin over the streams; in WAL mode after ``unilog capture wal``), then times the drain alone in a fresh
process. A trial whose drain fails (a deadline, any error) is recorded with its error, not retried: a deadline break
is what this workload looks for.
"""

from __future__ import annotations

import time
from typing import Any

import redis

from unilog import Streamer, StreamerConfig
from unilog.harness.embedded import EmbeddedRedisCluster
from unilog.stream.modes import disable_wal, enable_wal

from .core import QUICK, Profile, Results, in_fresh_process, interleaved, log
from .env import BenchEnv, Urls

COUNTS = (1, 2, 10, 100, 1_000, 10_000)
QUICK_COUNTS = (1, 1_000)
SIZE, QUICK_SIZE = 50_000, 10_000


def _drain(urls: Urls) -> tuple[int, float, str | None]:
    """The streamer's burst mode with its default configuration (a 30 s deadline per pass included)."""
    with Streamer(urls.settings(), StreamerConfig()) as streamer:
        streamer.connect()
        started = time.perf_counter()
        try:
            count = streamer.drain()
        except Exception as exc:  # recorded: a deadline break is a result here
            return 0, time.perf_counter() - started, f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        return count, time.perf_counter() - started, None


def many_streams_trial(
    env: BenchEnv, variant: str, size: int, cluster: EmbeddedRedisCluster | None = None
) -> tuple[dict[str, float], dict[str, Any]]:
    mode, count = variant.split()[0], int(variant.split()[1].replace(",", ""))
    urls = env.urls
    if mode == "cluster":
        assert cluster is not None
        env.reset(keep_redis=True)
        for node in cluster.nodes:
            client = redis.Redis(host="127.0.0.1", port=node.port)
            client.flushall()
            client.close()
        urls = Urls(env.urls.database, cluster.cluster_url, env.urls.stream)
    else:
        env.reset()
    names = [f"rides-{k:05d}" for k in range(count)]
    if mode == "wal":
        enable_wal(env.urls.settings())
    try:
        env.stage(size, names)
        published, elapsed, error = in_fresh_process(_drain, urls)
    finally:
        if mode == "wal":
            disable_wal(env.urls.settings())
    notes: dict[str, Any] = {"count": published, "staged_after": env.staged(), "error": error}
    notes["ok"] = error is None and published == size and notes["staged_after"] == 0
    if not notes["ok"]:
        log(f"  WARNING many_streams {variant}: expected {size}, got {notes}")
    return {"records/s": published / max(elapsed, 1e-9), "seconds": elapsed}, notes


def variants(counts: tuple[int, ...]) -> tuple[str, ...]:
    """``table 1``, ``table 1,000``, ... then the same in ``wal`` mode."""
    return tuple(f"{mode} {count:,} stream{'s' if count > 1 else ''}" for mode in ("table", "wal") for count in counts)


def run_many_streams(env: BenchEnv, profile: Profile, results: Results) -> None:
    quick = profile.name == QUICK.name
    size, counts = (QUICK_SIZE, QUICK_COUNTS) if quick else (SIZE, COUNTS)
    names = variants(counts)
    log(f"many_streams: {size:,} records over {', '.join(f'{c:,}' for c in counts)} streams, table and WAL mode")
    reps = 1 if quick else 3  # one round's ratio swings by half on this machine: the paired median of three
    trial = lambda v: many_streams_trial(env, v, size)  # noqa: E731
    interleaved(results, "many_streams", f"{size:,} records", names, reps, trial)
    if quick:
        return
    cluster = EmbeddedRedisCluster(masters=3, replicas=0).start()
    try:
        clustered = ("cluster 1 stream", "cluster 1,000 streams")
        log(f"many_streams: {size:,} records over 1 and 1,000 streams, table mode, a Redis Cluster of 3 shards")
        interleaved(
            results,
            "many_streams",
            f"{size:,} records, Redis Cluster",
            clustered,
            reps,
            lambda v: many_streams_trial(env, v, size, cluster),
        )
    finally:
        cluster.stop(cleanup=True)
