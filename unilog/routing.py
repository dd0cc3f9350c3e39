"""Where a record goes when its stream is partitioned: shared by the streamer (which routes) and the partitioned
consumer (which reads the partitions), so neither side imports the other."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from .store import StagedRow
from .store.pgoutput import WalRow
from .wire import Packed, PublishRow, first_created_ms, nth_bulk, pack_record, pack_rows, pad_tail, tail_arguments


def partition_of(key: str, count: int) -> int:
    """The partition of ``key`` among ``count``: stable across processes and versions (crc32, not ``hash``)."""
    return zlib.crc32(key.encode()) % count


def partition_stream(stream: str, index: int) -> str:
    """The name of partition ``index`` of ``stream``."""
    return f"{stream}.p{index}"


def split(stream: str, count: int, rows: Sequence[StagedRow]) -> dict[str, Packed]:
    """A batch's payload per target stream: ``stream`` itself, or its ``count`` partitions by key (in batch order;
    records without a key are spread by their staged id)."""
    targets: dict[str, list[PublishRow]] = {}
    for row_id, action, obj, data, key, created, traceparent, tracestate, typed in rows:
        partition = partition_of(key if key is not None else str(row_id), count) if count > 1 else None
        target = stream if partition is None else partition_stream(stream, partition)
        targets.setdefault(target, []).append((data, action, obj, created, key, traceparent, tracestate, typed))
    return {target: pack_rows(payload) for target, payload in targets.items()}


def split_wal(stream: str, count: int, records: Sequence[WalRow], plain: bool = False) -> dict[str, Packed]:
    """:func:`split` for a WAL batch: record messages arrive already encoded, and are only concatenated (their
    key read back from the encoding when the stream is partitioned; one without a key is spread by its mark); staged
    rows among them are encoded alike. ``plain``: every record is an untraced message (the decoder knows)."""
    if count <= 1 and (plain or all(row is None and not tail for _s, row, _m, _b, tail in records)):
        # untraced messages (the usual batch, or a stream's part of one over many streams): concatenated
        return {stream: Packed(len(records), b"".join([body for *_, body, _t in records]), 5)}
    stride = _wal_stride(records)
    targets: dict[str, list[bytes]] = {}
    for record in records:
        _stream, row, _mark, body, tail = record
        if row is None:
            encoded = body + pad_tail(tail, stride) if stride > 5 else body
        else:
            _id, action, obj, data, key, created, traceparent, tracestate, typed = row
            encoded = pack_record((data, action, obj, created, key, traceparent, tracestate, typed), stride)
        target = stream if count <= 1 else partition_stream(stream, partition_of(_spread_key(record), count))
        targets.setdefault(target, []).append(encoded)
    return {target: Packed(len(parts), b"".join(parts), stride) for target, parts in targets.items()}


def _wal_stride(records: Sequence[WalRow]) -> int:
    """The arguments per record of a WAL batch: 8 if any record is typed, 7 if any is traced, else 5 (a record
    message's tail holds three arguments when it is typed, two when only traced)."""
    stride = 5
    for _s, row, _m, _b, tail in records:
        if row is not None:
            if row[8]:
                return 8
            if row[6]:
                stride = 7
        elif tail:
            if tail_arguments(tail) == 3:
                return 8
            stride = 7
    return stride


def _spread_key(record: WalRow) -> str:
    """What routes a WAL record to a partition: its key; without one, its staged id or its message's mark."""
    _stream, row, mark, body, _trace = record
    if row is not None:
        return row[4] if row[4] is not None else str(row[0])
    lsn, ordinal = mark or (0, 0)
    return nth_bulk(body, 4) or f"{lsn}:{ordinal}"


def created_ms(record: WalRow) -> int | None:
    """A WAL record's created time in ms since the epoch (for the publish-lag metrics)."""
    row = record[1]
    return first_created_ms(record[3]) if row is None else row[5]
