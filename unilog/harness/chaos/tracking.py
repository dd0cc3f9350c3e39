"""The consumer wrappers: every record a consumer applies is recorded in ``chaos_applied``, in its transaction."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg

from unilog import Handler, Record

from . import tables

POISON_OBJECT, POISON_ACTION = "chaos", "poison"


class PoisonRecord(Exception):
    """Raised by a group's tracked handler for a poison record: it must end up in the dead letters."""


def record_cid(record: Record) -> str:
    """A record's chaos id: ``data["cid"]``, else ``<object>-<id>`` for a source row's record, else its position."""
    pos = record.position
    return cid_of(record.object, record.data, record.producer, pos, record.id)


def cid_of(obj: str | None, data: Any, producer: str, position: tuple[int, int] | None, entry_id: str) -> str:
    """The chaos id of a record given its parts (for consumers that do not see :class:`Record` objects, Spark)."""
    if isinstance(data, dict):
        if data.get("cid") is not None:
            return str(data["cid"])
        if obj and data.get("id") is not None:
            return f"{obj}-{data['id']}"
    return f"{producer}:{position[0]}:{position[1]}" if position else entry_id


def is_poison(record: Record) -> bool:
    data = record.data
    return record.object == POISON_OBJECT and isinstance(data, dict) and bool(data.get("poison"))


class _WithoutPoison(Sequence[Record]):
    """The batch minus its poison records. Iterating it iterates the original batch, so an injected mid-batch crash
    still happens inside the handler."""

    def __init__(self, batch: Sequence[Record], keep: Sequence[int]) -> None:
        self._batch = batch
        self._keep = set(keep)
        self._records = [batch[i] for i in keep]
        self.consumer = getattr(batch, "consumer", "")

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, index: Any) -> Any:
        return self._records[index]

    def __iter__(self) -> Iterator[Record]:
        for i, record in enumerate(self._batch):
            if i in self._keep:
                yield record


def tracked(handler: Handler, *, fail_poison: bool = False, consumer: str | None = None) -> Handler:
    """Wrap ``handler`` so that, in the transaction unilog gives it, every record of the batch is first recorded in
    ``chaos_applied`` under the consumer's name, then the handler runs on the batch without poison records.

    Recording before the handler runs means a handler that commits on its own (its state and unilog's checkpoint
    then commit separately) leaves its tracking rows committed too, so a replay shows up as a record applied twice.
    With ``fail_poison`` (consumer groups) a batch holding a poison record raises :class:`PoisonRecord`: the group
    retries the others one by one and dead-letters the poison.
    """

    def wrapped(conn: psycopg.Connection[Any], records: Sequence[Record]) -> Any:
        name = consumer or getattr(records, "consumer", "") or "consumer"
        items = [records[i] for i in range(len(records))]  # indexing: a mid-batch crash is left to the handler
        poison = [i for i, r in enumerate(items) if is_poison(r)]
        if poison and fail_poison:
            raise PoisonRecord("poison records " + ", ".join(record_cid(items[i]) for i in poison))
        if items:
            tables.track(conn, name, [record_cid(r) for r in items], [r.id for r in items])
        if not poison:
            return handler(conn, records)
        keep = [i for i in range(len(items)) if i not in set(poison)]
        return handler(conn, _WithoutPoison(records, keep)) if keep else None

    wrapped.__name__ = f"tracked_{getattr(handler, '__name__', 'handler')}"
    return wrapped


def tracked_spark_effect(name: str, effect: Any) -> Any:
    """A Spark sink effect (``effect(conn, df)``) that first records the batch's records in ``chaos_applied``, in the
    sink's transaction, like :func:`tracked` does for Python handlers."""

    def run(conn: psycopg.Connection[Any], fresh: Any) -> Any:
        rows = fresh.select("id", "producer", "epoch", "seq", "object", "data").collect()
        cids, ids = [], []
        for row in rows:
            data = json.loads(row["data"]) if row["data"] else None
            position = (int(row["epoch"]), int(row["seq"])) if row["seq"] is not None else None
            cids.append(cid_of(row["object"], data, row["producer"] or "", position, row["id"]))
            ids.append(row["id"])
        if cids:
            tables.track(conn, name, cids, ids)
        return effect(conn, fresh)

    return run
