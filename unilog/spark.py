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
reads), ``maxEntriesPerBatch`` (default 10000), ``entriesPerPartition`` (default 2000).
"""

from __future__ import annotations

import functools
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

log = structlog.get_logger(__name__)

SCHEMA = (
    "stream string, id string, id_ms long, id_seq long, producer string, epoch long, seq long, action string, "
    "object string, key string, data string, created_ms long, traceparent string"
)
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
            entries_per_partition=max(1, int(_option(options, "entriesPerPartition", "10000") or 10000)),
        )


class EntryRange(InputPartition):
    """Entries of ``stream`` with ids in (``after``, ``until``]: one read task."""

    def __init__(self, redis_url: str, stream: str, after: str, until: str) -> None:
        self.redis_url, self.stream, self.after, self.until = redis_url, stream, after, until


def _ids_after(api: engine.RedisStreams, stream: str, after: str, limit: int | None, until: str = "+") -> list[str]:
    """Ids of up to ``limit`` entries after ``after`` (and at most ``until``), in order."""
    ids: list[str] = []
    page = engine.PAGE if limit is None else max(1, min(engine.PAGE, limit))
    for chunk in api.pages(stream, "(" + after, until, page=page):
        ids += [engine.to_str(entry_id) for entry_id, _ in chunk]
        if limit is not None and len(ids) >= limit:
            return ids[:limit]
    return ids


def _split(options: SourceOptions, after: str, ids: list[str]) -> list[EntryRange]:
    """Cut the entries (``after``, ids[-1]] into ranges of ``entries_per_partition`` entries."""
    ranges, start = [], after
    for i in range(options.entries_per_partition - 1, len(ids), options.entries_per_partition):
        ranges.append(EntryRange(options.redis_url, options.stream, start, ids[i]))
        start = ids[i]
    if ids and start != ids[-1]:
        ranges.append(EntryRange(options.redis_url, options.stream, start, ids[-1]))
    return ranges


def read_range(partition: EntryRange) -> Iterator[Any]:
    """The rows of one range, read on an executor, as Arrow record batches (one per ``XRANGE`` page), built column
    by column from Redis's raw reply: Spark takes them as they are (rows as tuples are converted one by one)."""
    for chunk in engine.raw_pages(partition.redis_url, partition.stream, partition.after, partition.until, 5000):
        yield _record_batch(partition.stream, chunk)


