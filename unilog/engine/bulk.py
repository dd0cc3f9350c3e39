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


# Streams whose pages one pipeline asks for at most: their replies are held together
IDS_PIPELINE = 500


@issues("xrange")
def ids_many(url: str, ranges: Mapping[str, tuple[str, str]], page: int) -> dict[str, list[str]]:
    """The ids of each stream's entries in (``after``, ``until``] (``ranges``: stream -> (after, until)), in order,
    on one client of their own: the first page of every stream in a pipeline (of :data:`IDS_PIPELINE` streams at a
    time), then further pages of those that had a full one. A client per stream cost a connection per stream: a
    thousand at a thousand streams, on every micro-batch of a query over all they hold."""
    client = connect(url)
    client.set_response_callback("XRANGE", lambda reply, **_: reply)  # this client only
    found: dict[str, list[str]] = {stream: [] for stream in ranges}
    cursors = {stream: "(" + after for stream, (after, _until) in ranges.items()}
    todo = sorted(ranges)
    try:
        while todo:
            more: list[str] = []
            for lo in range(0, len(todo), IDS_PIPELINE):
                part = todo[lo : lo + IDS_PIPELINE]
                pipe = client.pipeline(transaction=False)
                for stream in part:
                    pipe.execute_command("XRANGE", stream, cursors[stream], ranges[stream][1], "COUNT", page)
                with no_gc():
                    replies = pipe.execute()
                for stream, chunk in zip(part, replies, strict=True):
                    ids = [to_str(entry[0]) for entry in chunk or ()]
                    found[stream] += ids
                    if len(ids) >= page:
                        cursors[stream] = "(" + ids[-1]
                        more.append(stream)
            todo = more
    finally:
        client.close()
    return found
