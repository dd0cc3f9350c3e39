"""Reconciliation on Spark: recompute canonical aggregates from the source table and compare each consumer's state
at its checkpoint, exactly, while everything keeps running; ``repair`` resets a diverged consumer in one transaction.

How it is exact without stopping the fleet: the driver opens a REPEATABLE READ transaction on the producer database
and exports its snapshot; Spark executors read the source table in parallel id ranges *in that same snapshot*
(``SET TRANSACTION SNAPSHOT``, as ``pg_dump -j`` does). In that snapshot the streamer's position for the stream,
``last_seq``, and the staged records are consistent with the source table (the streamer deletes records and advances
the position in one transaction). So:

* state at ``last_seq`` = canonical(source table) - aggregate(records still staged in the snapshot);
* state at a consumer's checkpoint ``c`` = state at ``last_seq`` -/+ aggregate(stream entries between c and
  ``last_seq``) (those entries are retained: trimming never passes a registered consumer).

What is aggregated is the application's business: a :class:`Model` says which table, how to turn log records into
the same rows, how to total rows on Spark, and how to read and overwrite a consumer's state.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg
import structlog

from .. import engine, store
from ..config import Settings
from ..errors import ConfigurationError

log = structlog.get_logger(__name__)


class Totals(Protocol):
    """An aggregate that can be added and subtracted (sum, count, checksum...)."""

    def __add__(self, other: Any) -> Any: ...
    def __sub__(self, other: Any) -> Any: ...


class Model(Protocol):
    """What reconciliation needs to know about an application.

    ``table`` has a BIGINT ``id``; ``columns`` are read from it. ``rows_from_records(records)`` maps decoded log
    records (dicts of their ``data``, with ``action``/``object``) to the same rows (or None to ignore one).
    ``totals(df)`` aggregates a Spark DataFrame of rows; ``empty`` is the zero. ``states(conn)`` reads every
    consumer's state; ``repair(conn, name, totals)`` overwrites one.
    """

    table: str
    columns: tuple[str, ...]
    spark_schema: str
    empty: Any

    def rows_from_records(self, records: list[dict[str, Any]]) -> list[tuple[Any, ...]]: ...
    def totals(self, df: Any) -> Any: ...
    def states(self, conn: psycopg.Connection[Any]) -> dict[str, Any]: ...
    def repair(self, conn: psycopg.Connection[Any], name: str, totals: Any) -> None: ...


@dataclass
class ConsumerReport:
    """One consumer: its state, what it should be at its checkpoint, and whether they agree."""

    name: str
    position: tuple[int, int] | None
    expected: Any
    actual: Any
    agree: bool
    repaired: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "position": list(self.position) if self.position else None,
            "expected": _plain(self.expected),
            "actual": _plain(self.actual),
            "agree": self.agree,
            "repaired": self.repaired,
        }


@dataclass
class Report:
    """The outcome of a reconciliation."""

    stream: str
    producer: str
    epoch: int
    last_seq: int
    canonical: Any
    consumers: list[ConsumerReport] = field(default_factory=list)

    @property
    def agree(self) -> bool:
        return all(c.agree or c.repaired for c in self.consumers)

    def as_dict(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "producer": self.producer,
            "epoch": self.epoch,
            "last_seq": self.last_seq,
            "canonical": _plain(self.canonical),
            "consumers": [c.as_dict() for c in self.consumers],
            "agree": self.agree,
        }


def _plain(value: Any) -> Any:
    if hasattr(value, "as_dict"):
        return value.as_dict()
    return json.loads(json.dumps(value, default=str))


def _read_range(conninfo: str, snapshot: str, table: str, columns: tuple[str, ...], lo: int, hi: int) -> Iterator[Any]:
    """Rows of ``table`` with ``lo <= id < hi`` as of the exported ``snapshot`` (runs on an executor)."""
    with store.connect(conninfo, application_name="unilog-reconcile") as conn:
        store.import_snapshot(conn, snapshot)
        yield from store.rows_between(conn, table, columns, lo, hi)
        conn.rollback()


def reconcile(
    spark: Any, settings: Settings, model: Model, *, stream: str | None = None, slices: int = 8, repair: bool = False
) -> Report:
    """Compare every checkpoint consumer of ``stream`` with the canonical state at its checkpoint; repair on request."""
    stream = stream or settings.stream
    conninfo = settings.conninfo
    with store.connect(conninfo, application_name="unilog-reconcile") as snap:
        snapshot = store.export_snapshot(snap)
        identity = store.producer_identity(snap)
        last_seq = store.last_published_seq(snap, stream, identity.epoch)
        bounds = store.id_bounds(snap, model.table)
        sources = [stream, "" if stream == settings.stream else stream]
        staged = [{"action": a, "object": o, **data} for a, o, data in store.staged_records(snap, sources)]
        canonical = _canonical(spark, model, conninfo, snapshot, bounds, slices)  # while the snapshot is held
        snap.rollback()
    at_last = canonical - _records_totals(spark, model, staged)
    report = Report(stream, identity.producer_id, identity.epoch, last_seq, canonical)
    api = engine.RedisStreams(engine.connect(settings.redis_url))
    try:
        with store.connect(conninfo, application_name="unilog-reconcile") as conn:
            states = model.states(conn)
            for checkpoint in store.list_checkpoints(conn):
                if checkpoint.stream != stream:
                    continue
                report.consumers.append(
                    _compare(spark, model, api, conn, checkpoint, states, identity, last_seq, at_last, repair)
                )
    finally:
        api.close()
    return report


def _canonical(spark: Any, model: Model, conninfo: str, snapshot: str, bounds: Any, slices: int) -> Any:
    lo, hi = int(bounds[0]), int(bounds[1]) + 1
    step = max(1, -(-(hi - lo) // slices))
    ranges = [(a, min(a + step, hi)) for a in range(lo, hi, step)] or [(0, 0)]
    table, columns = model.table, model.columns
    rdd = spark.sparkContext.parallelize(ranges, len(ranges)).flatMap(
        lambda r: _read_range(conninfo, snapshot, table, columns, r[0], r[1])
    )
    return model.totals(spark.createDataFrame(rdd, model.spark_schema))


def _records_totals(spark: Any, model: Model, records: list[dict[str, Any]]) -> Any:
    rows = model.rows_from_records(records)
    if not rows:
        return model.empty
    return model.totals(spark.createDataFrame(rows, model.spark_schema))


def _entries_between(api: engine.RedisStreams, stream: str, producer: str, epoch: int, lo: int, hi: int) -> list:
    """Decoded records of ``producer`` with lo < seq <= hi in ``epoch`` (one per position)."""
    found: dict[int, dict[str, Any]] = {}
    for _entry_id, fields in api.entries(stream):
        text = {k.decode(): v.decode() for k, v in fields.items()}
        seq = int(text.get("seq", 0))
        if text.get("producer") == producer and int(text.get("epoch", 0)) == epoch and lo < seq <= hi:
            found[seq] = {"action": text.get("action"), "object": text.get("object"), **json.loads(text["data"])}
    if len(found) != hi - lo:
        raise ConfigurationError(
            f"the stream no longer holds positions {lo + 1}..{hi} of {producer}: cannot place the checkpoint"
        )
    return list(found.values())


def _entry_id_of(api: engine.RedisStreams, stream: str, producer: str, epoch: int, seq: int) -> str:
    """The stream id of position (epoch, seq) of ``producer`` (``0-0`` for seq 0)."""
    if seq == 0:
        return "0-0"
    for entry_id, fields in api.entries(stream, "+", "-", reverse=True):
        if (
            fields.get(b"producer") == producer.encode()
            and int(fields.get(b"epoch", 0)) == epoch
            and int(fields.get(b"seq", 0)) == seq
        ):
            return engine.to_str(entry_id)
    raise ConfigurationError(f"position {epoch}:{seq} of {producer} is not in the stream {stream!r}")


def _compare(
    spark: Any,
    model: Model,
    api: engine.RedisStreams,
    conn: psycopg.Connection[Any],
    checkpoint: store.Checkpoint,
    states: dict[str, Any],
    identity: store.ProducerIdentity,
    last_seq: int,
    at_last: Any,
    repair: bool,
) -> ConsumerReport:
    position = checkpoint.positions.get(identity.producer_id)
    seq = position[1] if position and position[0] == identity.epoch else 0
    if seq <= last_seq:
        delta = _entries_between(api, checkpoint.stream, identity.producer_id, identity.epoch, seq, last_seq)
        expected = at_last - _records_totals(spark, model, delta)
    else:
        delta = _entries_between(api, checkpoint.stream, identity.producer_id, identity.epoch, last_seq, seq)
        expected = at_last + _records_totals(spark, model, delta)
    actual = states.get(checkpoint.name, model.empty)
    report = ConsumerReport(checkpoint.name, position, expected, actual, actual == expected)
    if not report.agree and repair:
        _repair(model, api, conn, checkpoint, identity, last_seq, at_last)
        report.repaired = True
    return report


def _repair(
    model: Model,
    api: engine.RedisStreams,
    conn: psycopg.Connection[Any],
    checkpoint: store.Checkpoint,
    identity: store.ProducerIdentity,
    last_seq: int,
    at_last: Any,
) -> None:
    """Set the consumer's state to the canonical state at ``last_seq`` and its checkpoint there, in one transaction."""
    entry_id = _entry_id_of(api, checkpoint.stream, identity.producer_id, identity.epoch, last_seq)
    with conn.transaction():
        locked = store.lock_checkpoint(conn, checkpoint.name)
        assert locked is not None
        model.repair(conn, checkpoint.name, at_last)
        locked.positions[identity.producer_id] = (identity.epoch, last_seq)
        locked.last_id = entry_id
        store.save_checkpoint(conn, locked)
    log.warning("consumer repaired", consumer=checkpoint.name, last_seq=last_seq, last_id=entry_id)
