"""Bulk reads for the Spark source: pages of a stream as Redis sent them, and the ids of many streams' ranges, on a
client of their own."""

from __future__ import annotations

import gc
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ..wire import to_str
from .commands import issues
from .connection import connect


@contextmanager
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector paused: parsing a page builds two lists per entry and no cycles, yet each few
    hundred of them start a collection (a third of the parse time of a 5,000-entry page)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@issues("xrange")
def raw_pages(url: str, stream: str, after: str, until: str, page: int) -> Iterator[list[Any]]:
    """Entries in (``after``, ``until``] as Redis sent them (``[id, [field, value, ...]]``, no dict per entry), one
    page at a time, on a client of their own: for bulk readers (Spark) that build columns straight from the reply."""
    client = connect(url)
    client.set_response_callback("XRANGE", lambda reply, **_: reply)  # this client only
    try:
        cursor = "(" + after
        while True:
            with no_gc():
                chunk: Any = client.execute_command("XRANGE", stream, cursor, until, "COUNT", page)
            if chunk and isinstance(chunk[0][1], dict):  # a cluster client's nodes parse replies their own way
                chunk = [[eid, [item for pair in fields.items() for item in pair]] for eid, fields in chunk]
            if chunk:
                yield chunk
            if len(chunk) < page:
                return
            cursor = "(" + to_str(chunk[-1][0])
    finally:
        client.close()


# Entries one pipeline of ``ids_many`` asks for at most (XRANGE returns whole entries, held together in Redis's output
# buffer for the client and in the reader's memory), and the first page each stream is asked for: most streams of a
# query over many have a few entries each, so their first pages share a pipeline; the rest is paged deeper
IDS_IN_FLIGHT = 50_000
FIRST_PAGE = 100


@issues("xrange")
def ids_many(url: str, ranges: Mapping[str, tuple[str, str]], page: int) -> dict[str, list[str]]:
    """The ids of each stream's entries in (``after``, ``until``] (``ranges``: stream -> (after, until)), in order,
    on one client of their own: a first page of every stream (:data:`FIRST_PAGE` entries) in pipelines, then pages of
    ``page`` entries for those that had a full one, never more than :data:`IDS_IN_FLIGHT` entries asked for at once.
    A client per stream cost a connection per stream: a thousand at a thousand streams, on every micro-batch of a
    query over all they hold."""
    found: dict[str, list[str]] = {stream: [] for stream in ranges}
    if not ranges:
        return found
    client = connect(url)
    client.set_response_callback("XRANGE", lambda reply, **_: reply)  # this client only
    cursors = {stream: "(" + after for stream, (after, _until) in ranges.items()}
    todo, count = sorted(ranges), min(FIRST_PAGE, page)
    try:
        while todo:
            more: list[str] = []
            step = max(1, IDS_IN_FLIGHT // count)
            for lo in range(0, len(todo), step):
                part = todo[lo : lo + step]
                pipe = client.pipeline(transaction=False)
                for stream in part:
                    pipe.execute_command("XRANGE", stream, cursors[stream], ranges[stream][1], "COUNT", count)
                with no_gc():
                    replies = pipe.execute()
                for stream, chunk in zip(part, replies, strict=True):
                    ids = [to_str(entry[0]) for entry in chunk or ()]
                    found[stream] += ids
                    if len(ids) >= count:
                        cursors[stream] = "(" + ids[-1]
                        more.append(stream)
            todo, count = more, page
    finally:
        client.close()
    return found
