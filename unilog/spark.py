"""unilog on Spark: a PySpark data source for the log, and a transactional sink with the same guarantee.

**Source.** ``spark.readStream.format("unilog")`` (and ``spark.read.format("unilog")`` for a bounded range) reads a
stream through a PySpark 4 Python data source. Offsets are stream ids (``{"id": "1700000000000-3"}``, exclusive
start, inclusive end). Each micro-batch is split into partitions of ``entriesPerPartition`` entries (cut by count,
not by time: pipelined ``XADD``s put thousands of entries in one millisecond), read in parallel by the executors;
``maxEntriesPerBatch`` caps a batch. Columns: the same as a Python consumer sees (see :data:`SCHEMA`).

With ``consumer`` and ``databaseUrl`` options, a query without a Spark checkpoint starts after that consumer's
checkpoint in Postgres: Spark's checkpoint folder is a cache, Postgres the truth.

**Sink.** :class:`TransactionalSink` is a ``foreachBatch`` function. For each micro-batch it opens one Postgres
transaction, locks the consumer's checkpoint row (two copies of one consumer cannot both apply), keeps only entries
above the checkpoint *by position* (never by Spark's batch id, which goes backwards when the checkpoint folder is
lost), drops double-sent copies, checks no positions are missing, runs the user's effect with the transaction,
saves the checkpoint and commits. A crash anywhere replays the batch with no double effect.

Options (Spark lower-cases option keys; they are read case-insensitively here): ``redisUrl``, ``stream``,
``databaseUrl``, ``consumer``, ``startingId`` (``beginning`` or an id, when no checkpoint), ``endingId`` (batch
reads), ``maxEntriesPerBatch`` (default 10000), ``entriesPerPartition`` (default 25000: a range's fixed cost is a
task, an Arrow hand-over and a Redis connection), ``minPartitions`` (default 1; set it to the executors' task slots,
``spark.sparkContext.defaultParallelism``: a batch is cut into a multiple of it, in ranges of equal size).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog

from . import engine, metrics, store, tracing
from .config import postgres_conninfo
from .errors import ConcurrentConsumer, ConfigurationError, StreamGap
from .spark_columns import SCHEMA, _record_batch

log = structlog.get_logger(__name__)

SOURCE_NAME = "unilog"
REDACT_PASSWORDS = r"(?<=://)[^/@\s:]*:[^/@\s]*(?=@)"  # user:password of scheme://user:password@host

try:  # pyspark is optional: everything else in unilog works without it
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceReader,
        DataSourceStreamReader,
        InputPartition,
    )
except ImportError:  # pragma: no cover - exercised only where pyspark is missing
    DataSource = DataSourceReader = DataSourceStreamReader = InputPartition = object  # type: ignore[assignment,misc]


def _option(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    """An option by name, whatever case Spark left it in."""
    for key in (name, name.lower()):
        if key in options:
            return options[key]
    lowered = {k.lower(): v for k, v in options.items()}
    return lowered.get(name.lower(), default)


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, validated."""

    redis_url: str
    stream: str
    database_url: str | None
    consumer: str | None
    starting_id: str
    ending_id: str | None
    max_entries_per_batch: int
    entries_per_partition: int
    min_partitions: int = 1

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        redis_url = _option(options, "redisUrl") or os.environ.get("REDIS_URL")
        stream = _option(options, "stream") or os.environ.get("UNILOG_STREAM")
        if not redis_url or not stream:
            raise ConfigurationError("the unilog source needs the options redisUrl and stream")
        starting = _option(options, "startingId", "beginning") or "beginning"
        return cls(
            redis_url=redis_url,
            stream=stream,
            database_url=_option(options, "databaseUrl"),
            consumer=_option(options, "consumer"),
            starting_id="0-0" if starting == "beginning" else starting,
            ending_id=_option(options, "endingId"),
            max_entries_per_batch=int(_option(options, "maxEntriesPerBatch", "10000") or 10000),
            entries_per_partition=max(1, int(_option(options, "entriesPerPartition", "25000") or 25000)),
            min_partitions=max(1, int(_option(options, "minPartitions", "1") or 1)),
        )


