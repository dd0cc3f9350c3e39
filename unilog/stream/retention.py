"""Retention: a stream is trimmed only behind everyone who still needs its entries.

Checkpoint consumers register their checkpoint in Redis after each commit; a group needs everything from its oldest
pending entry (or its last delivered one, if nothing is pending). The streamer that holds a stream trims it
(``XTRIM MINID``) behind the lowest of these, never by length, which would drop unread entries; only an operator's
hard cap (``max_len``) may, and the consumers it passes stop with ``StreamGap`` instead of skipping.

:func:`holders` lists who holds a stream and where; :func:`trim` trims behind the lowest of them, and
:func:`held` says how much of the stream each registration holds (what ``unilog status`` shows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog

from .. import engine

log = structlog.get_logger(__name__)

_MAX_SEQ = 2**64 - 1


@dataclass(frozen=True)
class Holder:
    """One holder of a stream's retention: a registered consumer (``kind`` ``"consumer"``) or a group (``"group"``).

    Trimming never passes ``floor`` (that entry and every later one are kept); the holder still needs the entries
    after ``read_to`` (a registration's id, a group's last delivered entry, or the entry just before its oldest
    pending one)."""

    kind: str
    name: str
    floor: str
    read_to: str


def _before(entry_id: str) -> str:
    """The greatest id below ``entry_id`` (``0-0`` for the least)."""
    ms, seq = engine.id_tuple(entry_id)
    if seq:
        return f"{ms}-{seq - 1}"
    return f"{ms - 1}-{_MAX_SEQ}" if ms else "0-0"


def holders(api: engine.RedisStreams, stream: str, groups: list[dict[str, Any]] | None = None) -> list[Holder]:
    """Who holds ``stream``: its registered consumers (at their registered ids) and its consumer groups (at their
    oldest pending entry, or their last delivered one if nothing is pending). ``groups``: ``XINFO GROUPS`` if the
    caller read it already."""
    found = api.groups(stream) if groups is None else groups
    pending = {str(g["name"]): api.pending_summary(stream, str(g["name"]))["min"] for g in found if _pending(g)}
    return holders_of(api.registered(stream), found, pending)


def _pending(group: dict[str, Any]) -> bool:
    return bool(int(group.get("pending", 0)))


def pending_groups(groups: list[dict[str, Any]]) -> list[str]:
    """The names of those of ``groups`` (``XINFO GROUPS``) with entries pending: whose oldest pending entry
    :func:`holders_of` needs."""
    return [str(g["name"]) for g in groups if _pending(g)]


def holders_of(
    registered: dict[str, str], groups: list[dict[str, Any]], pending_min: dict[str, str | None]
) -> list[Holder]:
    """:func:`holders` from what was read already: the registrations (name -> id), ``XINFO GROUPS`` and each group
    with entries pending's oldest pending id (by group name)."""
    found = [Holder("consumer", name, last_id, last_id) for name, last_id in sorted(registered.items())]
    for group in groups:
        name, delivered = str(group["name"]), str(group["last-delivered-id"])
        oldest = pending_min.get(name) if _pending(group) else None
        if oldest and engine.id_tuple(oldest) <= engine.id_tuple(delivered):
            found.append(Holder("group", name, oldest, _before(oldest)))
        else:
            found.append(Holder("group", name, delivered, delivered))
    return found


def held(api: engine.RedisStreams, stream: str, everyone: list[Holder]) -> dict[str, int]:
    """How many entries each registered consumer holds: those after its registered id up to the last one the next
    holder further along the stream (a registration or a group) has read, or to the stream's end if none is further.

    Retention keeps them for it: no holder further along still needs them. The lowest registration holds the
    stream's oldest entries; one at the end of the stream holds none; summed over every holder, what they hold is
    the stream after the lowest of them."""
    return {name: api.entries_after(stream, after, end) for name, (after, end) in held_ranges(everyone).items()}


def held_ranges(everyone: list[Holder]) -> dict[str, tuple[str, str]]:
    """Each registered consumer's held range as :func:`held` counts it: (after this id, up to this id or ``+``)."""
    ranges = {}
    for holder in everyone:
        if holder.kind != "consumer":
            continue
        at = engine.id_tuple(holder.read_to)
        further = [h.read_to for h in everyone if engine.id_tuple(h.read_to) > at]
        ranges[holder.name] = (holder.read_to, min(further, key=engine.id_tuple) if further else "+")
    return ranges


def trim(api: engine.RedisStreams, stream: str, max_len: int | None = None) -> int:
    """Trim ``stream`` behind its registered consumers and consumer groups (and to ``max_len``, if set).

    A group holds the stream at its oldest pending entry, or at its last delivered entry if nothing is pending,
    so nothing a group has not acknowledged is trimmed. Returns entries removed.
    """
    floors = [holder.floor for holder in holders(api, stream)]
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
