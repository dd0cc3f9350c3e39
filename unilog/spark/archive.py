"""The archive: the log copied to Parquet (partitioned by date) so history outlives Redis retention.

The archiver is a checkpoint consumer named ``archive:<stream>``: it is registered like any consumer, so trimming
never drops an entry it has not archived. Each run reads the entries after its checkpoint with the ``unilog`` batch
source, appends them to ``<path>/date=YYYY-MM-DD/`` as Parquet, then commits its checkpoint in Postgres. A crash
between the write and the commit archives those entries again on the next run; :func:`read_archive` drops such
copies by position, so readers never see a record twice.

:func:`rebuild_from_archive` builds a new consumer from the archive through the same transactional sink as the live
Spark consumer, leaving its checkpoint at the archive's end; it then continues from the live stream without a gap
(entries after the archiver's checkpoint are still retained) or an overlap (positions are filtered).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog

from .. import engine, store
from ..config import Settings
from . import Effect, TransactionalSink, task_slots

log = structlog.get_logger(__name__)


def archiver_name(stream: str) -> str:
    return f"archive:{stream}"


def archive(spark: Any, settings: Settings, path: str, *, stream: str | None = None) -> int:
    """Append the entries of ``stream`` after the archiver's checkpoint to the Parquet archive; return how many."""
    from pyspark.sql import functions as f

    stream = stream or settings.stream
    name = archiver_name(stream)
    api = engine.RedisStreams(engine.connect(settings.redis_url))
    try:
        with store.connect(settings.conninfo, application_name="unilog-archive") as conn:
            checkpoint = store.ensure_checkpoint(conn, name, stream)
            conn.commit()
        api.register(stream, name, checkpoint.last_id)
        until = api.last_generated_id(stream)
        if until is None or engine.id_tuple(until) <= engine.id_tuple(checkpoint.last_id):
            return 0
        df = (
            spark.read.format("unilog")
            .option("redisUrl", settings.redis_url)
            .option("stream", stream)
            .option("startingId", checkpoint.last_id)
            .option("endingId", until)
            .option("minPartitions", str(task_slots(spark)))
            .load()
        )
        df = df.withColumn("date", f.date_format(f.from_unixtime(f.col("id_ms") / 1000), "yyyy-MM-dd")).cache()
        count = df.count()
        positions = {
            r["producer"]: (int(r["epoch"]), int(r["seq"]))
            for r in df.filter(f.col("seq").isNotNull())
            .groupBy("producer")
            .agg(f.max(f.struct("epoch", "seq")).alias("p"))
            .select("producer", "p.epoch", "p.seq")
            .collect()
        }
        df.write.mode("append").partitionBy("date").parquet(path)
        df.unpersist()
        with store.connect(settings.conninfo, application_name="unilog-archive") as conn, conn.transaction():
            locked = store.lock_checkpoint(conn, name)
            assert locked is not None
            locked.last_id = until
            locked.positions.update(positions)
            store.save_checkpoint(conn, locked)
        api.register(stream, name, until)
    finally:
        api.close()
    log.info("archived", stream=stream, entries=count, until=until, path=path)
    return count


def read_archive(spark: Any, path: str) -> Any:
    """The archived entries, one per position (copies from a re-run after a crash dropped)."""
    if not Path(path).exists():
        raise FileNotFoundError(f"no archive at {path}")
    df = spark.read.parquet(path)
    positioned = df.filter(df.seq.isNotNull()).dropDuplicates(["producer", "epoch", "seq"])
    return positioned.unionByName(df.filter(df.seq.isNull()).dropDuplicates(["id"]))


def rebuild_from_archive(
    spark: Any, settings: Settings, path: str, consumer: str, effect: Effect, *, stream: str | None = None
) -> int:
    """Apply the whole archive to a new ``consumer`` in one transaction with its checkpoint; return entries read."""
    stream = stream or settings.stream
    df = read_archive(spark, path).drop("date")
    count = int(df.count())
    sink = TransactionalSink(settings.database_url, consumer, stream, effect, strict_start=True)
    try:
        sink(df, 0)
    finally:
        sink.close()
    return count
