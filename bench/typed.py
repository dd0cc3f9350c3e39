"""``typed``: what record contracts (issue 37) cost, each against the same data untyped, on the same servers.

* ``typed-emit``: one process, one connection, transactions of ``typed_per_tx`` records, for ``typed_slice_seconds``
  per variant, the variants in turn round after round (so the per-round ratio cancels the machine's drift); the
  staged table is emptied before each round. Variants: ``dict`` (``emit(conn, action=, object=, data={...}, key=)``
  per record), ``typed`` (``emit(conn, BenchRide(...))`` per record), and both through ``emit_many`` (one call per
  transaction). The instances and dicts are made before the clock (a pool of 1,000 of each, the same values):
  emit is measured, not the application building its model.
* ``typed-consume``: one stream of typed records (staged by ``emit_many``, streamed by unilog's streamer), read from
  the start by a checkpoint consumer in a fresh process per trial: ``untyped`` (a handler that reads one field of
  each ``record.data``, the fair baseline: it parses every record's JSON), ``typed`` (a handler annotated
  ``Sequence[BenchRide]``: it gets instances and reads the same field), ``typed, records.typed`` (the untyped handler
  calling ``records.typed(BenchRide)``), ``count only`` (touches nothing: the consumer's own floor). Each process
  runs ``gc.freeze()`` once connected, as ``unilog consume`` does at start (its imports out of the collector's full
  passes); diagnostic: ``untyped, gc not frozen`` and ``typed, gc not frozen``, without it (a consumer embedded in an
  application that never freezes: the typed handler's instances trigger full passes about twice as often). The
  variants no target reads run ``side_reps`` rounds.
* ``typed-drain``: the streamer draining the same backlog staged with and without the record type (the streamer
  never parses ``data``; a typed entry carries one more field, ``type``).
* ``typed-codec`` (bench/codecs.py): per-record microseconds of encoding and decoding the record with pydantic-core
  (unilog's codec) and with msgspec, in one process, no I/O.

The record, ``BenchRide``, and its values are in ``bench/rides.py``, which both this module and the codecs' import.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from unilog import Consumer, ConsumerConfig, Record, Streamer, emit, emit_many
from unilog.wire import registry_key

from .codecs import run_codecs
from .core import Measurement, Profile, Results, in_fresh_process, interleaved, log
from .env import BenchEnv, Urls
from .rides import BenchRide, ride, ride_fields

EMIT_VARIANTS = ("dict", "typed", "dict, emit_many", "typed, emit_many")
CONSUME_VARIANTS = (
    "untyped",
    "typed",
    "typed, records.typed",
    "count only",
    "untyped, gc not frozen",
    "typed, gc not frozen",
)
DRAIN_VARIANTS = ("untyped", "typed")
NAME = "bench-typed"
POOL = 1000
FILL_TRANSACTION = 1000


# -- emit -------------------------------------------------------------------------------------------------------------


def _emit_tx(conn: psycopg.Connection[Any], variant: str, pool: list[Any], start: int, n: int) -> None:
    """One transaction of ``n`` records of ``variant`` from ``pool`` (instances or dicts), committed."""
    items = [pool[(start + k) % POOL] for k in range(n)]
    if variant == "typed":
        for item in items:
            emit(conn, item)
    elif variant == "dict":
        for item in items:
            emit(conn, action="created", object="ride", data=item, key=str(item["ride_id"]))
    elif variant == "typed, emit_many":
        emit_many(conn, items)
    else:
        emit_many(conn, [{"action": "created", "object": "ride", "data": d, "key": str(d["ride_id"])} for d in items])
    conn.commit()


def _emit_rounds(urls: Urls, rounds: int, seconds: float, per_tx: int) -> dict[tuple[int, str], int]:
    """In a fresh process: every variant for ``seconds``, in turn, ``rounds`` times; records staged per slice."""
    pools = {"typed": [ride(i) for i in range(POOL)], "dict": [ride_fields(i) for i in range(POOL)]}
    counts: dict[tuple[int, str], int] = {}
    with psycopg.connect(urls.database) as conn:
        for variant in EMIT_VARIANTS:  # warm up outside the clock (prepared statements, caches)
            _emit_tx(conn, variant, pools[variant.split(",")[0]], 0, per_tx)
        for rnd in range(rounds):
            conn.execute("TRUNCATE staged_log_records")
            conn.commit()
            for variant in EMIT_VARIANTS:
                pool = pools[variant.split(",")[0]]
                end, n = time.monotonic() + seconds, 0
                while time.monotonic() < end:
                    _emit_tx(conn, variant, pool, n, per_tx)
                    n += per_tx
                counts[(rnd, variant)] = n
    return counts


def run_emit(env: BenchEnv, profile: Profile, results: Results) -> None:
    rounds, seconds, per_tx = profile.typed_rounds, profile.typed_slice_seconds, profile.typed_per_tx
    log(f"typed-emit: {rounds} rounds of {EMIT_VARIANTS} x {seconds:g} s, {per_tx} records per transaction")
    env.reset(keep_redis=True)
    env.settle()
    counts = in_fresh_process(_emit_rounds, env.urls, rounds, seconds, per_tx)
    case = f"{per_tx} per transaction"
    for (rnd, variant), n in sorted(counts.items(), key=lambda kv: (kv[0][0], EMIT_VARIANTS.index(kv[0][1]))):
        results.add(Measurement("typed-emit", case, variant, rnd, {"records/s": n / seconds}))
    env.reset(keep_redis=True)


# -- consume ----------------------------------------------------------------------------------------------------------

_seen = 0


def untyped_handler(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
    """The baseline: read one field of each record's data (so each record's JSON is parsed)."""
    global _seen
    _seen += sum(r.data["passengers"] for r in records)


def typed_handler(conn: psycopg.Connection[Any], rides: Sequence[BenchRide]) -> None:
    """Annotated with the type: handed validated instances."""
    global _seen
    _seen += sum(r.passengers for r in rides)


def typed_method_handler(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
    """Untyped annotation, asking the batch for instances."""
    global _seen
    _seen += sum(r.passengers for r in records.typed(BenchRide))  # type: ignore[attr-defined]  # a Batch


def count_handler(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
    global _seen
    _seen += len(records)


HANDLERS = {
    "untyped": untyped_handler,
    "typed": typed_handler,
    "typed, records.typed": typed_method_handler,
    "count only": count_handler,
}
UNFROZEN = ", gc not frozen"


def _consume(urls: Urls, variant: str) -> tuple[int, float, int]:
    with Consumer(urls.settings(), ConsumerConfig(name=NAME), HANDLERS[variant.removesuffix(UNFROZEN)]) as consumer:
        consumer.connect()
        if not variant.endswith(UNFROZEN):
            gc.freeze()  # as `unilog consume` (and consume_main) does at start: its imports out of full collections
        started = time.perf_counter()
        count = consumer.drain()
        return count, time.perf_counter() - started, _seen


def _fill(env: BenchEnv, size: int) -> None:
    """Stage ``size`` typed records as a producer does (emit_many, transactions of 1,000)."""
    with psycopg.connect(env.urls.database) as conn:
        for lo in range(0, size, FILL_TRANSACTION):
            emit_many(conn, [ride(i) for i in range(lo, min(size, lo + FILL_TRANSACTION))])
            conn.commit()
    env.settle()


def _stream_all(urls: Urls) -> int:
    with Streamer(urls.settings()) as streamer:
        return streamer.drain()


def consume_trial(env: BenchEnv, variant: str, size: int) -> tuple[dict[str, float], dict[str, Any]]:
    env.reset(keep_redis=True)
    env.rds.delete(registry_key(env.urls.stream))
    count, elapsed, seen = in_fresh_process(_consume, env.urls, variant)
    expected = size if variant == "count only" else sum(1 + i % 4 for i in range(size))
    if count != size or seen != expected:
        log(f"  WARNING typed-consume {variant}: handled {count} of {size}, checksum {seen} (expected {expected})")
    return {"records/s": count / elapsed, "seconds": elapsed}, {"count": count, "checksum": seen}


def run_consume(env: BenchEnv, profile: Profile, results: Results) -> None:
    size = profile.typed_size
    log(f"typed-consume: filling the stream with {size:,} typed records (emit_many, then unilog's streamer)")
    env.reset()
    _fill(env, size)
    streamed = in_fresh_process(_stream_all, env.urls)
    if streamed != size or env.xlen(env.urls.stream) != size:
        log(f"  WARNING typed-consume: stream has {env.xlen(env.urls.stream)} entries, streamed {streamed} of {size}")
    env.compact_aof()
    log(f"typed-consume: {profile.typed_reps} rounds of {', '.join(CONSUME_VARIANTS)}")
    interleaved(
        results,
        "typed-consume",
        f"{size:,} entries",
        CONSUME_VARIANTS,
        profile.typed_reps,
        lambda v: consume_trial(env, v, size),
        core=("untyped", "typed"),
        side_reps=profile.side_reps,
    )


# -- drain ------------------------------------------------------------------------------------------------------------

# The same records' JSON for both variants (as jsonb prints it), typed or not by the eighth argument only.
STAGE_SQL = """
    SELECT count(unilog_stage('created', 'ride',
           jsonb_build_object('ride_id', md5(g::text)::uuid, 'rider', 'r-' || lpad((g %% 10000)::text, 4, '0'),
                              'fare', ((g %% 10000) / 100.0 + 2.5)::numeric(10, 2)::text,
                              'requested_at', timestamptz '2026-11-27 10:00:00+00' + g * interval '1 second',
                              'passengers', 1 + g %% 4, 'city', 'city-' || lpad((g %% 50)::text, 2, '0'))::text,
           '', md5(g::text)::uuid::text, NULL, NULL, %s))
    FROM generate_series(%s::int, %s::int) AS g
