# Generated from unilog/engine/_async/groups.py by tools/faces.py: do not edit.
"""Working in a consumer group: what a group worker of either face asks of Redis. What groups hold (pending
summaries, ``XINFO GROUPS``) is threaded only: :class:`~unilog.engine.groups.Groups`."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import redis

from ..._acompat import sleep
from ...wire import attempts_key, parse_autoclaim, to_str
from ..base import Entry
from ..commands import issues
from ..nodes import clustered
from ..replies import delivered, delivered_many, group_exists, untraced
from .base import Adapter


class GroupsCore(Adapter):
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

    @issues("xgroup|create", via=("explained",))
    def ensure_groups(self, streams: Sequence[str], group: str) -> list[str]:
        """:meth:`ensure_group` on each of ``streams`` (at its beginning), in one pipeline; return the streams whose
        group was created."""
        pipe = self.client.pipeline(transaction=False)
        for stream in streams:
            pipe.xgroup_create(stream, group, id="0", mkstream=True)
        created = []
        for stream, reply in zip(streams, untraced(pipe.execute(raise_on_error=False)), strict=True):
            if isinstance(reply, redis.ResponseError):
                if not group_exists(reply):
                    try:
                        with self.explained(stream):
                            raise reply
                    finally:
                        del reply  # it holds the error, whose traceback holds this frame: a cycle
                continue
            created.append(stream)
        return created

    @issues("xreadgroup", via=("read_group",))
    def read_group_many(
        self, group: str, consumer: str, after: Mapping[str, str], count: int, block_ms: int | None
    ) -> dict[str, list[Entry]]:
        """:meth:`read_group` over every stream of ``after`` (stream -> ``>`` for new entries, or an id: this
        consumer's own pending entries after it), up to ``count`` entries of each; the streams that had entries.

        A single Redis answers one ``XREADGROUP`` over all of them. On a Redis Cluster streams of different slots
        cannot share one: one is sent per stream, in one pipeline, without blocking, again every 50 ms until
        ``block_ms`` passed. No streams (a prefix none matches yet): ``block_ms`` is waited out all the same, so an
        idle worker does not spin. Over one stream, a refusal no retry can fix is one line naming it, as
        :meth:`read_group`'s."""
        if not after:
            sleep((block_ms or 0) / 1000)
            return {}
        if len(after) == 1:
            [(stream, last)] = after.items()
            return (
                {stream: entries}
                if (entries := self.read_group(stream, group, consumer, count, block_ms, last))
                else {}
            )
        if not clustered(self.client):
            streams: dict[Any, Any] = dict(after)
            reply: Any = self.client.xreadgroup(group, consumer, streams, count=count, block=block_ms)
            return delivered_many(reply)
        deadline = time.monotonic() + (block_ms or 0) / 1000
        while True:
            pipe = self.client.pipeline(transaction=False)
            for stream, last in after.items():
                pipe.xreadgroup(group, consumer, {stream: last}, count=count)
            found: dict[str, list[Entry]] = {}
            for reply in pipe.execute():
                found.update(delivered_many(reply))
            if found or block_ms is None or time.monotonic() >= deadline:
                return found
            sleep(min(0.05, max(0.0, deadline - time.monotonic())))

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
        entries, deleted, anonymous = parse_autoclaim(reply)
        if anonymous:
            deleted += self._pending_but_gone(stream, group, consumer)
        return to_str(reply[0]), entries, deleted

    @issues("xautoclaim", via=("_pending_but_gone",))
    def autoclaim_many(
        self, streams: Sequence[str], group: str, consumer: str, min_idle_ms: int, count: int = 100
    ) -> dict[str, tuple[str, list[Entry], list[bytes]]]:
        """:meth:`autoclaim`'s first page on each of ``streams``, in one pipeline (one round trip per node): stream ->
        (next start, entries, deleted ids), for the streams that had something or more to claim."""
        pipe = self.client.pipeline(transaction=False)
        for stream in streams:
            pipe.execute_command("XAUTOCLAIM", stream, group, consumer, min_idle_ms, "0-0", "COUNT", count)
        found: dict[str, tuple[str, list[Entry], list[bytes]]] = {}
        for stream, reply in zip(streams, pipe.execute(), strict=True):
            entries, deleted, anonymous = parse_autoclaim(reply)
            if anonymous:
                deleted += self._pending_but_gone(stream, group, consumer)
            start = to_str(reply[0])
            if entries or deleted or start != "0-0":
                found[stream] = (start, entries, deleted)
        return found

    @issues("xpending", "xrange")
    def _pending_but_gone(self, stream: str, group: str, consumer: str, page: int = 1000) -> list[bytes]:
        """Ids pending on ``consumer`` whose entries are no longer in the stream (one pipeline of ``XRANGE`` per
        page of them)."""
        gone: list[bytes] = []
        low = "-"
        while True:
            pending: Any = self.client.xpending_range(stream, group, low, "+", page, consumername=consumer)
            ids = [p["message_id"] for p in pending]
            pipe = self.client.pipeline(transaction=False)
            for eid in ids:
                pipe.xrange(stream, eid, eid, count=1)
            found = pipe.execute() if ids else []
            gone += [bytes(eid) for eid, entries in zip(ids, found, strict=True) if not entries]
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

    @issues("xack", "hdel")
    def settle_many(self, group: str, ids: Mapping[str, Sequence[bytes | str]]) -> int:
        """:meth:`settle` the ids of each stream of ``ids`` (stream -> ids), all in one pipeline; return acked."""
        pipe = self.client.pipeline(transaction=False)
        for stream, stream_ids in ids.items():
            if stream_ids:
                pipe.xack(stream, group, *stream_ids)
                pipe.hdel(attempts_key(stream, group), *stream_ids)
        replies = pipe.execute()
        return sum(int(acked) for acked in replies[::2])
