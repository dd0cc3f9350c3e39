"""Partitioned consumers: records with the same key handled in order, by one worker at a time, keys in parallel.

A stream split into P partitions (``unilog stream partition STREAM P``) is published by the streamer as P streams
``STREAM.p0 .. STREAM.p{P-1}``; a record goes to partition ``crc32(key) % P`` (records without a key are spread by
their staged id), with dense positions per partition. A partitioned consumer NAME is P checkpoint consumers,
``NAME.p0 ..``, each reading one partition in order with its checkpoint in the transaction of its effects.

Workers divide the partitions among themselves: each holds a Postgres advisory lock per partition it owns
(released when its session dies, so a killed worker's partitions are free at once), heartbeats in Redis, and
re-balances every ``rebalance_interval``: it takes free partitions up to its fair share, ``ceil(P / live workers)``,
and gives back what it holds beyond it. Because a partition is applied from its committed checkpoint by whoever
owns it, and the checkpoint row is locked while a batch applies, a key's records are applied in stream order,
exactly once, across ownership changes.

Choosing: a consumer group (:mod:`unilog.consume.group`) spreads records over workers one by one, with no order between
them, and recovers a dead worker's records after ``claim_idle_ms``; partitions keep per-key order, recover at once,
but parallelism is capped at P and a slow key slows its whole partition. Like Kafka partitions: pick partitions
when order per aggregate matters, groups when it does not.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ..routing import partition_of, partition_stream
from ._sync.partitions import PartitionedConsumer
from .settings import PartitionConfig

if TYPE_CHECKING:
    from ._async.partitions import AsyncPartitionedConsumer


def __getattr__(name: str) -> Any:
    """The asyncio face on first use: a threaded process does not import the asyncio clients (0.2 s of start-up)."""
    if name in {"AsyncPartitionedConsumer"}:
        return getattr(importlib.import_module("._async.partitions", __package__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AsyncPartitionedConsumer", "PartitionConfig", "PartitionedConsumer", "partition_of", "partition_stream"]
