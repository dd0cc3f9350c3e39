"""Bulk reads for the Spark source: pages of a stream as Redis sent them, on a client of their own."""

from __future__ import annotations

import gc
from collections.abc import Iterator
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
