# Generated from unilog/engine/_async/read.py by tools/faces.py: do not edit.
"""Reading a stream after a checkpoint: what a checkpoint consumer of either face asks of Redis. The rest of reading
(ranges, a stream's ends) is threaded only: :class:`~unilog.engine.read.Reading`."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import redis

from ..._acompat import sleep
from ...wire import to_str
from ..base import Entry
from ..commands import issues
from ..nodes import clustered
from ..replies import last_generated, no_such_key, read_many_reply, read_reply, untraced
from .base import Adapter


class ReadingCore(Adapter):
    """Reads after a checkpoint, and the checks of a stream that is missing or was rewound."""

    @issues("xread", via=("explained",))
    def read(self, stream: str, after_id: str, count: int, block_ms: int | None) -> list[Entry]:
        """Up to ``count`` entries after ``after_id``, waiting up to ``block_ms`` if there are none yet."""
        with self.explained(stream):
            reply: Any = self.client.xread({stream: after_id}, count=count, block=block_ms)
        return read_reply(reply)

    @issues("exists", "scan")
    def missing_stream(self, stream: str, limit: int = 10) -> list[str] | None:
        """None if ``stream`` exists; else the names of up to ``limit`` streams that do (to spot a typo)."""
        if self.client.exists(stream):
            return None
        names: list[str] = []
        for name in self.client.scan_iter(match="*", count=1000, _type="STREAM"):
            names.append(to_str(name))
            if len(names) >= limit:
                break
        return sorted(names[:limit])

    @issues("xinfo|stream")
    def last_generated_id(self, stream: str) -> str | None:
        """The id of the last entry ever added to ``stream`` (kept across trims), or None if it does not exist."""
        try:
            info: Any = self.client.xinfo_stream(stream)
        except redis.ResponseError as exc:
            if no_such_key(exc):
                return None
            raise
        return last_generated(info)

    @issues("xread")
    def wait_for_entries(self, after: Mapping[str, str], block_ms: int) -> bool:
        """Block until any stream in ``after`` (stream -> last id read) has an entry after its id, or ``block_ms``
        passed (one ``XREAD`` over all of them); return whether one arrived.

        On a Redis Cluster the streams live in different slots and one ``XREAD`` cannot span them: each is polled
        without blocking, every 50 ms, until ``block_ms`` passed."""
        if not clustered(self.client) or len(after) <= 1:
            return bool(self.client.xread(dict(after), count=1, block=block_ms))  # type: ignore[arg-type]
        deadline = time.monotonic() + block_ms / 1000
        while True:
            for stream, last in after.items():
                if self.client.xread({stream: last}, count=1):
                    return True
            if time.monotonic() >= deadline:
                return False
            sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    # -- several streams at once (a consumer over several streams) -------------------------------------------------

    @issues("xread")
    def read_many(self, after: Mapping[str, str], count: int, block_ms: int | None) -> dict[str, list[Entry]]:
        """Up to ``count`` entries of each stream of ``after`` (stream -> id to read after), waiting up to
        ``block_ms`` if none has any yet; the streams that had entries, with them.

        A single Redis answers one ``XREAD`` over every stream. On a Redis Cluster streams of different slots cannot
        share an ``XREAD``: one is sent per stream, all in one pipeline (redis-py sends each node its own in one
        round trip), without blocking, again every 50 ms until ``block_ms`` passed. No streams (a prefix none
        matches yet): ``block_ms`` is waited out all the same, so an idle consumer does not spin."""
        if not after:
            sleep((block_ms or 0) / 1000)
            return {}
        if not clustered(self.client):
            reply: Any = self.client.xread(dict(after), count=count, block=block_ms)  # type: ignore[arg-type]
            return read_many_reply(reply)
        deadline = time.monotonic() + (block_ms or 0) / 1000
        while True:
            pipe = self.client.pipeline(transaction=False)
            for stream, last in after.items():
                pipe.xread({stream: last}, count=count)
            found: dict[str, list[Entry]] = {}
            for reply in pipe.execute():
                found.update(read_many_reply(reply))
            if found or block_ms is None or time.monotonic() >= deadline:
                return found
            sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    @issues("scan")
    def stream_names(self, prefix: str, limit: int) -> list[str]:
        """The streams whose names start with ``prefix`` (``SCAN`` of stream keys; on a Redis Cluster, of every
        primary's), sorted, at most ``limit`` + 1 of them (so a caller sees it went over ``limit``). The keys of
        unilog's own bookkeeping (dead letters: ``unilog:dlq:{<stream>}``) hold a hash tag, which no stream name
        may: they are left out."""
        names: set[str] = set()
        for key in self.client.scan_iter(match=prefix + "*", count=1000, _type="STREAM"):
            name = to_str(key)
            if "{" not in name:
                names.add(name)
                if len(names) > limit:
                    break
        return sorted(names)

    @issues("exists")
    def missing_streams(self, streams: list[str]) -> list[str]:
        """The streams of ``streams`` that do not exist (one pipelined ``EXISTS`` each)."""
        pipe = self.client.pipeline(transaction=False)
        for stream in streams:
            pipe.exists(stream)
        return [stream for stream, found in zip(streams, pipe.execute(), strict=True) if not found]

    @issues("xinfo|stream")
    def last_generated_ids(self, streams: list[str]) -> dict[str, str | None]:
        """:meth:`last_generated_id` of each of ``streams``, in one pipeline."""
        pipe = self.client.pipeline(transaction=False)
        for stream in streams:
            pipe.xinfo_stream(stream)
        tops: dict[str, str | None] = {}
        for stream, info in zip(streams, untraced(pipe.execute(raise_on_error=False)), strict=True):
            if isinstance(info, redis.ResponseError):
                if not no_such_key(info):
                    try:
                        raise info
                    finally:
                        del info  # it holds the error, whose traceback holds this frame: a cycle
                tops[stream] = None
            else:
                tops[stream] = last_generated(info)
        return tops