"""


def _stage(env: BenchEnv, size: int, type_tag: str | None) -> None:
    for lo in range(1, size + 1, FILL_TRANSACTION):
        env.admin.execute(STAGE_SQL, (type_tag, lo, min(size, lo + FILL_TRANSACTION - 1)))
    env.settle()


def _drain(urls: Urls) -> tuple[int, float]:
    with Streamer(urls.settings()) as streamer:
        streamer.connect()
        started = time.perf_counter()
        count = streamer.drain()
        return count, time.perf_counter() - started


def drain_trial(env: BenchEnv, variant: str, size: int) -> tuple[dict[str, float], dict[str, Any]]:
    env.reset()
    _stage(env, size, BenchRide.__unilog_contract__.type_tag if variant == "typed" else None)  # type: ignore[attr-defined]
    count, elapsed = in_fresh_process(_drain, env.urls)
    xlen = env.xlen(env.urls.stream)
    if count != size or xlen != size or env.staged():
        log(f"  WARNING typed-drain {variant}: drained {count} of {size}, stream {xlen}, {env.staged()} left")
    return {"records/s": size / elapsed, "seconds": elapsed}, {"count": count, "xlen": xlen}


def run_drain(env: BenchEnv, profile: Profile, results: Results) -> None:
    size = profile.typed_size
    log(f"typed-drain: {size:,} records, {profile.typed_reps} rounds of {', '.join(DRAIN_VARIANTS)}")
    interleaved(
        results,
        "typed-drain",
        f"{size:,} records",
        DRAIN_VARIANTS,
        profile.typed_reps,
        lambda v: drain_trial(env, v, size),
    )


def run_typed(env: BenchEnv, profile: Profile, results: Results) -> None:
    """Issue 37's figures: typed against untyped emit, consume and drain, and the codecs' microseconds."""
    run_codecs(profile, results)
    run_emit(env, profile, results)
    run_consume(env, profile, results)
    run_drain(env, profile, results)
