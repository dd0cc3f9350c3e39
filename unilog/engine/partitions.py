"""A partitioned stream: its partition count, and the live workers of each partitioned consumer (heartbeats)."""

from __future__ import annotations

import time

from ..errors import ConfigurationError
from ..wire import meta_key, workers_key
from ._sync.base import Adapter
from .commands import issues


class Partitions(Adapter):
    """How many partitions a stream has, and which workers of a partitioned consumer are alive."""

    @issues("hget")
    def partitions(self, stream: str) -> int:
        """How many partitions ``stream`` is split into (1: not partitioned)."""
        value = self.client.hget(meta_key(stream), "partitions")
        return int(value) if value else 1

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

    @issues("zadd", "zremrangebyscore", "zcard")
    def heartbeat(self, stream: str, consumer: str, worker: str, ttl: float) -> int:
        """Mark ``worker`` of partitioned consumer ``consumer`` alive now, forget workers silent for ``ttl`` seconds,
        and return how many are alive (one round trip)."""
        key, now = workers_key(stream, consumer), time.time()
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(key, {worker: now})
        pipe.zremrangebyscore(key, "-inf", now - ttl)
        pipe.zcard(key)
        return int(pipe.execute()[2])

    @issues("zrem")
    def leave(self, stream: str, consumer: str, worker: str) -> None:
        """Take ``worker`` out of the live workers at once (the others re-balance without waiting for its ttl)."""
        self.client.zrem(workers_key(stream, consumer), worker)
