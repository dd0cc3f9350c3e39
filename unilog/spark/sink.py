"""The transactional sink: a ``foreachBatch`` function that applies a micro-batch's effect and the consumer's
checkpoint in one Postgres transaction, by position (see :mod:`unilog.spark`)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog

from .. import engine, metrics, store, tracing
from ..config import postgres_conninfo
from ..errors import ConcurrentConsumer, StreamGap
from .source import hold_retention

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
        retry_for: float = 300.0,
    ) -> None:
        self.conninfo = postgres_conninfo(database_url)
        self.redis_url = redis_url  # given: the consumer registers its checkpoint, so trimming never passes it
        self.consumer = consumer
        self.stream = stream
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
        plan, checkpoint = done
        seconds = time.perf_counter() - started
        metrics.batch_consumed(
            "spark", self.stream, self.consumer, handled=plan.entries, skipped=0, seconds=seconds, first_id=None
        )
        if self.redis_url:
            hold_retention(self.redis_url, self.stream, self.consumer, checkpoint.last_id)
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
