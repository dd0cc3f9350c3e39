"""``spark``: the Spark consumer's throughput and commit-to-state latency, against the Python checkpoint consumer.

Both consumers do the reference's work (sum the distances, count the records, one ``UPDATE`` of a state row per
batch) and commit state and checkpoint in one Postgres transaction. The Spark consumer is the demo's set-up:
``local[2]``, the ``unilog`` source with ``maxEntriesPerBatch`` 20000, a 200 ms processing-time trigger, the
:class:`unilog.spark.TransactionalSink`. Spark's start (about 5 s for the JVM) is outside the clock: a trial's clock
starts when the query starts.

* ``throughput``: a pre-filled stream read from the beginning to the end; entries/s after the first micro-batch
  (which carries the query's warm-up), and with it.
* ``latency``: the ``latency`` workload's producer (2 threads, open-loop rate, t0 taken just before ``COMMIT``) and
  streamer, with the Spark query as the consumer; latency is taken in the driver right after the sink's ``COMMIT``
  returned, so it is commit-to-state (the Python consumer's is taken in its handler, before its commit: slightly
  flattering it).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from typing import Any

import psycopg

from unilog.spark import TransactionalSink, spark_session, task_slots
from unilog.wire import registry_key

from .consume import NAME as CONSUME_NAME
from .consume import _prefill, _unilog
from .core import Profile, Results, in_fresh_process, interleaved, log, worker_init
from .env import BenchEnv, Urls
from .latency import CHECKPOINT_UNILOG, Probes, latency_trial

CONF = {"spark.sql.shuffle.partitions": "1"}
TRIGGER = "200 milliseconds"
BATCH = 20_000  # the demo's maxEntriesPerBatch
LATENCY_NAME = "bench-latency"  # the name latency.py's "caught up" check reads (CHECKPOINT_UNILOG)
assert LATENCY_NAME in CHECKPOINT_UNILOG


def available() -> bool:
    from unilog.harness.app import spark_available

    return spark_available()


def _state_update(conn: psycopg.Connection[Any], name: str, total: float, n: int) -> None:
    conn.execute(
        "INSERT INTO bench_state (name, total_distance, n) VALUES (%s, %s, %s) ON CONFLICT (name) DO UPDATE "
        "SET total_distance = bench_state.total_distance + excluded.total_distance, n = bench_state.n + excluded.n",
        (name, total, n),
    )


def _start(spark: Any, urls: Urls, name: str, sink: Any, checkpoint: str, max_entries: int = BATCH) -> Any:
    stream = (
        spark.readStream.format("unilog")
        .option("redisUrl", urls.redis)
        .option("stream", urls.stream)
        .option("databaseUrl", urls.database)
        .option("consumer", name)
        .option("maxEntriesPerBatch", str(max_entries))
        .option("minPartitions", str(task_slots(spark)))
        .load()
    )
    writer = stream.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
    return writer.trigger(processingTime=TRIGGER).start()


def _count(conn: psycopg.Connection[Any], name: str) -> int:
    row = conn.execute("SELECT n FROM bench_state WHERE name = %s", (name,)).fetchone()
    return int(row[0]) if row else 0


# -- throughput --------------------------------------------------------------------------------------------------------


def _aggregate_effect(name: str) -> Any:
    def effect(conn: psycopg.Connection[Any], fresh: Any) -> None:
        from pyspark.sql import functions as f

        distance = f.get_json_object("data", "$.distance").cast("double")
        row = fresh.agg(f.sum(distance).alias("total"), f.count("*").alias("n")).collect()[0]
        _state_update(conn, name, float(row["total"] or 0.0), int(row["n"]))

    return effect


def _spark_drain(urls: Urls, size: int, batch: int) -> tuple[int, float, float]:
    """(entries applied, seconds from the query's start, entries/s after the first batch). The first micro-batch
    carries the query's warm-up (Python workers start, code is compiled: about 8 s here), so the steady rate is the
    one a long-running consumer sees."""
    spark = spark_session("bench-spark", "local[2]", CONF)
    checkpoint = tempfile.mkdtemp(prefix="bench-spark-")
    # one session polled every 50 ms: a new connection per look cost the machine a backend start 50 times a second
    poll = psycopg.connect(urls.database, autocommit=True)
    try:
        sink = TransactionalSink(urls.database, CONSUME_NAME, urls.stream, _aggregate_effect(CONSUME_NAME))
        started = time.perf_counter()
        query = _start(spark, urls, CONSUME_NAME, sink, checkpoint, batch)
        deadline = time.monotonic() + 900
        first: tuple[int, float] | None = None
        while (count := _count(poll, CONSUME_NAME)) < size and time.monotonic() < deadline and query.isActive:
            if count and first is None:
                first = (count, time.perf_counter())
            time.sleep(0.05)
        ended = time.perf_counter()
        query.stop()
        steady = (count - first[0]) / (ended - first[1]) if first else count / (ended - started)
        return count, ended - started, steady
    finally:
        poll.close()
        spark.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)


def throughput_trial(env: BenchEnv, variant: str, size: int) -> tuple[dict[str, float], dict[str, Any]]:
    """``python`` or ``spark b<N>`` (``maxEntriesPerBatch`` N)."""
    env.reset(keep_redis=True)
    env.rds.delete(registry_key(env.urls.stream))
    metrics: dict[str, float] = {}
    if variant.startswith("spark"):
        batch = int(variant.removeprefix("spark b").removesuffix("k")) * 1000
        count, elapsed, steady = in_fresh_process(_spark_drain, env.urls, size, batch)
        # when the consumer is behind, a record waits up to one micro-batch: the latency side of the trade-off
        metrics["s per batch"] = batch / steady if steady else float("nan")
    else:
        count, elapsed = in_fresh_process(_unilog, env.urls, True)
        steady = count / elapsed
    if count != size:
        log(f"  WARNING spark throughput {variant}: applied {count} of {size}")
    metrics.update({"entries/s": steady, "entries/s with warm-up": count / elapsed, "seconds": elapsed})
    return metrics, {"count": count}


# -- latency -----------------------------------------------------------------------------------------------------------


def _spark_consumer_main(urls: Urls, probes: Probes, ready: Any, stop: Any) -> None:
    """The latency workload's consumer process, on Spark."""
    worker_init()
    spark = spark_session("bench-spark-latency", "local[2]", CONF)
    checkpoint = tempfile.mkdtemp(prefix="bench-spark-latency-")
    applied: list[tuple[int, str]] = []

    def effect(conn: psycopg.Connection[Any], fresh: Any) -> None:
        from pyspark.sql import functions as f

        rows = fresh.select(
            f.get_json_object("data", "$.i").cast("int").alias("i"),
            f.get_json_object("data", "$.distance").cast("double").alias("d"),
            "id",
        ).collect()
        _state_update(conn, LATENCY_NAME, sum(r["d"] for r in rows), len(rows))
        applied.extend((r["i"], r["id"]) for r in rows)

    sink = TransactionalSink(urls.database, LATENCY_NAME, urls.stream, effect)

    def on_batch(batch: Any, batch_id: int) -> None:
        applied.clear()
        sink(batch, batch_id)
        now = time.monotonic()  # the sink's COMMIT has returned
        for i, entry_id in applied:
            if probes.latency[i] == 0.0:
                probes.latency[i] = now - probes.t0[i]
                probes.to_xadd[i] = int(entry_id.partition("-")[0]) / 1000 - probes.wall[i]
                probes.seen.value += 1

    query = _start(spark, urls, LATENCY_NAME, on_batch, checkpoint)
    deadline = time.monotonic() + 120
    while query.lastProgress is None and time.monotonic() < deadline:  # the first (empty) trigger has run
        time.sleep(0.05)
    ready.set()
    while not stop.wait(0.1) and query.isActive:
        pass
    query.stop()
    spark.stop()
    shutil.rmtree(checkpoint, ignore_errors=True)


def _latency(env: BenchEnv, variant: str, rate: int, seconds: float) -> tuple[dict[str, float], dict[str, Any]]:
    consumer_main = _spark_consumer_main if variant == "spark" else None
    return latency_trial(env, "unilog", rate, seconds, consumer_main=consumer_main)


def run_spark(env: BenchEnv, profile: Profile, results: Results) -> None:
    if not available():
        log("spark: skipped (pyspark or Java not found)")
        return
    size = profile.spark_size
    log(f"spark: filling the stream with {size:,} records (unilog streamer)")
    env.reset()
    env.stage(size)
    in_fresh_process(_prefill, env.urls)
    env.compact_aof()
    variants = ("python", *(f"spark b{b // 1000}k" for b in profile.spark_batches))
    log(f"spark throughput: {profile.spark_reps} rounds of {', '.join(variants)}")
    interleaved(
        results,
        "spark",
        f"throughput {size:,} entries",
        variants,
        profile.spark_reps,
        lambda v: throughput_trial(env, v, size),
    )
    rates = profile.latency_rates if profile.spark_latency_rates is None else profile.spark_latency_rates
    for rate in rates:
        seconds = profile.spark_latency_seconds
        log(f"spark latency: {rate}/s for {seconds:g} s, {profile.spark_reps} rounds of spark, python")
        interleaved(
            results,
            "spark",
            f"latency {rate}/s x {seconds:g}s",
            ("spark", "python"),
            profile.spark_reps,
            lambda v, rate=rate, seconds=seconds: _latency(env, v, rate, seconds),  # type: ignore[misc]
        )
