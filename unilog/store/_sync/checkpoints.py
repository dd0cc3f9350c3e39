# Generated from unilog/store/_async/checkpoints.py by tools/faces.py: do not edit.
"""The checkpoint statements both faces of a consumer run: read, create, lock and save a checkpoint, hold and take
dead letters (:mod:`unilog.store.checkpoints` adds what only the threaded face has). None of them commits: the
checkpoint is saved in the same transaction as the consumer's effects."""

from __future__ import annotations

from typing import Any

import psycopg

from ..rows import Checkpoint, checkpoint_from_row, save_params

SELECT_CHECKPOINT = "SELECT stream, last_id, positions FROM unilog_checkpoints WHERE name = %s"
INSERT_CHECKPOINT = "INSERT INTO unilog_checkpoints (name, stream) VALUES (%s, %s) ON CONFLICT (name) DO NOTHING"
SAVE_CHECKPOINT = (
    "UPDATE unilog_checkpoints SET last_id = %s, positions = %s::jsonb, updated_at = now() WHERE name = %s"
)
HOLD_LETTER = (
    "INSERT INTO unilog_held_letters (consumer, origin_id, stream) VALUES (%s, %s, %s) "
    "ON CONFLICT (consumer, origin_id) DO NOTHING"
)
TAKE_HELD = "DELETE FROM unilog_held_letters WHERE consumer = %s AND origin_id = ANY(%s) RETURNING origin_id"


def read_checkpoint(conn: psycopg.Connection[Any], name: str, *, lock: bool = False) -> Checkpoint | None:
    """Consumer ``name``'s checkpoint, or None if it has none: as committed (no lock), or with ``lock`` row-locked
    in the caller's transaction (copies serialize)."""
    cursor = conn.execute(SELECT_CHECKPOINT + (" FOR UPDATE" if lock else ""), (name,))
    row = cursor.fetchone()
    return None if row is None else checkpoint_from_row(name, row)


def ensure_checkpoint(conn: psycopg.Connection[Any], name: str, stream: str) -> Checkpoint:
    """Return consumer ``name``'s checkpoint, creating it at the stream's beginning if it does not exist."""
    conn.execute(INSERT_CHECKPOINT, (name, stream))
    checkpoint = read_checkpoint(conn, name)
    assert checkpoint is not None
    return checkpoint


def lock_checkpoint(conn: psycopg.Connection[Any], name: str) -> Checkpoint | None:
    """Lock and return the checkpoint row, in the caller's transaction, so two copies of one consumer serialize."""
    return read_checkpoint(conn, name, lock=True)


def save_checkpoint(conn: psycopg.Connection[Any], checkpoint: Checkpoint) -> None:
    """Write the checkpoint in the caller's transaction (which also holds the consumer's state changes)."""
    conn.execute(SAVE_CHECKPOINT, save_params(checkpoint))


def hold_letter(conn: psycopg.Connection[Any], consumer: str, stream: str, origin_id: str) -> None:
    """Remember, in the caller's transaction, that ``consumer`` dead-lettered the record first appended as
    ``origin_id`` without applying it (so a replay of it is applied once)."""
    conn.execute(HOLD_LETTER, (consumer, origin_id, stream))


def take_held(conn: psycopg.Connection[Any], consumer: str, origin_ids: list[str]) -> set[str]:
    """Forget the held records among ``origin_ids`` and return those that were held: the caller applies them in
    this transaction (a rollback holds them again)."""
    cursor = conn.execute(TAKE_HELD, (consumer, origin_ids))
    return {row[0] for row in cursor.fetchall()}


# -- a consumer over several streams: one row per stream, each statement over all of them at once -----------------

INSERT_CHECKPOINTS = (
    "INSERT INTO unilog_checkpoints (name, stream) SELECT * FROM unnest(%s::text[], %s::text[]) "
    "ON CONFLICT (name) DO NOTHING"
)
SELECT_CHECKPOINTS = (
    "SELECT name, stream, last_id, positions FROM unilog_checkpoints WHERE name = ANY(%s) ORDER BY name"
)
SAVE_CHECKPOINTS = (
    "UPDATE unilog_checkpoints AS c SET last_id = v.last_id, positions = v.positions::jsonb, updated_at = now() "
    "FROM unnest(%s::text[], %s::text[], %s::text[]) AS v(name, last_id, positions) WHERE c.name = v.name"
)


def read_checkpoints(conn: psycopg.Connection[Any], names: list[str], *, lock: bool = False) -> dict[str, Checkpoint]:
    """The checkpoints among ``names`` that exist, by name, in one statement: as committed, or with ``lock``
    row-locked in the caller's transaction, in name order (so copies of a consumer that lock overlapping sets of
    rows wait for each other instead of deadlocking)."""
    cursor = conn.execute(SELECT_CHECKPOINTS + (" FOR UPDATE" if lock else ""), (names,))
    return {row[0]: checkpoint_from_row(row[0], row[1:]) for row in cursor.fetchall()}


def ensure_checkpoints(conn: psycopg.Connection[Any], rows: dict[str, str]) -> dict[str, Checkpoint]:
    """The checkpoints of ``rows`` (name -> stream), those missing created at their stream's beginning, in two
    statements whatever their number."""
    names = sorted(rows)
    conn.execute(INSERT_CHECKPOINTS, (names, [rows[name] for name in names]))
    return read_checkpoints(conn, names)


def single_row_moved(
    conn: psycopg.Connection[Any], consumer: str, rows: dict[str, str]
) -> tuple[Checkpoint, str] | None:
    """Whether consumer ``consumer`` ran over one stream alone and now runs over several: its single-stream
    checkpoint (the row named ``consumer``) is on the stream of one of ``rows`` (name -> stream, the rows it keeps per
    stream now) whose row does not exist yet. Returns that checkpoint and the row's name, else None. Such a row,
    created, would start at the stream's beginning: what the consumer applied would be applied again."""
    single = read_checkpoint(conn, consumer)
    if single is None or (single.last_id == "0-0" and not single.positions):
        return None  # nothing applied from it: the new row starting at the beginning is right
    wanted = sorted(name for name, stream in rows.items() if stream == single.stream and name != consumer)
    if not wanted:
        return None
    found = read_checkpoints(conn, wanted)
    missing = [name for name in wanted if name not in found]
    return (single, missing[0]) if missing else None


def save_checkpoints(conn: psycopg.Connection[Any], checkpoints: list[Checkpoint]) -> None:
    """Write ``checkpoints`` in the caller's transaction, in one statement (see :func:`save_checkpoint`)."""
    params = [save_params(c) for c in sorted(checkpoints, key=lambda c: c.name)]
    conn.execute(SAVE_CHECKPOINTS, ([p[2] for p in params], [p[0] for p in params], [p[1] for p in params]))
