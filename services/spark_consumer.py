"""The distance consumer on Spark: ``python -m services.spark_consumer NAME [--master local[*]] [--once]``.

A Structured Streaming query over the ``unilog`` source; each micro-batch's rides are aggregated by Spark (exact
decimal sum, count, checksum) and added to ``consumer_states`` in the same Postgres transaction as the consumer's
checkpoint (:class:`unilog.spark.TransactionalSink`). Its totals agree with the Python consumers'. Spark's
checkpoint folder (``--checkpoint``) is only a cache: delete it and the query resumes from Postgres.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import psycopg

from unilog import metrics
from unilog.cli import ExitCode
from unilog.log import configure_logging
from unilog.spark import TransactionalSink, spark_session, task_slots

from .rides import CHECKSUM_MOD, CHECKSUM_MUL, STREAM


def ride_totals(fresh: Any) -> tuple[Decimal, int, int]:
    """(total distance, ride count, checksum) of the ride-creation records in ``fresh``, computed by Spark. A
    ``RideCreated`` record's distance is an exact decimal string (``"12.346"``; an untyped record's a number), which
    ``get_json_object`` returns as it is written and the cast reads exactly."""
    from pyspark.sql import functions as f

    rides = fresh.filter((f.col("object") == "ride") & (f.col("action") == "create")).select(
        f.get_json_object("data", "$.id").cast("decimal(38,0)").alias("id"),
        f.get_json_object("data", "$.distance").cast("decimal(14,3)").alias("distance"),
    )
    row = rides.agg(
        f.sum("distance").alias("total"),
        f.count("*").alias("n"),
        f.sum(f.pmod(f.col("id") * f.lit(str(CHECKSUM_MUL)).cast("decimal(38,0)"), f.lit(CHECKSUM_MOD))).alias("check"),
    ).collect()[0]
    return Decimal(row["total"] or 0), int(row["n"]), int(row["check"] or 0) % CHECKSUM_MOD


def state_effect(name: str) -> Any:
    """The sink's effect: add the batch's totals to consumer ``name``'s state, in the sink's transaction."""

    def effect(conn: psycopg.Connection[Any], fresh: Any) -> None:
        total, count, checksum = ride_totals(fresh)
        if not count:
            return
        conn.execute(
            """
            INSERT INTO consumer_states AS s (name, total_distance, ride_count, checksum) VALUES (%s, %s, %s, %s)
            ON CONFLICT (name) DO UPDATE SET
                total_distance = s.total_distance + excluded.total_distance,
                ride_count = s.ride_count + excluded.ride_count,
                checksum = mod(s.checksum::numeric + excluded.checksum, %s)::bigint
            """,
            (name, total, count, checksum, CHECKSUM_MOD),
        )

    return effect


def start_query(spark: Any, name: str, database_url: str, redis_url: str, checkpoint: str, once: bool) -> Any:
    """Start the streaming query for consumer ``name``."""
    stream = (
        spark.readStream.format("unilog")
        .option("redisUrl", redis_url)
        .option("stream", STREAM)
        .option("databaseUrl", database_url)
        .option("consumer", name)
        .option("maxEntriesPerBatch", "20000")
        .option("minPartitions", str(task_slots(spark)))
        .load()
    )
    sink = TransactionalSink(database_url, name, STREAM, state_effect(name), redis_url=redis_url)
    writer = stream.writeStream.foreachBatch(sink)
    writer = writer.option("checkpointLocation", checkpoint)
    writer = writer.trigger(availableNow=True) if once else writer.trigger(processingTime="200 milliseconds")
    return writer.start()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.spark_consumer")
    parser.add_argument("name")
    parser.add_argument("--master", default=os.environ.get("SPARK_MASTER", "local[2]"))
    parser.add_argument("--checkpoint", help="Spark's checkpoint folder (a cache; default: a temp folder per name)")
    parser.add_argument("--once", action="store_true", help="process what is in the stream, then exit")
    parser.add_argument("--conf", action="append", default=[], help="extra Spark settings, key=value")
    parser.add_argument("--metrics-port", type=int, help="serve the driver's Prometheus metrics on this port")
    parser.add_argument("--metrics-addr", default="127.0.0.1", help="... on this address (0.0.0.0: every interface)")
    args = parser.parse_args(argv)
    configure_logging()
    if args.metrics_port is not None:
        metrics.serve(args.metrics_port, args.metrics_addr)  # the sink runs in the driver: its batches count here
    conf = dict(item.split("=", 1) for item in args.conf)
    spark = spark_session(f"unilog-{args.name}", args.master, conf)
    checkpoint = args.checkpoint or os.path.join(tempfile.gettempdir(), f"unilog-spark-{args.name}")
    query = start_query(spark, args.name, os.environ["DATABASE_URL"], os.environ["REDIS_URL"], checkpoint, args.once)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while query.isActive and not stop.wait(0.5):
        pass
    if query.isActive:
        query.stop()  # the batch in progress either committed in Postgres or rolls back and is replayed later
    failure = query.exception()
    spark.stop()
    if failure is not None:
        text = str(failure)
        reason = next((line for line in text.splitlines() if line.startswith("unilog.errors.")), text[:300])
        print(f"spark consumer {args.name}: {reason.strip()}", file=sys.stderr)
        return ExitCode.DATA_LOSS if "StreamGap" in text else ExitCode.FAILURE
    return 0


if __name__ == "__main__":
    sys.exit(main())
