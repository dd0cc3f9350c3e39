"""Reading a stream: entries after an id, pages of a range, waiting for entries, a stream's length and ends."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from ..wire import to_str
from .base import Adapter, Entry
from .commands import issues

PAGE = 10_000  # entries per XRANGE page: large enough to amortize the round trip, small enough to bound memory


@dataclass(frozen=True)
class StreamInfo:
    """A stream's length and the ids of its first and last entries (None when empty or missing)."""

    length: int
    first_id: str | None
    last_id: str | None


# Replies and refusals read the same way by both faces (the asyncio one is in :mod:`unilog.engine.aio`)


def read_reply(reply: Any) -> list[Entry]:
    """The entries of an ``XREAD`` reply on one stream (none when it timed out)."""
    return list(reply[0][1]) if reply else []


def no_such_key(exc: redis.ResponseError) -> bool:
    """Whether ``exc`` is the refusal of an ``XINFO`` on a stream that does not exist."""
    return "no such key" in str(exc).lower()


def last_generated(info: Any) -> str:
    """The last id ever added, from an ``XINFO STREAM`` reply."""
    return to_str(info["last-generated-id"])


class Reading(Adapter):
    """Reading streams: after a checkpoint, by range, blocking for what comes next."""

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
        names = self.client.scan_iter(match="*", count=1000, _type="STREAM")
        return sorted(to_str(n) for _, n in zip(range(limit), names, strict=False))

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

    @issues("xlen", "xrange", "xrevrange")
    def info(self, stream: str) -> StreamInfo:
        """Length and first/last ids of ``stream``; an absent stream has length 0."""
        pipe = self.client.pipeline(transaction=False)
        pipe.xlen(stream)
        pipe.xrange(stream, count=1)
        pipe.xrevrange(stream, count=1)
        length, first, last = pipe.execute()
        return StreamInfo(
            length=int(length),
            first_id=first[0][0].decode() if first else None,
            last_id=last[0][0].decode() if last else None,
        )

    @issues("xrange", "xrevrange")
    def pages(
        self, stream: str, start: str = "-", end: str = "+", *, page: int = PAGE, reverse: bool = False
    ) -> Iterator[list[Entry]]:
        """The entries of ``stream`` from ``start`` to ``end`` (ids, ``-``/``+``, or ``(id`` to exclude it), one
        ``XRANGE`` page at a time, oldest first (newest first with ``reverse``, where ``start`` is the upper end).
        The one paging loop of the library: each page resumes after the last id of the one before."""
        cursor = start
        while True:
            chunk: Any = (
                self.client.xrevrange(stream, max=cursor, min=end, count=page)
                if reverse
                else self.client.xrange(stream, min=cursor, max=end, count=page)
            )
            if chunk:
                yield chunk
            if len(chunk) < page:
                return
            cursor = "(" + to_str(chunk[-1][0])

    @issues(via=("pages",))
    def entries(
        self, stream: str, start: str = "-", end: str = "+", *, page: int = PAGE, reverse: bool = False
    ) -> Iterator[Entry]:
        """The entries :meth:`pages` reads, one by one."""
        for chunk in self.pages(stream, start, end, page=page, reverse=reverse):
            yield from chunk

    @issues(via=("entries",))
    def first_after(self, stream: str, after_id: str) -> Entry | None:
        """The first entry after ``after_id`` (``0-0``: the first entry), or None."""
        return next(self.entries(stream, "-" if after_id == "0-0" else "(" + after_id, page=1), None)

    @issues(via=("pages",))
    def entries_after(self, stream: str, after_id: str) -> int:
        """How many entries follow ``after_id`` (a consumer's lag in entries); linear in the lag."""
        return sum(len(chunk) for chunk in self.pages(stream, "(" + after_id))

    @issues("xread")
    def wait_for_entries(self, after: Mapping[str, str], block_ms: int) -> bool:
        """Block until any stream in ``after`` (stream -> last id read) has an entry after its id, or ``block_ms``
        passed (one ``XREAD`` over all of them); return whether one arrived.

        On a Redis Cluster the streams live in different slots and one ``XREAD`` cannot span them: each is polled
        without blocking, every 50 ms, until ``block_ms`` passed."""
        if not isinstance(self.client, redis.RedisCluster) or len(after) <= 1:
            return bool(self.client.xread(dict(after), count=1, block=block_ms))  # type: ignore[arg-type]
        deadline = time.monotonic() + block_ms / 1000
        while True:
            if any(self.client.xread({stream: last}, count=1) for stream, last in after.items()):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
