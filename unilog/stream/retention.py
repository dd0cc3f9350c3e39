"""Retention: a stream is trimmed only behind everyone who still needs its entries.

Checkpoint consumers register their checkpoint in Redis after each commit; a group needs everything from its oldest
pending entry (or its last delivered one, if nothing is pending). The streamer that holds a stream trims it
(``XTRIM MINID``) behind the lowest of these, never by length, which would drop unread entries; only an operator's
hard cap (``max_len``) may, and the consumers it passes stop with ``StreamGap`` instead of skipping.
"""

from __future__ import annotations

import structlog

from .. import engine

log = structlog.get_logger(__name__)


def trim(api: engine.RedisStreams, stream: str, max_len: int | None = None) -> int:
    """Trim ``stream`` behind its registered consumers and consumer groups (and to ``max_len``, if set).

    A group holds the stream at its oldest pending entry, or at its last delivered entry if nothing is pending,
    so nothing a group has not acknowledged is trimmed. Returns entries removed.
    """
    floors = list(api.registered(stream).values())
    for group in api.groups(stream):
        floors.append(str(group["last-delivered-id"]))
        if int(group.get("pending", 0)):
            pending_min = api.pending_summary(stream, str(group["name"]))["min"]
            if pending_min:
                floors.append(pending_min)
    removed = 0
    if floors:
        lowest = min(floors, key=engine.id_tuple)
        if lowest != "0-0":
            removed += api.trim(stream, min_id=lowest)
    if max_len is not None:
        removed += api.trim(stream, max_len=max_len)
    if removed:
        log.info("stream trimmed", stream=stream, removed=removed, holders=len(floors))
    return removed
