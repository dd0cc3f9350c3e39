"""Reading a stream: entries after an id, pages of a range, waiting for entries, a stream's length and ends.

The reads both faces have (after a checkpoint; the missing-stream and rewind checks) are generated from
:mod:`unilog.engine._async.read`; the rest is the threaded face's only."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..wire import to_str
from ._sync.read import ReadingCore
from .base import Entry
from .commands import issues

PAGE = 10_000  # entries per XRANGE page: large enough to amortize the round trip, small enough to bound memory


@dataclass(frozen=True)
class StreamInfo:
    """A stream's length and the ids of its first and last entries (None when empty or missing)."""

    length: int
    first_id: str | None
    last_id: str | None


class Reading(ReadingCore):
    """Reading streams: after a checkpoint (:class:`~unilog.engine._sync.read.ReadingCore`, generated: both faces
    have it), by range, blocking for what comes next."""

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
    def entries_after(self, stream: str, after_id: str, end: str = "+") -> int:
        """How many entries follow ``after_id`` (a consumer's lag in entries), up to ``end`` (an id, included; ``+``:
        the stream's end); linear in the count."""
        return sum(len(chunk) for chunk in self.pages(stream, "(" + after_id, end))
