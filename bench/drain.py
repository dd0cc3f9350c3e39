"""``drain`` and ``drain_streams``: how fast a staged backlog moves from Postgres into Redis.

Each trial starts from empty tables and an empty Redis, stages the backlog in one statement, VACUUM ANALYZEs and
CHECKPOINTs, then times the drain alone (connections are opened before the clock starts) in a fresh process.

* ``unilog``: the streamer as configured by default; ``unilog-b1000``: with the reference's batch of 1000;
* ``unilog-wal``: the streamer in WAL capture mode (``unilog capture wal`` before the backlog is staged): the backlog
  is read from the logical slot, its rows deleted by id;
* ``reference``: the reference streamer's algorithm (bench/reference.py), its backlog bug fixed;
* ``pg_only``: the reference's select and delete alone (no Redis): what Postgres does per session;
* ``redis_only``: pipelined ``XADD stream * data <json>`` of the same payloads from memory (no Postgres);
* ``redis_script``: unilog's Redis half alone: its publish script over the same payloads, already encoded, in
  batches of the default size, with positions and every metadata field (no Postgres).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import redis

from unilog import Streamer, StreamerConfig, engine
from unilog.stream.modes import disable_wal, enable_wal

from .core import SPAWN, Profile, Results, in_fresh_process, interleaved, log, worker_init
from .env import BenchEnv, Urls, payload
from .reference import PgOnlyDrainer, ReferenceStreamer

DRAIN_VARIANTS = ("unilog", "unilog-wal", "unilog-b1000", "reference", "pg_only", "redis_only", "redis_script")
SIDE = ("unilog-b1000", "redis_only", "redis_script")  # read by informational ratios only (Profile.side_variants)
REF_STREAM = "ref-rides"
REDIS_ONLY_STREAM = "redis-only"
REDIS_SCRIPT_STREAM = "redis-script"
PIPELINE = 1000


def _unilog(urls: Urls, batch_size: int | None) -> tuple[int, float]:
    """The streamer with its default configuration, or with ``batch_size`` (the reference's is 1000)."""
    config = StreamerConfig() if batch_size is None else StreamerConfig(batch_size=batch_size)
    with Streamer(urls.settings(), config) as streamer:
        streamer.connect()
        started = time.perf_counter()
        count = streamer.drain()
        return count, time.perf_counter() - started


def _reference(urls: Urls) -> tuple[int, float]:
    streamer = ReferenceStreamer(urls.database, urls.redis, REF_STREAM)
    streamer.conn.execute("SELECT 1")
    streamer.conn.rollback()
    streamer.redis.ping()
    started = time.perf_counter()
    count = streamer.drain()
    elapsed = time.perf_counter() - started
    streamer.close()
    return count, elapsed


def _pg_only(urls: Urls) -> tuple[int, float]:
    drainer = PgOnlyDrainer(urls.database)
    drainer.conn.execute("SELECT 1")
    drainer.conn.rollback()
    started = time.perf_counter()
    count = drainer.drain()
    elapsed = time.perf_counter() - started
    drainer.close()
    return count, elapsed


def _redis_only(urls: Urls, size: int) -> tuple[int, float]:
    """The same payloads, from memory, as pipelined ``XADD stream * data <json>`` (no transaction), 1000 a round."""
    payloads = [payload(i) for i in range(1, size + 1)]
    client = redis.Redis.from_url(urls.redis)
    client.ping()
    started = time.perf_counter()
    for lo in range(0, size, PIPELINE):
        pipe = client.pipeline(transaction=False)
        for data in payloads[lo : lo + PIPELINE]:
            pipe.xadd(REDIS_ONLY_STREAM, {"data": data})
        pipe.execute()
    elapsed = time.perf_counter() - started
    client.close()
    return size, elapsed


def _redis_script(urls: Urls, size: int) -> tuple[int, float]:
    """unilog's Redis half alone: the same payloads, already encoded, appended by the streamer's publish script in
    batches of the streamer's default size (positions, deduplication, every metadata field), no Postgres."""
    batch = StreamerConfig().batch_size
    rows = [(payload(i), "create", "ride", 1_700_000_000_000 + i, None) for i in range(1, size + 1)]
    packed = [engine.pack_rows(rows[lo : lo + batch]) for lo in range(0, size, batch)]
    api = engine.RedisStreams(engine.connect(urls.redis))
    api.client.ping()
    started = time.perf_counter()
    first = 1
    for chunk in packed:
        api.publish(REDIS_SCRIPT_STREAM, "bench-producer", 1, first, chunk)
        first += chunk.count
    elapsed = time.perf_counter() - started
    api.close()
    return size, elapsed


def _run_variant(urls: Urls, variant: str, size: int) -> tuple[int, float]:
    if variant in ("unilog", "unilog-wal"):
        return _unilog(urls, None)
    if variant == "unilog-b1000":
        return _unilog(urls, 1000)
    if variant == "reference":
        return _reference(urls)
    if variant == "pg_only":
        return _pg_only(urls)
    if variant == "redis_only":
        return _redis_only(urls, size)
    if variant == "redis_script":
        return _redis_script(urls, size)
    raise ValueError(variant)


def _expected_stream(env: BenchEnv, variant: str) -> str | None:
    streams = {"reference": REF_STREAM, "redis_only": REDIS_ONLY_STREAM, "redis_script": REDIS_SCRIPT_STREAM}
    return streams.get(variant, env.urls.stream) if variant != "pg_only" else None


def drain_trial(env: BenchEnv, variant: str, size: int) -> tuple[dict[str, float], dict[str, Any]]:
    env.reset()
    if variant == "unilog-wal":
        enable_wal(env.urls.settings())
    if not variant.startswith("redis_"):
        env.stage(size)
    try:
        count, elapsed = in_fresh_process(_run_variant, env.urls, variant, size)
    finally:
        if variant == "unilog-wal":
            disable_wal(env.urls.settings())
    stream = _expected_stream(env, variant)
    notes = {"count": count, "staged_after": env.staged(), "xlen": env.xlen(stream) if stream else 0}
    ok = count == size and notes["staged_after"] == 0 and (stream is None or notes["xlen"] == size)
    if not ok:
        log(f"  WARNING drain {variant}: expected {size}, got {notes}")
    notes["ok"] = ok
    return {"records/s": size / elapsed, "seconds": elapsed}, notes


def run_drain(env: BenchEnv, profile: Profile, results: Results) -> None:
    for size in profile.drain_sizes:
        variants = DRAIN_VARIANTS if profile.side_variants else tuple(v for v in DRAIN_VARIANTS if v not in SIDE)
        log(f"drain: {size:,} records, {profile.drain_reps} rounds of {', '.join(variants)}")
        interleaved(
            results,
            "drain",
            f"{size:,} records",
            variants,
            profile.drain_reps,
            lambda v, size=size: drain_trial(env, v, size),  # type: ignore[misc]
            core=("unilog", "reference", "pg_only"),
            side_reps=profile.side_reps,
        )


# -- drain_streams: one streamer process per stream ------------------------------------------------------------------


def _stream_worker(urls: Urls, stream: str, barrier: Any, out: Any) -> None:
    worker_init()
    try:
        with Streamer(urls.settings(), StreamerConfig(streams=(stream,)), name=f"bench-{stream}") as streamer:
            streamer.connect()
            barrier.wait()
            count = streamer.drain()
        out.put((stream, count, time.monotonic(), None))
    except BaseException as exc:  # said to the parent, which would otherwise wait for this stream's result
        barrier.abort()  # a parent still at the barrier stops waiting
        out.put((stream, 0, time.monotonic(), f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"))


def streams_trial(env: BenchEnv, n_streams: int, size: int) -> tuple[dict[str, float], dict[str, Any]]:
    """One trial; a streamer that fails (a deadline on a loaded machine: burst mode stops at a lost connection) is
    logged and the trial run again once, never waited for."""
    for attempt in (1, 2):
        result, notes, errors = _streams_attempt(env, n_streams, size)
        if not errors:
            return result, notes
        log(f"  WARNING drain_streams {n_streams}: attempt {attempt} failed: {'; '.join(errors)}")
    return result, {**notes, "ok": False, "errors": errors}


def _streams_attempt(env: BenchEnv, n_streams: int, size: int) -> tuple[dict[str, float], dict[str, Any], list[str]]:
    env.reset()
    names = [f"rides-{k}" for k in range(n_streams)]
    env.stage(size, names)
    barrier, out = SPAWN.Barrier(n_streams + 1), SPAWN.Queue()
    procs = [SPAWN.Process(target=_stream_worker, args=(env.urls, s, barrier, out)) for s in names]
    for p in procs:
        p.start()
    with contextlib.suppress(threading.BrokenBarrierError):  # a worker failed before it: its result says why
        barrier.wait(timeout=120)
    started = time.monotonic()
    done = [out.get(timeout=900) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    errors = [f"{s}: {error}" for s, _, _, error in done if error]
    elapsed = max(end for _, _, end, _ in done) - started
    counts = {s: c for s, c, _, _ in done}
    total = sum(counts.values())
    ok = not errors and total == size and env.staged() == 0 and sum(env.xlen(s) for s in names) == size
    if not ok and not errors:
        log(f"  WARNING drain_streams {n_streams}: expected {size}, got {counts}")
    return {"records/s": total / max(elapsed, 1e-9), "seconds": elapsed}, {"counts": counts, "ok": ok}, errors


def run_drain_streams(env: BenchEnv, profile: Profile, results: Results) -> None:
    size = profile.streams_size
    log(f"drain_streams: {size:,} records over 1, 2, 4 streams, {profile.streams_reps} rounds")
    interleaved(
        results,
        "drain_streams",
        f"{size:,} records",
        ("1 stream", "2 streams", "4 streams"),
        profile.streams_reps,
        lambda v: streams_trial(env, int(v.split()[0]), size),
    )
