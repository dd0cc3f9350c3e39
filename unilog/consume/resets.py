"""Moving a checkpoint consumer's checkpoint: to the stream's beginning or end, or to an entry id (replays and
rebuilds), with the positions per producer recomputed from the stream so deduplication stays right.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import structlog

from .. import engine, store
from ..errors import ConfigurationError
from .records import Record

log = structlog.get_logger(__name__)


def positions_through(api: engine.RedisStreams, stream: str, last_id: str | None) -> dict[str, tuple[int, int]]:
    """The highest (epoch, seq) per producer among the entries up to ``last_id`` (None: the whole stream)."""
    positions: dict[str, tuple[int, int]] = {}
    for entry_id, fields in api.entries(stream, "-", last_id or "+"):
        record = Record(stream, entry_id, fields)
        pos = record.position
        if pos is not None and pos > positions.get(record.producer, (0, 0)):
            positions[record.producer] = pos
    return positions


def reset_checkpoint(
    conn: psycopg.Connection[Any],
    api: engine.RedisStreams,
    name: str,
    stream: str,
    to: str,
    *,
    reset_state: Callable[[psycopg.Connection[Any], str], Any] | None = None,
) -> store.Checkpoint:
    """Move consumer ``name``'s checkpoint to ``beginning``, ``end`` or a stream id, in one transaction.

    The positions per producer are recomputed from the stream so deduplication stays right: after a reset to an id,
    entries after it are applied again; before it, skipped. ``reset_state(conn, name)`` (for a rebuild) clears the
    consumer's own state in the same transaction, so state and checkpoint never disagree. The records the consumer
    dead-lettered are no longer held: a replay of one is skipped (the reset decided what is applied). A running copy
    of the consumer notices the moved checkpoint and follows it.
    """
    if to == "beginning":
        last_id, positions = "0-0", {}
    elif to == "end":
        last_id = api.last_generated_id(stream) or "0-0"
        positions = positions_through(api, stream, None)
    else:
        try:
            engine.id_tuple(to)
        except ValueError:
            raise ConfigurationError(
                f"--to must be beginning, end or a stream id like 1700000000000-0, not {to!r}"
            ) from None
        last_id, positions = to, positions_through(api, stream, to)
    with conn.transaction():
        store.ensure_checkpoint(conn, name, stream)
        store.lock_checkpoint(conn, name)
        if reset_state is not None:
            reset_state(conn, name)
        store.release_held(conn, name)  # from here on the records are applied (or skipped) from the stream again
        checkpoint = store.Checkpoint(name, stream, last_id, positions)
        store.save_checkpoint(conn, checkpoint)
    api.register(stream, name, last_id)
    log.info("checkpoint reset", consumer=name, stream=stream, to=to, last_id=last_id)
    return checkpoint
