"""Where a record goes when its stream is partitioned: shared by the streamer (which routes) and the partitioned
consumer (which reads the partitions), so neither side imports the other."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from .store import StagedRow
from .wire import Packed, PublishRow, pack_rows


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
    for row_id, action, obj, data, key, created, traceparent, tracestate in rows:
        partition = partition_of(key if key is not None else str(row_id), count) if count > 1 else None
        target = stream if partition is None else partition_stream(stream, partition)
        targets.setdefault(target, []).append((data, action, obj, created, key, traceparent, tracestate))
    return {target: pack_rows(payload) for target, payload in targets.items()}