class EntryRange(InputPartition):
    """Entries of ``stream`` with ids in (``after``, ``until``]: one read task."""

    def __init__(self, redis_url: str, stream: str, after: str, until: str) -> None:
        self.redis_url, self.stream, self.after, self.until = redis_url, stream, after, until


def _ids_after(redis_url: str, stream: str, after: str, limit: int | None, until: str = "+") -> list[str]:
    """Ids of up to ``limit`` entries after ``after`` (and at most ``until``), in order. Read from Redis's raw reply
    (no dict per entry): the planner reads a whole batch just to cut it, so this is on every micro-batch's path."""
    ids: list[str] = []
    page = engine.PAGE if limit is None else max(1, min(engine.PAGE, limit))
    for chunk in engine.raw_pages(redis_url, stream, after, until, page):
        ids += [entry_id.decode() if isinstance(entry_id, bytes) else entry_id for entry_id, _ in chunk]
        if limit is not None and len(ids) >= limit:
            return ids[:limit]
    return ids


MIN_RANGE = 1000  # entries: below this a range costs more in its task, hand-over and connection than it reads


def _split(options: SourceOptions, after: str, ids: list[str]) -> list[EntryRange]:
    """Cut the entries (``after``, ids[-1]] into equal ranges of at most ``entries_per_partition`` entries, as many
    as a multiple of ``min_partitions`` (for batches of ``min_partitions * MIN_RANGE`` entries or more): with one
    range per task slot and slots of equal work, no slot idles through the batch's last wave (5 ranges on 2 cores
    took 3 waves, the last on one core)."""
    if not ids:
        return []
    count = -(-len(ids) // options.entries_per_partition)
    if len(ids) >= options.min_partitions * MIN_RANGE:  # a small batch is one task's work: no task per slot
        count = -(-count // options.min_partitions) * options.min_partitions
    ranges, start = [], after
    for k in range(1, count + 1):
        end = ids[len(ids) * k // count - 1]
        ranges.append(EntryRange(options.redis_url, options.stream, start, end))
        start = end
    return ranges


def read_range(partition: EntryRange) -> Iterator[Any]:
    """The rows of one range, read on an executor, as Arrow record batches (one per ``XRANGE`` page), built column
    by column from Redis's raw reply: Spark takes them as they are (rows as tuples are converted one by one)."""
    for chunk in engine.raw_pages(partition.redis_url, partition.stream, partition.after, partition.until, 5000):
        with engine.no_gc():
            batch = _record_batch(partition.stream, chunk)
        yield batch


class _Traced:
    """What :func:`unilog.tracing.process_span` needs of a record: its id and trace context."""

    def __init__(self, entry_id: str, traceparent: str | None) -> None:
        self.id, self.traceparent = entry_id, traceparent


def _traced(batch: Any) -> list[_Traced]:
    """The batch's first records with a trace context, for the process span's links: a Spark job, so only when an
    OpenTelemetry SDK records spans."""
    if not tracing.recording():
        return []
    rows = batch.where("traceparent IS NOT NULL").select("id", "traceparent").limit(tracing.MAX_LINKS).collect()
    return [_Traced(row["id"], row["traceparent"]) for row in rows]


def _register(redis_url: str, stream: str, consumer: str, last_id: str) -> None:
    """Hold retention at ``last_id`` for ``consumer`` (see :meth:`unilog.engine.RedisStreams.register`)."""
    api = engine.RedisStreams(engine.connect(redis_url))
    try:
        api.register(stream, consumer, last_id)
    finally:
        api.close()


def checkpoint_id(database_url: str, consumer: str) -> str | None:
    """The stream id consumer ``consumer`` has consumed up to, per its checkpoint in Postgres (None if none)."""
    with store.connect(postgres_conninfo(database_url), application_name=f"unilog-spark-{consumer}"[:63]) as conn:
        checkpoint = store.read_checkpoint(conn, consumer)
    return checkpoint.last_id if checkpoint else None


class UnilogStreamReader(DataSourceStreamReader):
    """Micro-batches over a Redis stream; offsets are stream ids."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._planned: dict[tuple[str, str], list[str]] = {}

    def initialOffset(self) -> dict[str, str]:
        """After the consumer's checkpoint in Postgres, else ``startingId``; registers the consumer for retention."""
        start = self.options.starting_id
        if self.options.database_url and self.options.consumer:
            stored = checkpoint_id(self.options.database_url, self.options.consumer)
            start = stored if stored is not None else start
            _register(self.options.redis_url, self.options.stream, self.options.consumer, start)
        return {"id": start}

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadMaxRows

        return ReadMaxRows(self.options.max_entries_per_batch)

    def latestOffset(self, start: dict[str, str] | None = None, limit: Any = None) -> dict[str, str]:
        """The end of the next batch: at most the read limit's entries after ``start``.

        Spark may call this before :meth:`initialOffset` on a fresh start (and, before Spark 4.2, without
        arguments); both fall back to the initial offset as the start.
        """
        after = (start or self.initialOffset())["id"]
        cap = getattr(limit, "max_rows", None)
        if limit is None:
            cap = self.options.max_entries_per_batch
        ids = _ids_after(self.options.redis_url, self.options.stream, after, cap)
        if not ids:
            return {"id": after}
        self._planned = {(after, ids[-1]): ids}  # partitions() for this batch needs no second scan
        return {"id": ids[-1]}

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> list[EntryRange]:
        key = (start["id"], end["id"])
        ids = self._planned.pop(key, None)
        if ids is None:  # a replayed batch (restart): list its ids again
            ids = _ids_after(self.options.redis_url, self.options.stream, start["id"], None, until=end["id"])
        return _split(self.options, start["id"], ids)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, EntryRange)
        return read_range(partition)

    def commit(self, end: dict[str, str]) -> None:
        """Nothing to do: progress that matters is committed by the sink, in Postgres."""


class UnilogBatchReader(DataSourceReader):
    """A bounded read of entries (``startingId``, ``endingId``]."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[EntryRange]:
        options = self.options
        ids = _ids_after(options.redis_url, options.stream, options.starting_id, None, options.ending_id or "+")
        return _split(self.options, self.options.starting_id, ids) or [
            EntryRange(self.options.redis_url, self.options.stream, "0-0", "0-0")
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, EntryRange)
        if partition.until == "0-0":
            return iter(())
        return read_range(partition)


class UnilogDataSource(DataSource):
    """The ``unilog`` data source."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: Any) -> UnilogBatchReader:
        return UnilogBatchReader(SourceOptions.parse(self.options))

    def streamReader(self, schema: Any) -> UnilogStreamReader:
        return UnilogStreamReader(SourceOptions.parse(self.options))


def register(spark: Any) -> None:
    """Register the ``unilog`` data source with a SparkSession."""
    spark.dataSource.register(UnilogDataSource)


# -- the transactional sink -------------------------------------------------------------------------------------------

Effect = Callable[[psycopg.Connection[Any], Any], Any]


class TransactionalSink:
    """``foreachBatch`` function: apply a micro-batch's effect and the consumer's checkpoint in one transaction.

    ``effect(conn, df)`` receives the open transaction and the batch's entries that were not applied before (a
    DataFrame, deduplicated by position); it must write its results through ``conn``. With ``strict_start`` a
    producer the consumer never saw must start at position 1 (a rebuild must not silently start mid-history).
    """

    def __init__(
        self,
        database_url: str,
        consumer: str,
        stream: str,
        effect: Effect,
        *,
        redis_url: str | None = None,
        strict_start: bool = False,
    ) -> None:
        self.conninfo = postgres_conninfo(database_url)
        self.redis_url = redis_url  # given: the consumer registers its checkpoint, so trimming never passes it
        self.consumer = consumer
        self.stream = stream
        self.effect = effect
        self.strict_start = strict_start  # a producer never seen before must start at position 1 (rebuilds)
        self._conn: psycopg.Connection[Any] | None = None  # kept between micro-batches; dropped after any error
        self._phases: dict[str, float] = {}

    def __call__(self, batch: Any, batch_id: int) -> None:
        batch = batch.persist()  # read from Redis once, whatever the checks and the effect ask of it
        try:
            self._call(batch, batch_id)
        except BaseException:
            self.close()  # the session may be mid-transaction or broken: the next micro-batch opens a new one
            raise
        finally:
            batch.unpersist()

    def close(self) -> None:
        """Close the sink's Postgres session (a later micro-batch opens a new one)."""
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = store.connect(self.conninfo, application_name=f"unilog-spark-{self.consumer}"[:63])
        return self._conn

    def _call(self, batch: Any, batch_id: int) -> None:
        started = time.perf_counter()
        self._phases.clear()
        with tracing.process_span(
            self.stream, self.consumer, _traced(batch), kind="spark" if tracing.recording() else None
        ):
            done = self._commit(self._connection(), batch)
        if done is None:
            return  # an empty micro-batch
        plan, checkpoint = done
        seconds = time.perf_counter() - started
        metrics.batch_consumed(
            "spark", self.stream, self.consumer, handled=plan.entries, skipped=0, seconds=seconds, first_id=None
        )
        if self.redis_url:
            _register(self.redis_url, self.stream, self.consumer, checkpoint.last_id)
        log.info(
            "spark batch committed",
            consumer=self.consumer,
            batch=batch_id,
            entries=plan.entries,
            last_id=plan.last_id,
            ms=round(seconds * 1000, 1),
            **{k: round(v * 1000, 1) for k, v in self._phases.items()},
        )

    def _commit(self, conn: psycopg.Connection[Any], batch: Any) -> tuple[_Plan, store.Checkpoint] | None:
        """Plan the batch against the checkpoint and apply it; plan again if the checkpoint moved meanwhile."""
        with conn.transaction():
            seen = store.ensure_checkpoint(conn, self.consumer, self.stream).positions
        for attempt in itertools.count(1):
            started = time.perf_counter()
            plan = self._plan(batch, seen)  # the first Spark job: it reads the batch from Redis, too
            self._phases["plan_ms"] = time.perf_counter() - started
            if plan is None:
                return None
            applied, seen = self._apply(conn, batch, plan, seen)
            if applied is not None:
                return plan, applied
            if attempt == 3:
                raise ConcurrentConsumer(
                    f"spark consumer {self.consumer!r}: its checkpoint moved under it three times; another copy of"
                    " this consumer (not a Spark one) is running: run one"
                )
            log.warning("checkpoint moved by another copy; batch re-applied", consumer=self.consumer)
        raise AssertionError("unreachable")

    def _apply(
        self, conn: psycopg.Connection[Any], batch: Any, plan: _Plan, seen: dict[str, tuple[int, int]]
    ) -> tuple[store.Checkpoint | None, dict[str, tuple[int, int]]]:
        """One transaction: the effect of the entries above the checkpoint, and the checkpoint past them. Returns
        (the saved checkpoint, its positions), or (None, the positions found) if the checkpoint was not at ``seen``
        (the plan is stale) or moved meanwhile; nothing is committed then.

        Copies of this consumer serialize on an advisory lock, which, unlike the checkpoint's row lock, gives the
        transaction no id: the Spark jobs that compute the effect then hold no transaction id open for long (one held
        back vacuum everywhere, and until issue 33 every record table mode published). The row is locked only at the
        end, and must be unchanged."""
        with conn.transaction() as tx:
            checkpoint = store.lock_consumer(conn, self.consumer)
            assert checkpoint is not None
            if checkpoint.positions != seen:
                raise psycopg.Rollback(tx)  # planned against positions that are no longer the checkpoint's
            fresh = batch if plan.clean else self._fresh(batch, seen).cache()
            started = time.perf_counter()
            try:
                self.effect(conn, fresh)
                self._phases["effect_ms"] = time.perf_counter() - started
            finally:
                if fresh is not batch:
                    fresh.unpersist()
            now = store.lock_checkpoint(conn, self.consumer)
            if now is None or (now.last_id, now.positions) != (checkpoint.last_id, checkpoint.positions):
                checkpoint = now or checkpoint
                raise psycopg.Rollback(tx)
            if engine.id_tuple(plan.last_id) > engine.id_tuple(checkpoint.last_id):
                checkpoint.last_id = plan.last_id
            checkpoint.positions = plan.positions
            store.save_checkpoint(conn, checkpoint)
            return checkpoint, checkpoint.positions
        return None, checkpoint.positions

    @staticmethod
    def _above(positions: dict[str, tuple[int, int]]) -> Any:
        """A column: the entry has a position, above the checkpoint's for its producer."""
        from pyspark.sql import functions as f

        keep = f.col("seq").isNotNull()
        for producer, (epoch, seq) in positions.items():
            above = (f.col("epoch") > epoch) | ((f.col("epoch") == epoch) & (f.col("seq") > seq))
            keep = keep & ((f.col("producer") != producer) | above)
        return keep

    def _fresh(self, batch: Any, positions: dict[str, tuple[int, int]]) -> Any:
        """Entries above the checkpoint's position for their producer, one per position."""
        return batch.filter(self._above(positions)).dropDuplicates(["producer", "epoch", "seq"])

    def _plan(self, batch: Any, positions: dict[str, tuple[int, int]]) -> _Plan | None:
        """One Spark job over the batch: its size and last id, and the checkpoint's positions after it (None for an
        empty batch). Raises :class:`StreamGap` if the batch skips positions."""
        from pyspark.sql import functions as f

        seq = f.when(self._above(positions), f.col("seq"))
        stats = (
            batch.groupBy("producer", "epoch")
            .agg(
                f.max(f.struct("id_ms", "id_seq")).alias("last"),
                f.count("*").alias("entries"),
                f.min(seq).alias("lo"),
                f.max(seq).alias("hi"),
                f.countDistinct(seq).alias("n"),
            )
            .collect()
        )
        if not stats:
            return None
        last = max((row["last"]["id_ms"], row["last"]["id_seq"]) for row in stats)
        updated = dict(positions)
        for row in sorted((r for r in stats if r["n"]), key=lambda r: (r["producer"], r["epoch"])):
            seen = updated.get(row["producer"])
            expected = 1 if seen is None or seen[0] != row["epoch"] else seen[1] + 1
            contiguous = row["n"] == row["hi"] - row["lo"] + 1
            checked_start = seen is not None or self.strict_start
            if not contiguous or (checked_start and row["lo"] != expected):
                raise StreamGap(
                    f"spark consumer {self.consumer!r}: producer {row['producer']!r} positions are missing in "
                    f"epoch {row['epoch']} (expected {expected}, batch has {row['lo']}..{row['hi']} with {row['n']}"
                    " entries): trimmed or lost; repair with `unilog reconcile --repair`"
                )
            updated[row["producer"]] = (int(row["epoch"]), int(row["hi"]))
        entries = sum(int(r["entries"]) for r in stats)
        # every entry has a position above the checkpoint and no position is there twice (the usual batch): the
        # effect gets the batch as it is, without the filter and the de-duplication's shuffle
        clean = entries == sum(int(r["n"]) for r in stats)
        return _Plan(entries, f"{last[0]}-{last[1]}", updated, clean)


@dataclass(frozen=True)
class _Plan:
    """What a micro-batch will do to the checkpoint: entries in it, its last stream id, the positions after it, and
    whether every entry is new and there once (``clean``)."""

    entries: int
    last_id: str
    positions: dict[str, tuple[int, int]]
    clean: bool = False


def spark_session(app: str = "unilog", master: str | None = None, conf: Mapping[str, str] | None = None) -> Any:
    """A SparkSession with unilog's source registered and Spark's log noise silenced (WARN and above)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the data source planner reads only this
    builder = SparkSession.builder.appName(app)
    if master:
        builder = builder.master(master)
    # executors' Python workers must have unilog and its dependencies: default to this interpreter (local mode);
    # on a cluster, point spark.pyspark.python at an environment that has unilog installed
    defaults = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        # the source's options carry URLs: Spark redacts what this matches (a URL's password) in plans, the UI and
        # its event logs
        "spark.redaction.string.regex": REDACT_PASSWORDS,
    }
    for key, value in {**defaults, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark


def task_slots(spark: Any) -> int:
    """The session's default parallelism, for the source's ``minPartitions`` (1 where the session has no
    SparkContext to ask, as under Spark Connect)."""
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # pyspark raises its own not-supported error types on Connect sessions
        return 1


def options_json(**options: str) -> str:
    """Options as JSON (for logs)."""
    return json.dumps(options, sort_keys=True)
