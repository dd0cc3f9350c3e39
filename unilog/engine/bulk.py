"""Bulk reads for the Spark source: pages of a stream as Redis sent them, on a client of their own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..wire import to_str
from .refusals import connect


def raw_pages(url: str, stream: str, after: str, until: str, page: int) -> Iterator[list[Any]]:
    """Entries in (``after``, ``until``] as Redis sent them (``[id, [field, value, ...]]``, no dict per entry), one
    page at a time, on a client of their own: for bulk readers (Spark) that build columns straight from the reply."""
    client = connect(url)
    client.set_response_callback("XRANGE", lambda reply, **_: reply)  # this client only
    try:
        cursor = "(" + after
        while True:
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
