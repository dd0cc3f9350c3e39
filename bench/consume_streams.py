"""``consume_streams`` (issue 46): one checkpoint consumer over 1, 10 and 1,000 streams, the same number of records
in all. Compare each count's rate with one stream's, of the same run: ``MultiConsumer`` saves a checkpoint row per
stream a batch touches, so its cost grows with the streams a batch spans, not with the streams it reads.

The backlog of each count is staged (round-robin over its streams) and published by unilog's streamer once; every
trial starts with no checkpoint and drains it from the beginning, in a fresh process, connections opened before the
clock, with a trivial handler (counts the records). ``Consumer`` over the one stream runs beside, as the baseline
of the single-stream consumer. A group worker (``GroupConsumer``, a new group each trial) over the same streams
runs beside: one ``XREADGROUP`` over them all, identities claimed stream by stream in each batch's transaction.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from unilog import Consumer, ConsumerConfig, GroupConfig, GroupConsumer, MultiConsumer, Streamer

from .core import QUICK, Profile, Results, in_fresh_process, interleaved, log
from .env import BenchEnv, Urls
from .handlers import count_records

COUNTS = (1, 10, 1_000)
SIZE, QUICK_SIZE = 50_000, 10_000


def _names(count: int) -> list[str]:
    return [f"cs{count}-{k:04d}" for k in range(count)]


def _prefill(urls: Urls) -> int:
    with Streamer(urls.settings()) as streamer:
        return streamer.drain()


def _drain(urls: Urls, variant: str) -> tuple[int, float]:
    count = int(variant.split()[1].replace(",", ""))
    names = _names(count)
    if variant.startswith("Consumer"):
        worker: Any = Consumer(urls.settings(), ConsumerConfig(name="bench-cs", stream=names[0]), count_records)
    elif variant.startswith("GroupConsumer"):  # a new group: it starts at the streams' beginning
        group = GroupConfig(group=f"bench-g{uuid.uuid4().hex[:8]}", streams=tuple(names), batch_size=1000)
        worker = GroupConsumer(urls.settings(), group, count_records)
    else:
        worker = MultiConsumer(urls.settings(), ConsumerConfig(name="bench-cs", streams=tuple(names)), count_records)
    with worker:
        worker.connect()
        started = time.perf_counter()
        handled = worker.drain()
        return handled, time.perf_counter() - started


def trial(env: BenchEnv, variant: str, size: int) -> tuple[dict[str, float], dict[str, Any]]:
    env.admin.execute("TRUNCATE unilog_checkpoints, unilog_held_letters, unilog_processed, unilog_group_watermarks")
    handled, elapsed = in_fresh_process(_drain, env.urls, variant)
    if handled != size:
        log(f"  WARNING consume_streams {variant}: handled {handled} of {size}")
    return {"records/s": handled / max(elapsed, 1e-9), "seconds": elapsed}, {"count": handled}


def variants() -> tuple[str, ...]:
    counts = [f"{c:,} stream{'s' if c > 1 else ''}" for c in COUNTS]
    return ("Consumer 1 stream", *(f"MultiConsumer {c}" for c in counts), *(f"GroupConsumer {c}" for c in counts))


def run_consume_streams(env: BenchEnv, profile: Profile, results: Results) -> None:
    size = QUICK_SIZE if profile.name == QUICK.name else SIZE
    log(f"consume_streams: {size:,} records over {', '.join(f'{c:,}' for c in COUNTS)} streams, one consumer")
    env.reset()
    for count in COUNTS:
        env.stage(size, _names(count))
        published = in_fresh_process(_prefill, env.urls)
        if published != size:
            log(f"  WARNING consume_streams: published {published} of {size} over {count} streams")
    env.compact_aof()
    interleaved(
        results, "consume_streams", f"{size:,} records", variants(), profile.consume_reps, lambda v: trial(env, v, size)
    )
