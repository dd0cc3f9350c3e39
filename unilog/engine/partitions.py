"""A partitioned stream: its partition count, and the live workers of each partitioned consumer (heartbeats).

What a partition worker of either face asks (the count, heartbeats, leaving) is generated from
:mod:`unilog.engine._async.partitions`; splitting a stream is the threaded face's only."""

from __future__ import annotations

from ..errors import ConfigurationError
from ..wire import meta_key
from ._sync.partitions import PartitionsCore
from .commands import issues


class Partitions(PartitionsCore):
    """How many partitions a stream has, splitting it, and which workers of a partitioned consumer are alive."""

    @issues("hsetnx", via=("partitions",))
    def set_partitions(self, stream: str, count: int) -> None:
        """Split ``stream`` into ``count`` partitions by key. A count, once set, cannot change: moving keys between
        partitions would break their order."""
        if not self.client.hsetnx(meta_key(stream), "partitions", count):
            current = self.partitions(stream)
            if current != count:
                raise ConfigurationError(
                    f"stream {stream!r} already has {current} partitions; changing it would reorder keys "
                    "(create a new stream instead)"
                )
