"""The transactional sink: a ``foreachBatch`` function that applies a micro-batch's effect and the consumer's
checkpoint in one Postgres transaction, by position (see :mod:`unilog.spark`)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog

from .. import engine, metrics, store, tracing
from ..config import postgres_conninfo
from ..consume.lanes import checkpoint_name, label_of, moved_refusal
from ..errors import ConcurrentConsumer, ConfigurationError, StreamGap
from .source import hold_retention
from .streams import hold_retention_many

log = structlog.get_logger(__name__)


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


# -- the transactional sink -------------------------------------------------------------------------------------------

Effect = Callable[[psycopg.Connection[Any], Any], Any]


class TransactionalSink:
    """``foreachBatch`` function: apply a micro-batch's effect and the consumer's checkpoint in one transaction.

    ``effect(conn, df)`` receives the open transaction and the batch's entries that were not applied before (a
    DataFrame, deduplicated by position); it must write its results through ``conn``. With ``strict_start`` a
    producer the consumer never saw must start at position 1 (a rebuild must not silently start mid-history).

    ``stream`` names the one stream the source reads (the checkpoint row is named ``consumer``), or, for a source
    over several streams, is their list, or None for whichever streams a batch holds (a ``streamPrefix`` source).
    Then each stream has its own checkpoint row, ``<consumer>:<stream>``, as a :class:`unilog.MultiConsumer` keeps
    them, all saved in the effect's transaction: positions, gaps and double-sent copies are judged per stream.
    """

    def __init__(
        self,
        database_url: str,
        consumer: str,
        stream: str | Sequence[str] | None,
        effect: Effect,
        *,
        redis_url: str | None = None,
        strict_start: bool = False,
        retry_for: float = 300.0,
    ) -> None:
        self.conninfo = postgres_conninfo(database_url)
        self.redis_url = redis_url  # given: the consumer registers its checkpoint, so trimming never passes it
        self.consumer = consumer
        self.many = not isinstance(stream, str)
        self.streams: tuple[str, ...] | None = (
            (stream,) if isinstance(stream, str) else None if stream is None else tuple(stream)
        )
        self.stream = stream if isinstance(stream, str) else label_of(self.streams or (), None if stream else "")
        self.effect = effect
        self.strict_start = strict_start  # a producer never seen before must start at position 1 (rebuilds)
        self.retry_for = retry_for  # seconds a transient failure of the servers is waited out, per micro-batch
        self._conn: psycopg.Connection[Any] | None = None  # kept between micro-batches; dropped after any error
        self._phases: dict[str, float] = {}

    def __call__(self, batch: Any, batch_id: int) -> None:
        """Apply the micro-batch. A server restarting, ending the session or failing over (a transient failure:
        :func:`unilog.runtime.policy.transient`) is waited out, one log line per retry, for up to ``retry_for``
        seconds: the batch is applied again on a new session, and what it committed already is skipped by
        position. Any other failure, or one that lasts longer, fails the micro-batch (and with it the query)."""
        from ..runtime.waiting import wait_for_servers

        batch = batch.persist()  # read from Redis once, whatever the checks and the effect ask of it
        try:
            wait_for_servers(
                lambda: self._attempt(batch, batch_id),
                name=f"spark {self.consumer}",
                give_up_after=self.retry_for,
                consumer=self.consumer,
            )
        finally:
            batch.unpersist()

    def _attempt(self, batch: Any, batch_id: int) -> None:
        try:
            self._call(batch, batch_id)
        except BaseException:
            self.close()  # the session may be mid-transaction or broken: the next attempt opens a new one
            raise

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
        plan, checkpoints = done
        seconds = time.perf_counter() - started
        metrics.batch_consumed(
            "spark", self.stream, self.consumer, handled=plan.entries, skipped=0, seconds=seconds, first_id=None
        )
        if self.redis_url:
            self._hold_retention(checkpoints)
        log.info(
            "spark batch committed",
            consumer=self.consumer,
            batch=batch_id,
            entries=plan.entries,
            **({"streams": len(plan.last_ids)} if self.many else {"last_id": plan.last_ids[self.stream]}),
            ms=round(seconds * 1000, 1),
            **{k: round(v * 1000, 1) for k, v in self._phases.items()},
        )

    def _hold_retention(self, checkpoints: dict[str, store.Checkpoint]) -> None:
        if self.many:
            hold_retention_many(self.redis_url or "", self.consumer, {s: c.last_id for s, c in checkpoints.items()})
        else:
            hold_retention(self.redis_url or "", self.stream, self.consumer, checkpoints[self.stream].last_id)

    def _row(self, stream: str) -> str:
        """The name of the checkpoint row of ``stream``."""
        return checkpoint_name(self.consumer, stream) if self.many else self.consumer

    def _streams_of(self, batch: Any) -> list[str]:
        """The streams whose rows a batch reads and saves: the one stream, or those the batch holds."""
        if not self.many:
            return [self.stream]
        held = sorted(row["stream"] for row in batch.select("stream").distinct().collect())
        unknown = [s for s in held if self.streams is not None and s not in self.streams]
        if unknown:
            raise ConfigurationError(
                f"spark consumer {self.consumer!r}: the batch holds streams {unknown[:5]} the sink was not given "
                f"({list(self.streams or ())[:5]}): give the sink the source's streams, or None for any"
            )
        return held

    def _commit(self, conn: psycopg.Connection[Any], batch: Any) -> tuple[_Plan, dict[str, store.Checkpoint]] | None:
        """Plan the batch against the checkpoints and apply it; plan again if a checkpoint moved meanwhile."""
        streams = self._streams_of(batch)
        if not streams:
            return None
        with conn.transaction():
            if self.many:
                wanted = {self._row(s): s for s in streams}
                moved = store.single_row_moved(conn, self.consumer, wanted)
                if moved is not None:
                    raise moved_refusal("spark consumer", *moved)
                rows = store.ensure_checkpoints(conn, wanted)
                seen = {s: rows[self._row(s)].positions for s in streams}
            else:
                seen = {self.stream: store.ensure_checkpoint(conn, self.consumer, self.stream).positions}
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

    def _read(self, conn: psycopg.Connection[Any], streams: list[str], lock: bool) -> dict[str, store.Checkpoint]:
        """The streams' checkpoints, each row locked with ``lock``."""
        found = store.read_checkpoints(conn, sorted(self._row(s) for s in streams), lock=lock)
        return {s: found[self._row(s)] for s in streams if self._row(s) in found}

    def _apply(self, conn: psycopg.Connection[Any], batch: Any, plan: _Plan, seen: Positions) -> tuple[Any, Positions]:
        """One transaction: the effect of the entries above the checkpoints, and the checkpoints past them. Returns
        (the saved checkpoints by stream, their positions), or (None, the positions found) if a checkpoint was not
        at ``seen`` (the plan is stale) or moved meanwhile; nothing is committed then.

        Copies of this consumer serialize on an advisory lock, which, unlike the checkpoint's row lock, gives the
        transaction no id: the Spark jobs that compute the effect then hold no transaction id open for long (one held
        back vacuum everywhere, and until issue 33 every record table mode published). The rows are locked only at
        the end, and must be unchanged."""
        streams = sorted(seen)
        with conn.transaction() as tx:
            store.lock_consumer(conn, self.consumer)
            before = self._read(conn, streams, lock=False)
            self._all_there(streams, before)
            if {s: c.positions for s, c in before.items()} != seen:
                raise psycopg.Rollback(tx)  # planned against positions that are no longer the checkpoints'
            fresh = batch if plan.clean else self._fresh(batch, seen).cache()
            started = time.perf_counter()
            try:
                self.effect(conn, fresh)
                self._phases["effect_ms"] = time.perf_counter() - started
            finally:
                if fresh is not batch:
                    fresh.unpersist()
            now = self._read(conn, streams, lock=True)
            self._all_there(streams, now)
            if {s: (c.last_id, c.positions) for s, c in now.items()} != {
                s: (c.last_id, c.positions) for s, c in before.items()
            }:
                before = now
                raise psycopg.Rollback(tx)
            for stream, checkpoint in now.items():
                last_id = plan.last_ids.get(stream)
                if last_id is not None and engine.id_tuple(last_id) > engine.id_tuple(checkpoint.last_id):
                    checkpoint.last_id = last_id
                checkpoint.positions = plan.positions[stream]
            store.save_checkpoints(conn, list(now.values()))
            return now, {s: c.positions for s, c in now.items()}
        return None, {s: c.positions for s, c in before.items()}

    def _all_there(self, streams: list[str], found: dict[str, store.Checkpoint]) -> None:
        """A checkpoint row deleted while a batch was applied (a reset): committing without it would apply the
        batch again after the next start."""
        gone = [self._row(s) for s in streams if s not in found]
        if gone:
            raise ConcurrentConsumer(
                f"spark consumer {self.consumer!r}: checkpoint rows {gone[:5]} were deleted while a batch was applied"
                " (`unilog consumer reset` while the query ran?): nothing of the batch was committed; restart the query"
            )

    def _marked(self, batch: Any, positions: Positions) -> Any:
        """The batch with a column ``_above``: the entry has a position, above the checkpoint's for its producer on
        its stream. One stream's few producers are a condition; many streams' positions a broadcast join (a
        condition per stream and producer would grow the plan Spark analyses with the streams, thousands over a
        prefix)."""
        from pyspark.sql import functions as f

        if not self.many:
            keep = f.col("seq").isNotNull()
            for producer, (epoch, seq) in positions.get(self.stream, {}).items():
                above = (f.col("epoch") > epoch) | ((f.col("epoch") == epoch) & (f.col("seq") > seq))
                keep = keep & ((f.col("producer") != producer) | above)
            return batch.withColumn("_above", keep)
        rows = [(s, p, e, q) for s, producers in positions.items() for p, (e, q) in producers.items()]
        if not rows:
            return batch.withColumn("_above", f.col("seq").isNotNull())
        seen = batch.sparkSession.createDataFrame(rows, "stream string, producer string, _epoch long, _seq long")
        above = f.col("seq").isNotNull() & (
            f.col("_epoch").isNull()
            | (f.col("epoch") > f.col("_epoch"))
            | ((f.col("epoch") == f.col("_epoch")) & (f.col("seq") > f.col("_seq")))
        )
        joined = batch.join(f.broadcast(seen), on=["stream", "producer"], how="left")
        return joined.withColumn("_above", above).drop("_epoch", "_seq").select(*batch.columns, "_above")

    def _fresh(self, batch: Any, positions: Positions) -> Any:
        """Entries above the checkpoint's position for their producer, one per position."""
        marked = self._marked(batch, positions)
        return marked.filter("_above").drop("_above").dropDuplicates(["stream", "producer", "epoch", "seq"])

    def _plan(self, batch: Any, positions: Positions) -> _Plan | None:
        """One Spark job over the batch: its size, each stream's last id, and the checkpoints' positions after it
        (None for an empty batch). Raises :class:`StreamGap` if the batch skips positions."""
        from pyspark.sql import functions as f

        seq = f.when(f.col("_above"), f.col("seq"))
        stats = (
            self._marked(batch, positions)
            .groupBy("stream", "producer", "epoch")
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
        stream_of = (lambda row: row["stream"]) if self.many else (lambda _row: self.stream)
        others = sorted({row["stream"] for row in stats} - {self.stream}) if not self.many else []
        if others:  # judged against one stream's positions, their records would be skipped or called gaps
            raise ConfigurationError(
                f"spark consumer {self.consumer!r}: the sink was given stream {self.stream!r} and the batch holds "
                f"streams {others[:5]}: give the sink the source's streams (a list, or None for any)"
            )
        last_ids: dict[str, tuple[int, int]] = {}
        for row in stats:
            last_ids[stream_of(row)] = max(
                last_ids.get(stream_of(row), (0, 0)), (row["last"]["id_ms"], row["last"]["id_seq"])
            )
        updated = {stream: dict(producers) for stream, producers in positions.items()}
        for row in sorted((r for r in stats if r["n"]), key=lambda r: (r["stream"], r["producer"], r["epoch"])):
            self._check(row, updated.setdefault(stream_of(row), {}))
        entries = sum(int(r["entries"]) for r in stats)
        # every entry has a position above the checkpoint and no position is there twice (the usual batch): the
        # effect gets the batch as it is, without the filter and the de-duplication's shuffle
        clean = entries == sum(int(r["n"]) for r in stats)
        return _Plan(entries, {s: f"{ms}-{sq}" for s, (ms, sq) in last_ids.items()}, updated, clean)

    def _check(self, row: Any, producers: dict[str, tuple[int, int]]) -> None:
        """Move ``producers`` (a stream's positions) past a row of the plan's statistics; raise :class:`StreamGap`
        if the row's positions do not follow on."""
        seen = producers.get(row["producer"])
        expected = 1 if seen is None or seen[0] != row["epoch"] else seen[1] + 1
        contiguous = row["n"] == row["hi"] - row["lo"] + 1
        checked_start = seen is not None or self.strict_start
        if not contiguous or (checked_start and row["lo"] != expected):
            on = f" on stream {row['stream']!r}" if self.many else ""
            raise StreamGap(
                f"spark consumer {self.consumer!r}: producer {row['producer']!r} positions are missing{on} in "
                f"epoch {row['epoch']} (expected {expected}, batch has {row['lo']}..{row['hi']} with {row['n']}"
                " entries): trimmed or lost; repair with `unilog reconcile --repair`"
            )
        producers[row["producer"]] = (int(row["epoch"]), int(row["hi"]))


# a checkpoint's positions per stream: stream -> producer -> (epoch, seq)
Positions = dict[str, dict[str, tuple[int, int]]]


@dataclass(frozen=True)
class _Plan:
    """What a micro-batch will do to the checkpoints: entries in it, each stream's last stream id, the positions
    after it, and whether every entry is new and there once (``clean``)."""

    entries: int
    last_ids: dict[str, str]
    positions: Positions
    clean: bool = False