def _record_batch(stream: str, chunk: list[Any]) -> Any:
    """An Arrow record batch of ``SCHEMA`` from raw ``XRANGE`` entries ``[id, [field, value, ...]]``."""
    import pyarrow as pa

    def number(value: bytes | None) -> int | None:
        try:
            return None if value is None else int(value)
        except ValueError:  # another writer's or a damaged entry: no position (never a crashed read)
            return None

    ids, ms, id_seq = [], [], []
    names = (b"producer", b"action", b"object", b"key", b"data", b"traceparent")
    text: dict[bytes, list[Any]] = {name: [] for name in names}
    ints: dict[bytes, list[Any]] = {name: [] for name in (b"epoch", b"seq", b"created")}
    for entry_id, flat in chunk:
        fields = dict(zip(flat[::2], flat[1::2], strict=True))
        ids.append(entry_id)
        high, _, low = entry_id.partition(b"-")
        ms.append(int(high))
        id_seq.append(int(low))
        for name, column in text.items():
            column.append(fields.get(name))
        for name, column in ints.items():
            column.append(number(fields.get(name)))
    text[b"producer"] = [p or b"" for p in text[b"producer"]]
    columns = [
        [stream] * len(ids),
        ids,
        ms,
        id_seq,
        text[b"producer"],
        ints[b"epoch"],
        ints[b"seq"],
        text[b"action"],
        text[b"object"],
        text[b"key"],
        text[b"data"],
        ints[b"created"],
        text[b"traceparent"],
    ]
    schema = _arrow_schema()
    try:
        arrays = [pa.array(col, type=f.type) for col, f in zip(columns, schema, strict=True)]
    except (pa.ArrowInvalid, UnicodeDecodeError):  # text that is not UTF-8 (a foreign entry): replace, don't crash
        arrays = [pa.array(_utf8(col), type=f.type) for col, f in zip(columns, schema, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


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


def _utf8(column: list[Any]) -> list[Any]:
    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in column]


@functools.cache
def _arrow_schema() -> Any:
    import pyarrow as pa

    types = {"string": pa.string(), "long": pa.int64()}
    return pa.schema([(name, types[kind]) for name, kind in (c.split() for c in SCHEMA.split(", "))])


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

    def _api(self) -> engine.RedisStreams:
        return engine.RedisStreams(engine.connect(self.options.redis_url))

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
        api = self._api()
        try:
            ids = _ids_after(api, self.options.stream, after, cap)
        finally:
            api.close()
        if not ids:
            return {"id": after}
        self._planned = {(after, ids[-1]): ids}  # partitions() for this batch needs no second scan
        return {"id": ids[-1]}

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> list[EntryRange]:
        key = (start["id"], end["id"])
        ids = self._planned.pop(key, None)
        if ids is None:  # a replayed batch (restart): list its ids again
            api = self._api()
            try:
                ids = _ids_after(api, self.options.stream, start["id"], None, until=end["id"])
            finally:
                api.close()
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
        api = engine.RedisStreams(engine.connect(self.options.redis_url))
        try:
            ids = _ids_after(api, self.options.stream, self.options.starting_id, None, self.options.ending_id or "+")
        finally:
            api.close()
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

    def __call__(self, batch: Any, batch_id: int) -> None:
        batch = batch.persist()  # read from Redis once, whatever the checks and the effect ask of it
        try:
            self._call(batch, batch_id)
        finally:
            batch.unpersist()

    def _call(self, batch: Any, batch_id: int) -> None:
        started = time.perf_counter()
        with (
            tracing.process_span(
                self.stream, self.consumer, _traced(batch), kind="spark" if tracing.recording() else None
            ),
            store.connect(self.conninfo, application_name=f"unilog-spark-{self.consumer}"[:63]) as conn,
        ):
            done = self._commit(conn, batch)
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
            "spark batch committed", consumer=self.consumer, batch=batch_id, entries=plan.entries, last_id=plan.last_id
        )

    def _commit(self, conn: psycopg.Connection[Any], batch: Any) -> tuple[_Plan, store.Checkpoint] | None:
        """Plan the batch against the checkpoint and apply it; plan again if the checkpoint moved meanwhile."""
        with conn.transaction():
            seen = store.ensure_checkpoint(conn, self.consumer, self.stream).positions
        for attempt in itertools.count(1):
            plan = self._plan(batch, seen)
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
        transaction no id: the Spark jobs that compute the effect then do not hold back the streamer's visibility
        horizon (every record committed meanwhile would wait for this transaction). The row is locked only at the
        end, and must be unchanged."""
        with conn.transaction() as tx:
            checkpoint = store.lock_consumer(conn, self.consumer)
            assert checkpoint is not None
            if checkpoint.positions != seen:
                raise psycopg.Rollback(tx)  # planned against positions that are no longer the checkpoint's
            fresh = self._fresh(batch, seen).cache()
            try:
                self.effect(conn, fresh)
            finally:
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
        return _Plan(sum(int(r["entries"]) for r in stats), f"{last[0]}-{last[1]}", updated)


@dataclass(frozen=True)
class _Plan:
    """What a micro-batch will do to the checkpoint: entries in it, its last stream id, the positions after it."""

    entries: int
    last_id: str
    positions: dict[str, tuple[int, int]]


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


def options_json(**options: str) -> str:
    """Options as JSON (for logs)."""
    return json.dumps(options, sort_keys=True)
