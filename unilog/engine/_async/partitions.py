"""A partitioned stream as a partition worker of either face sees it: the partition count, and the live workers of
its partitioned consumer (heartbeats). Splitting a stream is threaded only: :class:`~unilog.engine.partitions.
Partitions`."""

from __future__ import annotations

import time

from ...wire import meta_key, workers_key
from ..commands import issues
from .base import AsyncAdapter


class AsyncPartitionsCore(AsyncAdapter):
    """How many partitions a stream has, and which workers of a partitioned consumer are alive."""

    @issues("hget")
    async def partitions(self, stream: str) -> int:
        """How many partitions ``stream`` is split into (1: not partitioned)."""
        value = await self.client.hget(meta_key(stream), "partitions")
        return int(value) if value else 1

    @issues("zadd", "zremrangebyscore", "zcard")
    async def heartbeat(self, stream: str, consumer: str, worker: str, ttl: float) -> int:
        """Mark ``worker`` of partitioned consumer ``consumer`` alive now, forget workers silent for ``ttl`` seconds,
        and return how many are alive (one round trip)."""
        key, now = workers_key(stream, consumer), time.time()
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(key, {worker: now})
        pipe.zremrangebyscore(key, "-inf", now - ttl)
        pipe.zcard(key)
        return int((await pipe.execute())[2])

    @issues("zrem")
    async def leave(self, stream: str, consumer: str, worker: str) -> None:
        """Take ``worker`` out of the live workers at once (the others re-balance without waiting for its ttl)."""
        await self.client.zrem(workers_key(stream, consumer), worker)
