"""Consumer groups: deliveries, claims of idle entries, acknowledgements, failed attempts, and what groups hold."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from ..wire import attempts_key, parse_autoclaim, to_str
from .base import Adapter, Entry
from .commands import issues
from .read import no_such_key

# Replies and refusals read the same way by both faces (the asyncio one is in :mod:`unilog.engine.aio`)


def delivered(reply: Any) -> list[Entry]:
    """The entries of an ``XREADGROUP`` reply on one stream; a pending entry deleted from the stream (Redis sends
    its id with no fields) is left out."""
    if not reply:
        return []
    return [(eid, fields) for eid, fields in reply[0][1] if fields is not None]


def group_exists(exc: redis.ResponseError) -> bool:
    """Whether ``exc`` is the refusal to create a group that already exists."""
    return "BUSYGROUP" in str(exc)


class Groups(Adapter):
    """Consumer groups on a stream: each entry to one worker, claimed from a worker that stopped."""

    @issues("xgroup|create", via=("explained",))
    def ensure_group(self, stream: str, group: str, start_id: str = "0") -> bool:
        """Create ``group`` on ``stream`` (and the stream) if missing; return whether it was created."""
        try:
            with self.explained(stream):
                self.client.xgroup_create(stream, group, id=start_id, mkstream=True)
        except redis.ResponseError as exc:
            if group_exists(exc):
                return False
            raise
        return True

    @issues("xreadgroup", via=("explained",))
    def read_group(
        self, stream: str, group: str, consumer: str, count: int, block_ms: int | None, after: str = ">"
    ) -> list[Entry]:
        """New entries for ``consumer`` in ``group`` (``XREADGROUP ... >``), waiting up to ``block_ms``; with
        ``after="0"``, the entries already delivered to ``consumer`` and not acknowledged (its own pending list)."""
        with self.explained(stream):
            reply: Any = self.client.xreadgroup(group, consumer, {stream: after}, count=count, block=block_ms)
        return delivered(reply)

    @issues("xack")
    def ack(self, stream: str, group: str, ids: Sequence[bytes | str]) -> int:
        """Acknowledge ``ids`` in ``group``."""
        return int(self.client.xack(stream, group, *ids)) if ids else 0

    @issues("xautoclaim", via=("_pending_but_gone",))
    def autoclaim(
        self, stream: str, group: str, consumer: str, min_idle_ms: int, count: int = 100, start: str = "0-0"
    ) -> tuple[str, list[Entry], list[bytes]]:
        """Claim entries idle for ``min_idle_ms`` (their worker died or is stuck): (next start, entries, deleted ids).

        Entries deleted from the stream while pending (trimmed) are returned as deleted ids: Redis 7 reports them
        separately; Redis 6.2 claims them but replies nil in their place, without their ids (redis-py shows a nil
        as ``None`` or ``(None, None)``, by version), so their ids are found among ``consumer``'s pending entries
        that are no longer in the stream.
        """
        reply: Any = self.client.execute_command(
            "XAUTOCLAIM", stream, group, consumer, min_idle_ms, start, "COUNT", count
        )
        next_start = to_str(reply[0])
        entries, deleted, anonymous = parse_autoclaim(reply)
        if anonymous:
            deleted += self._pending_but_gone(stream, group, consumer)
        return next_start, entries, deleted

    @issues("xpending", "xrange")
    def _pending_but_gone(self, stream: str, group: str, consumer: str, page: int = 1000) -> list[bytes]:
        """Ids pending on ``consumer`` whose entries are no longer in the stream."""
        gone: list[bytes] = []
        low = "-"
        while True:
            pending: Any = self.client.xpending_range(stream, group, low, "+", page, consumername=consumer)
            ids = [p["message_id"] for p in pending]
            pipe = self.client.pipeline(transaction=False)
            for eid in ids:
                pipe.xrange(stream, eid, eid, count=1)
            gone += [bytes(eid) for eid, found in zip(ids, pipe.execute(), strict=True) if not found]
            if len(ids) < page:
                return gone
            low = "(" + to_str(ids[-1])

    @issues("hincrby")
    def attempt(self, stream: str, group: str, entry_id: bytes | str) -> int:
        """Count one more failed attempt at ``entry_id`` in ``group``; return the total (kept in Redis, so it
        survives the worker)."""
        return int(self.client.hincrby(attempts_key(stream, group), to_str(entry_id), 1))

    @issues("xack", "hdel")
    def settle(self, stream: str, group: str, ids: Sequence[bytes | str]) -> int:
        """Acknowledge ``ids`` in ``group`` and forget their failed attempts, in one round trip; return acked."""
        if not ids:
            return 0
        pipe = self.client.pipeline(transaction=False)
        pipe.xack(stream, group, *ids)
        pipe.hdel(attempts_key(stream, group), *ids)
        acked, _ = pipe.execute()
        return int(acked)

    @issues("xpending")
    def pending_summary(self, stream: str, group: str) -> dict[str, Any]:
        """Pending entries of ``group``: count, lowest and highest id, and count per consumer."""
        info: Any = self.client.xpending(stream, group)
        return {
            "count": int(info["pending"]),
            "min": to_str(info["min"]) if info["min"] else None,
            "max": to_str(info["max"]) if info["max"] else None,
            "consumers": {to_str(c["name"]): int(c["pending"]) for c in info["consumers"]},
        }

    @issues("xinfo|groups")
    def groups(self, stream: str) -> list[dict[str, Any]]:
        """``XINFO GROUPS`` for ``stream`` (empty if the stream does not exist), keys and values decoded."""
        try:
            raw: Any = self.client.xinfo_groups(stream)
        except redis.ResponseError as exc:
            if no_such_key(exc):
                return []
            raise
        return [{to_str(k): (to_str(v) if isinstance(v, bytes) else v) for k, v in g.items()} for g in raw]
