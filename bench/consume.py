"""``consume``: records/s through a checkpoint consumer over a pre-filled stream.

The stream is filled once by unilog's streamer (so its entries carry positions); every trial starts with no
checkpoint and reads it from the beginning to the end, in a fresh process, connections opened before the clock.

* ``unilog``: ``Consumer.drain()`` with a trivial handler (counts the records);
* ``unilog-distance``: the reference's work in a unilog handler (decode each record, add its distance, one
  ``UPDATE`` of a state row per batch);
* ``unilog-group``: one worker of a consumer group (``XREADGROUP``, processed identities recorded in the effect's
  transaction, ``XACK`` after commit) with the trivial handler; the group is created afresh for every trial;
* ``unilog-async`` and ``unilog-async-distance``: the same two handlers as ``async def`` on a psycopg
  ``AsyncConnection``, through ``AsyncConsumer.drain()`` in an asyncio loop;
* ``reference``: the port of the reference consumer (the same work, its own checkpoint table).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from unilog import AsyncConsumer, Consumer, ConsumerConfig, Record, Streamer
from unilog.consume.group import GroupConfig, GroupConsumer
from unilog.wire import registry_key

from .core import Profile, Results, in_fresh_process, interleaved, log
from .env import BenchEnv, Urls
from .handlers import count_records
from .reference import ReferenceConsumer

VARIANTS = ("unilog", "unilog-distance", "unilog-async", "unilog-async-distance", "unilog-group", "reference")
NAME = "bench-consume"
GROUP = "bench-consume-group"


def distance_handler(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
    total = sum(r.data["distance"] for r in records)
    conn.execute(DISTANCE_SQL, (NAME, total, len(records)))


DISTANCE_SQL = (
    "INSERT INTO bench_state (name, total_distance, n) VALUES (%s, %s, %s) ON CONFLICT (name) DO UPDATE "
    "SET total_distance = bench_state.total_distance + excluded.total_distance, n = bench_state.n + excluded.n"
)


async def async_distance_handler(conn: psycopg.AsyncConnection[Any], records: Sequence[Record]) -> None:
    total = sum(r.data["distance"] for r in records)
    await conn.execute(DISTANCE_SQL, (NAME, total, len(records)))


async def async_count_records(conn: psycopg.AsyncConnection[Any], records: Sequence[Record]) -> None:
    count_records(conn, records)  # type: ignore[arg-type]  # it only counts


def _async(urls: Urls, distance: bool) -> tuple[int, float]:
    handler = async_distance_handler if distance else async_count_records

    async def main() -> tuple[int, float]:
        async with AsyncConsumer(urls.settings(), ConsumerConfig(name=NAME), handler) as consumer:
            await consumer.connect()
            started = time.perf_counter()
            count = await consumer.drain()
            return count, time.perf_counter() - started

    return asyncio.run(main())


def _unilog(urls: Urls, distance: bool) -> tuple[int, float]:
    handler = distance_handler if distance else count_records
    with Consumer(urls.settings(), ConsumerConfig(name=NAME), handler) as consumer:
        consumer.connect()
        started = time.perf_counter()
        count = consumer.drain()
        return count, time.perf_counter() - started


def _group(urls: Urls) -> tuple[int, float]:
    config = GroupConfig(group=GROUP, worker="w0", batch_size=1000)
    with GroupConsumer(urls.settings(), config, count_records) as worker:
        worker.connect()
        started = time.perf_counter()
        count = worker.drain()
        return count, time.perf_counter() - started


def _reference(urls: Urls) -> tuple[int, float]:
    consumer = ReferenceConsumer(urls.database, urls.redis, urls.stream, NAME)
    consumer.conn.execute("SELECT 1")
    consumer.conn.rollback()
    consumer.redis.ping()
    started = time.perf_counter()
    count = consumer.drain()
    elapsed = time.perf_counter() - started
    consumer.close()
    return count, elapsed


def _run_variant(urls: Urls, variant: str) -> tuple[int, float]:
    if variant == "reference":
        return _reference(urls)
    if variant == "unilog-group":
        return _group(urls)
    if variant.startswith("unilog-async"):
        return _async(urls, distance=variant.endswith("distance"))
    return _unilog(urls, distance=variant == "unilog-distance")


def _prefill(urls: Urls) -> int:
    with Streamer(urls.settings()) as streamer:
        return streamer.drain()


def _total(env: BenchEnv, variant: str) -> float | None:
    query = (
        "SELECT total_distance FROM ref_consumer_states WHERE name = %s"
        if variant == "reference"
        else "SELECT total_distance FROM bench_state WHERE name = %s"
    )
    row = env.admin.execute(query, (NAME,)).fetchone()
    return None if row is None else round(float(row[0]), 3)


def consume_trial(env: BenchEnv, variant: str, size: int) -> tuple[dict[str, float], dict[str, Any]]:
    env.reset(keep_redis=True)
    env.rds.delete(registry_key(env.urls.stream))
    if env.rds.exists(env.urls.stream):
        env.rds.xgroup_destroy(env.urls.stream, GROUP)  # 0 if absent
    env.admin.execute("TRUNCATE unilog_processed, unilog_group_watermarks")
    count, elapsed = in_fresh_process(_run_variant, env.urls, variant)
    if count != size:
        log(f"  WARNING consume {variant}: handled {count} of {size}")
    return {"records/s": count / elapsed, "seconds": elapsed}, {"count": count, "total_distance": _total(env, variant)}


def run_consume(env: BenchEnv, profile: Profile, results: Results) -> None:
    size = profile.consume_size
    log(f"consume: filling the stream with {size:,} records (unilog streamer)")
    env.reset()
    env.stage(size)
    filled = in_fresh_process(_prefill, env.urls)
    if filled != size or env.xlen(env.urls.stream) != size:
        log(f"  WARNING consume: stream has {env.xlen(env.urls.stream)} entries, streamed {filled}, staged {size}")
    env.compact_aof()
    log(f"consume: {profile.consume_reps} rounds of {', '.join(VARIANTS)}")
    interleaved(
        results,
        "consume",
        f"{size:,} entries",
        VARIANTS,
        profile.consume_reps,
        lambda v: consume_trial(env, v, size),
    )
