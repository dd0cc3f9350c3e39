"""The Redis commands of the asyncio consumer (:class:`unilog.AsyncConsumer`), on redis-py's asyncio client.

Part of the Redis adapter: the same keys, replies and refusals as :class:`~unilog.engine.RedisStreams` (the key
names, the reading of replies and the explaining of refusals are the threaded modules' own functions: only the I/O
differs), the same commands (each method issues what its threaded twin declares), and the client configured the
same way (redis-py's own retries off: unilog retries whole passes, whose outcome it knows).
A ``redis+cluster://`` URL gives redis-py's asyncio cluster client.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ..wire import attempts_key, dlq_key, letter_fields, parse_autoclaim, registry_key, to_str
from .base import Entry
from .groups import delivered, group_exists
from .read import last_generated, no_such_key, read_reply
from .refusals import CLUSTER_SCHEMES, QUIET, cluster_options, refusal, type_checked


def connect_async(url: str, *, socket_timeout: float | None = 10.0) -> Any:
    """An asyncio client for ``url`` (a single Redis, or a cluster by ``redis+cluster://``); connects lazily."""
    common: dict[str, Any] = {
        "retry": Retry(NoBackoff(), 0),
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": 10.0,
        "decode_responses": False,
        **QUIET,
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

    @contextlib.asynccontextmanager
    async def explained(self, stream: str) -> AsyncIterator[None]:
        """See :meth:`unilog.engine.RedisStreams.explained`."""
        try:
            yield
        except redis.ResponseError as exc:
            kinds = {}
            if "WRONGTYPE" in str(exc):
                kinds = {k: to_str(await self.client.type(k)) for k in type_checked(stream)}
            raise refusal(exc, stream, kinds) or exc from None

    async def read(self, stream: str, after_id: str, count: int, block_ms: int | None) -> list[Entry]:
        """Up to ``count`` entries after ``after_id``, waiting up to ``block_ms`` if there are none yet."""
        async with self.explained(stream):
            reply: Any = await self.client.xread({stream: after_id}, count=count, block=block_ms)
        return read_reply(reply)

    async def missing_stream(self, stream: str, limit: int = 10) -> list[str] | None:
        """See :meth:`unilog.engine.RedisStreams.missing_stream`."""
        if await self.client.exists(stream):
            return None
        names: list[str] = []
        async for name in self.client.scan_iter(match="*", count=1000, _type="STREAM"):
            names.append(to_str(name))
            if len(names) >= limit:
                break
        return sorted(names)

    async def last_generated_id(self, stream: str) -> str | None:
        """The id of the last entry ever added to ``stream``, or None if it does not exist."""
        try:
            info: Any = await self.client.xinfo_stream(stream)
        except redis.ResponseError as exc:
            if no_such_key(exc):
                return None
            raise
        return last_generated(info)

    async def register(self, stream: str, consumer: str, last_id: str) -> None:
        """Record ``consumer``'s checkpoint on ``stream`` for retention."""
        await self.client.hset(registry_key(stream), consumer, last_id)

    async def dead_letter_entry(
        self,
        stream: str,
        entry_id: bytes,
        fields: Mapping[bytes, bytes],
        *,
        error: str,
        consumer: str,
        attempts: int = 1,
    ) -> str:
        """Copy an entry a checkpoint consumer cannot apply to the dead letters, with why; return the letter's id."""
        letter = letter_fields(fields, entry_id, group="", consumer=consumer, attempts=attempts, error=error)
        return to_str(await self.client.xadd(dlq_key(stream), letter))

    # -- consumer groups ---------------------------------------------------------------------------------------------

    async def ensure_group(self, stream: str, group: str, start_id: str = "0") -> bool:
        """See :meth:`unilog.engine.RedisStreams.ensure_group`."""
        try:
            async with self.explained(stream):
                await self.client.xgroup_create(stream, group, id=start_id, mkstream=True)
        except redis.ResponseError as exc:
            if group_exists(exc):
                return False
            raise
        return True

    async def read_group(
        self, stream: str, group: str, consumer: str, count: int, block_ms: int | None, after: str = ">"
    ) -> list[Entry]:
        """New entries for ``consumer`` in ``group``, or (``after="0"``) its own pending ones."""
        async with self.explained(stream):
            reply: Any = await self.client.xreadgroup(group, consumer, {stream: after}, count=count, block=block_ms)
        return delivered(reply)

    async def ack(self, stream: str, group: str, ids: Sequence[bytes | str]) -> int:
        return int(await self.client.xack(stream, group, *ids)) if ids else 0

    async def autoclaim(
        self, stream: str, group: str, consumer: str, min_idle_ms: int, count: int = 100, start: str = "0-0"
    ) -> tuple[str, list[Entry], list[bytes]]:
        """Claim entries idle for ``min_idle_ms``: (next start, entries, ids deleted from the stream while pending);
        see :meth:`unilog.engine.RedisStreams.autoclaim` for Redis 6.2's anonymous replies."""
        reply: Any = await self.client.execute_command(
            "XAUTOCLAIM", stream, group, consumer, min_idle_ms, start, "COUNT", count
        )
        entries, deleted, anonymous = parse_autoclaim(reply)
        if anonymous:
            deleted += await self._pending_but_gone(stream, group, consumer)
        return to_str(reply[0]), entries, deleted

    async def _pending_but_gone(self, stream: str, group: str, consumer: str, page: int = 1000) -> list[bytes]:
        gone: list[bytes] = []
        low = "-"
        while True:
            pending: Any = await self.client.xpending_range(stream, group, low, "+", page, consumername=consumer)
            ids = [p["message_id"] for p in pending]
            for eid in ids:
                if not await self.client.xrange(stream, eid, eid, count=1):
                    gone.append(bytes(eid))
            if len(ids) < page:
                return gone
            low = "(" + to_str(ids[-1])

    async def attempt(self, stream: str, group: str, entry_id: bytes | str) -> int:
        """Count one more failed attempt at ``entry_id`` in ``group`` (kept in Redis); return the total."""
        return int(await self.client.hincrby(attempts_key(stream, group), to_str(entry_id), 1))

    async def settle(self, stream: str, group: str, ids: Sequence[bytes | str]) -> int:
        """Acknowledge ``ids`` and forget their failed attempts; return acked."""
        if not ids:
            return 0
        pipe = self.client.pipeline(transaction=False)
        pipe.xack(stream, group, *ids)
        pipe.hdel(attempts_key(stream, group), *ids)
        acked, _ = await pipe.execute()
        return int(acked)

    async def dead_letter(
        self,
        stream: str,
        group: str,
        entry_id: bytes,
        fields: Mapping[bytes, bytes],
        *,
        error: str,
        consumer: str,
        attempts: int,
    ) -> str:
        """Move an entry to the dead letters with why, then acknowledge it (one MULTI)."""
        letter = letter_fields(fields, entry_id, group=group, consumer=consumer, attempts=attempts, error=error)
        pipe = self.client.pipeline(transaction=True)
        pipe.xadd(dlq_key(stream), letter)
        pipe.xack(stream, group, entry_id)
        pipe.hdel(attempts_key(stream, group), to_str(entry_id))
        return to_str((await pipe.execute())[0])

    async def aclose(self) -> None:
        await self.client.aclose()
