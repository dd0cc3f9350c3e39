"""Redis's replies and refusals, read the same way by both faces of the adapter: pure functions, no I/O."""

from __future__ import annotations

from typing import Any

import redis

from ..wire import to_str
from .base import Entry


def untraced(replies: list[Any]) -> list[Any]:
    """A pipeline's replies read with ``raise_on_error=False``, each error's traceback dropped. redis-py keeps each
    refused command's error in a list local to the frame that caught it, and the error's traceback holds that frame:
    a cycle, and through the frames' callers the worker that ran the pipeline (its sessions, its locks), alive until
    a full garbage collection even after the worker is dropped. The traceback only shows redis-py reading a reply."""
    for reply in replies:
        if isinstance(reply, BaseException):
            reply.__traceback__ = None
    return replies


def read_reply(reply: Any) -> list[Entry]:
    """The entries of an ``XREAD`` reply on one stream (none when it timed out)."""
    return list(reply[0][1]) if reply else []


def read_many_reply(reply: Any) -> dict[str, list[Entry]]:
    """The entries of an ``XREAD`` reply on several streams, by stream; streams without entries are left out.
    (RESP2's list of (stream, entries) pairs; redis-py reads RESP3's map as stream -> [entries].)"""
    if not reply:
        return {}
    if isinstance(reply, dict):
        pairs = [(stream, value[0] if value else []) for stream, value in reply.items()]
    else:
        pairs = reply
    return {to_str(stream): list(entries) for stream, entries in pairs if entries}


def delivered(reply: Any) -> list[Entry]:
    """The entries of an ``XREADGROUP`` reply on one stream; a pending entry deleted from the stream (Redis sends
    its id with no fields) is left out."""
    if not reply:
        return []
    return [(eid, fields) for eid, fields in reply[0][1] if fields is not None]


def delivered_many(reply: Any) -> dict[str, list[Entry]]:
    """The entries of an ``XREADGROUP`` reply on several streams, by stream (as :func:`delivered`); streams without
    entries are left out."""
    kept = {
        stream: [(eid, fields) for eid, fields in entries if fields is not None]
        for stream, entries in read_many_reply(reply).items()
    }
    return {stream: entries for stream, entries in kept.items() if entries}


def last_generated(info: Any) -> str:
    """The last id ever added, from an ``XINFO STREAM`` reply."""
    return to_str(info["last-generated-id"])


def no_such_key(exc: redis.ResponseError) -> bool:
    """Whether ``exc`` is the refusal of an ``XINFO`` on a stream that does not exist."""
    return "no such key" in str(exc).lower()


def group_exists(exc: redis.ResponseError) -> bool:
    """Whether ``exc`` is the refusal to create a group that already exists."""
    return "BUSYGROUP" in str(exc)
