"""Where a record goes when its stream is partitioned: shared by the streamer (which routes) and the partitioned
consumer (which reads the partitions), so neither side imports the other."""

from __future__ import annotations

import zlib


def partition_of(key: str, count: int) -> int:
    """The partition of ``key`` among ``count``: stable across processes and versions (crc32, not ``hash``)."""
    return zlib.crc32(key.encode()) % count


def partition_stream(stream: str, index: int) -> str:
    """The name of partition ``index`` of ``stream``."""
    return f"{stream}.p{index}"
