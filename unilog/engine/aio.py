"""The Redis commands of the asyncio consumer (:class:`unilog.AsyncConsumer`), on redis-py's asyncio client.

Part of the Redis adapter: the same keys, replies and refusals as :class:`~unilog.engine.RedisStreams`, and the
client configured the same way (redis-py's own retries off: unilog retries whole passes, whose outcome it knows).
A ``redis+cluster://`` URL gives redis-py's asyncio cluster client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ..wire import dlq_key, letter_fields, registry_key, to_str
from .refusals import CLUSTER_SCHEMES, cluster_options

Entry = tuple[bytes, dict[bytes, bytes]]


def connect_async(url: str, *, socket_timeout: float | None = 10.0) -> Any:
    """An asyncio client for ``url`` (a single Redis, or a cluster by ``redis+cluster://``); connects lazily."""
    common: dict[str, Any] = {
        "retry": Retry(NoBackoff(), 0),
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": 10.0,
        "decode_responses": False,
    }
    if url.split("://", 1)[0].lower() in CLUSTER_SCHEMES:
        nodes, options = cluster_options(url)
        return aredis.RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in nodes], **common, **options)
    return aredis.Redis.from_url(url, retry_on_timeout=False, health_check_interval=30, **common)


class AsyncRedisStreams:
    """What the asyncio consumer asks of Redis. Same contracts as the methods of the same names on
    :class:`~unilog.engine.RedisStreams`."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def read(self, stream: str, after_id: str, count: int, block_ms: int | None) -> list[Entry]:
        """Up to ``count`` entries after ``after_id``, waiting up to ``block_ms`` if there are none yet."""
        reply: Any = await self.client.xread({stream: after_id}, count=count, block=block_ms)
        if not reply:
            return []
        return list(reply[0][1])

    async def last_generated_id(self, stream: str) -> str | None:
        """The id of the last entry ever added to ``stream``, or None if it does not exist."""
        try:
            info: Any = await self.client.xinfo_stream(stream)
        except redis.ResponseError as exc:
            if "no such key" in str(exc).lower():
                return None
            raise
        return to_str(info["last-generated-id"])

    async def register(self, stream: str, consumer: str, last_id: str) -> None:
        """Record ``consumer``'s checkpoint on ``stream`` for retention."""
        await self.client.hset(registry_key(stream), consumer, last_id)

    async def dead_letter_entry(
        self, stream: str, entry_id: bytes, fields: Mapping[bytes, bytes], *, error: str, consumer: str
    ) -> str:
        """Copy an entry a checkpoint consumer cannot apply to the dead letters, with why; return the letter's id."""
        letter = letter_fields(fields, entry_id, group="", consumer=consumer, attempts=1, error=error)
        return to_str(await self.client.xadd(dlq_key(stream), letter))

    async def aclose(self) -> None:
        await self.client.aclose()
