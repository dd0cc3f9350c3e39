"""A partitioned stream: its partition count, and the live workers of each partitioned consumer (heartbeats).

What a partition worker of either face asks (the count, heartbeats, leaving) is generated from
:mod:`unilog.engine._async.partitions`; splitting a stream is the threaded face's only."""

from __future__ import annotations

from importlib import resources
from typing import Any

from ..errors import ConfigurationError
from ..wire import meta_key
from ._sync.partitions import PartitionsCore
from .commands import issues, script_commands
from .nodes import clustered

# partitions_many.lua (package data): many streams' partition counts in one call on a single Redis
PARTITIONS_MANY_LUA = (resources.files(__package__) / "partitions_many.lua").read_text(encoding="utf-8")
PARTITIONS_CHUNK = 10_000  # streams per call: a call blocks Redis while it runs


class Partitions(PartitionsCore):
    """How many partitions a stream has, splitting it, and which workers of a partitioned consumer are alive."""

    @issues("eval", "hget", *script_commands(PARTITIONS_MANY_LUA))
    def partitions_many(self, streams: list[str]) -> dict[str, int]:
        """:meth:`partitions` of each of ``streams`` in one call (a script on a single Redis; a pipeline of ``HGET``
        on a cluster, whose streams live in different slots), not one round trip per stream."""
        values: list[Any] = []
        if clustered(self.client):
            pipe = self.client.pipeline(transaction=False)
            for stream in streams:
                pipe.hget(meta_key(stream), "partitions")
            values = pipe.execute() if streams else []
        else:
            for lo in range(0, len(streams), PARTITIONS_CHUNK):
                keys = [meta_key(stream) for stream in streams[lo : lo + PARTITIONS_CHUNK]]
                values += self.client.eval(PARTITIONS_MANY_LUA, len(keys), *keys)
        return {stream: int(value) if value else 1 for stream, value in zip(streams, values, strict=True)}

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
