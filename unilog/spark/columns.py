"""The Spark source's columns: Arrow record batches built from Redis's raw ``XRANGE`` replies, column by column.

Spark takes a Python data source's ``pyarrow.RecordBatch`` as it is (rows as tuples are converted one by one), so
the reader slices each page of entries into columns here, in C where it can: entries that share one field layout
(one publisher's) are sliced per field; text that is not UTF-8 or numbers that are not numbers (a foreign entry)
are replaced, never a crash.
"""

from __future__ import annotations

import functools
import operator
from typing import Any

SCHEMA = (
    "stream string, id string, id_ms long, id_seq long, producer string, epoch long, seq long, action string, "
    "object string, key string, data string, created_ms long, traceparent string, type string"
)


_FIELDS = (b"producer", b"epoch", b"seq", b"action", b"object", b"key", b"data", b"created", b"traceparent", b"type")


def _positions(names: tuple[bytes, ...], size: int) -> list[int | None]:
    """Where each of ``_FIELDS``'s values is in a flat ``[field, value, ...]`` list of ``size`` items laid out as
    ``names`` (None: missing). A field given twice keeps its last value; a dangling name has none."""
    where = {name: 2 * i + 1 for i, name in enumerate(names) if 2 * i + 1 < size}
    return [where.get(name) for name in _FIELDS]


def _field_columns(chunk: list[Any]) -> list[Any]:
    """The values of ``_FIELDS`` as columns. Entries that all share one field layout (the usual chunk: one
    publisher) are sliced column by column in C; mixed layouts are picked entry by entry."""
    flats = [flat for _, flat in chunk]
    layouts = {(tuple(flat[0::2]), len(flat)) for flat in flats}
    if len(layouts) == 1:
        at = _positions(*layouts.pop())
        return [[None] * len(flats) if i is None else list(map(operator.itemgetter(i), flats)) for i in at]
    rows = []
    for flat in flats:
        at = _positions(tuple(flat[0::2]), len(flat))
        rows.append([None if i is None else flat[i] for i in at])
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in _FIELDS]


def record_batch(stream: str, chunk: list[Any]) -> Any:
    """An Arrow record batch of ``SCHEMA`` from raw ``XRANGE`` entries ``[id, [field, value, ...]]``."""
    import pyarrow as pa

    producer, epoch, seq, action, obj, key, data, created, trace, typed = _field_columns(chunk)
    ids = [entry_id for entry_id, _ in chunk]
    parts = [entry_id.partition(b"-") for entry_id in ids]
    schema = _arrow_schema()
    columns = [
        [stream] * len(ids),
        ids,
        [int(p[0]) for p in parts],
        [int(p[2]) for p in parts],
        [p or b"" for p in producer],
        epoch,
        seq,
        action,
        obj,
        key,
        data,
        created,
        trace,
        typed,
    ]
    arrays = [_ints(col) if f.type == pa.int64() else _texts(col) for col, f in zip(columns, schema, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _texts(column: Any) -> Any:
    import pyarrow as pa

    try:
        return pa.array(column, type=pa.string())
    except (pa.ArrowInvalid, UnicodeDecodeError):  # text that is not UTF-8 (a foreign entry): replace, don't crash
        return pa.array(_utf8(column), type=pa.string())


def _ints(column: Any) -> Any:
    """Numbers sent as text: parsed by Arrow; any that is not one (another writer's or a damaged entry) is null,
    never a crashed read."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if column and isinstance(column[0], int):
        return pa.array(column, type=pa.int64())
    try:
        return pc.cast(pa.array(column, type=pa.string()), pa.int64())
    except (pa.ArrowInvalid, UnicodeDecodeError):
        return pa.array([_number(v) for v in column], type=pa.int64())


def _number(value: bytes | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _utf8(column: list[Any]) -> list[Any]:
    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in column]


@functools.cache
def _arrow_schema() -> Any:
    import pyarrow as pa

    types = {"string": pa.string(), "long": pa.int64()}
    return pa.schema([(name, types[kind]) for name, kind in (c.split() for c in SCHEMA.split(", "))])
