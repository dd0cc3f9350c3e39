"""Registering a consumer's checkpoint for retention: what a consumer of either face asks of Redis. The rest of
retention's bookkeeping (the registry read, trimming) is threaded only: :class:`~unilog.engine.retention.Retention`.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...wire import registry_key
from ..commands import issues
from .base import AsyncAdapter


class AsyncRetentionCore(AsyncAdapter):
    """A consumer's registered checkpoint on a stream, which trimming never passes."""

    @issues("hset")
    async def register(self, stream: str, consumer: str, last_id: str) -> None:
        """Record ``consumer``'s checkpoint on ``stream`` (after its commit), so trimming never passes it."""
        await self.client.hset(registry_key(stream), consumer, last_id)

    @issues("hset")
    async def register_many(self, checkpoints: Mapping[tuple[str, str], str]) -> None:
        """:meth:`register` each of ``checkpoints`` ((stream, consumer) -> last id), in one pipeline."""
        pipe = self.client.pipeline(transaction=False)
        for (stream, consumer), last_id in checkpoints.items():
            pipe.hset(registry_key(stream), consumer, last_id)
        await pipe.execute()
