"""Consumer checkpoints: the last entry consumed and, per producer, the last position applied.

A checkpoint is saved in the same transaction as the consumer's effects; these functions never commit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import psycopg


@dataclass(slots=True)
class Checkpoint:
    """A consumer's progress: the last stream entry it consumed and, per producer, the last (epoch, seq) applied."""

    name: str
    stream: str
    last_id: str = "0-0"
    positions: dict[str, tuple[int, int]] = field(default_factory=dict)

    def copy(self) -> Checkpoint:
        return Checkpoint(self.name, self.stream, self.last_id, dict(self.positions))


# the statements the asyncio consumer runs too (``store.aio``), written once
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


def save_params(checkpoint: Checkpoint) -> tuple[str, str, str]:
    """:data:`SAVE_CHECKPOINT`'s parameters."""
    return checkpoint.last_id, json.dumps({p: list(pos) for p, pos in checkpoint.positions.items()}), checkpoint.name


def checkpoint_from_row(name: str, row: tuple[Any, ...]) -> Checkpoint:
    stream, last_id, positions = row
    if isinstance(positions, str):  # a connection whose jsonb loader gives text (Django registers one)
        positions = json.loads(positions)
    return Checkpoint(name, stream, last_id, {p: (int(e), int(s)) for p, (e, s) in positions.items()})


def _read_checkpoint(conn: psycopg.Connection[Any], name: str, *, for_update: bool = False) -> Checkpoint | None:
    row = conn.execute(SELECT_CHECKPOINT + (" FOR UPDATE" if for_update else ""), (name,)).fetchone()
    return None if row is None else checkpoint_from_row(name, row)


def read_checkpoint(conn: psycopg.Connection[Any], name: str) -> Checkpoint | None:
    """Consumer ``name``'s checkpoint as committed (no lock), or None if it has none."""
    return _read_checkpoint(conn, name)


def ensure_checkpoint(conn: psycopg.Connection[Any], name: str, stream: str) -> Checkpoint:
    """Return consumer ``name``'s checkpoint, creating it at the stream's beginning if it does not exist."""
    conn.execute(INSERT_CHECKPOINT, (name, stream))
    checkpoint = _read_checkpoint(conn, name)
    assert checkpoint is not None
    return checkpoint


def lock_checkpoint(conn: psycopg.Connection[Any], name: str) -> Checkpoint | None:
    """Lock and return the checkpoint row, in the caller's transaction, so two copies of one consumer serialize."""
    return _read_checkpoint(conn, name, for_update=True)


def lock_consumer(conn: psycopg.Connection[Any], name: str) -> Checkpoint | None:
    """Serialize copies of consumer ``name`` with a transaction-level advisory lock, then read its checkpoint.

    Unlike :func:`lock_checkpoint` this takes no row lock, so the transaction gets no transaction id: a consumer that
    computes for long before it writes (a Spark job) holds no transaction id open meanwhile (it would hold back vacuum).
    Before it saves, it must re-read the row with :func:`lock_checkpoint` and find it unchanged (a copy that does not
    take this lock, a Python consumer of the same name, may have moved it)."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('unilog.consumer:' || %s, 0))", (name,))
    return _read_checkpoint(conn, name)


def save_checkpoint(conn: psycopg.Connection[Any], checkpoint: Checkpoint) -> None:
    """Write the checkpoint in the caller's transaction (which also holds the consumer's state changes)."""
    conn.execute(SAVE_CHECKPOINT, save_params(checkpoint))


def list_checkpoints(conn: psycopg.Connection[Any]) -> list[Checkpoint]:
    """Every consumer checkpoint, by name."""
    rows = conn.execute("SELECT name, stream, last_id, positions FROM unilog_checkpoints ORDER BY name").fetchall()
    return [checkpoint_from_row(r[0], r[1:]) for r in rows]


def checkpoint_stream(conn: psycopg.Connection[Any], name: str) -> str | None:
    """The stream consumer ``name`` reads, or None if it has no checkpoint."""
    checkpoint = _read_checkpoint(conn, name)
    return None if checkpoint is None else checkpoint.stream


def hold_letter(conn: psycopg.Connection[Any], consumer: str, stream: str, origin_id: str) -> None:
    """Remember, in the caller's transaction, that ``consumer`` dead-lettered the record first appended as
    ``origin_id`` without applying it (so a replay of it is applied once)."""
    conn.execute(HOLD_LETTER, (consumer, origin_id, stream))


def take_held(conn: psycopg.Connection[Any], consumer: str, origin_ids: list[str]) -> set[str]:
    """Forget the held records among ``origin_ids`` and return those that were held: the caller applies them in
    this transaction (a rollback holds them again)."""
    rows = conn.execute(TAKE_HELD, (consumer, origin_ids)).fetchall()
    return {row[0] for row in rows}


def release_held(conn: psycopg.Connection[Any], consumer: str, origin_id: str | None = None) -> int:
    """Forget ``consumer``'s held record ``origin_id`` (every one, if None: a reset); return how many."""
    if origin_id is None:
        return conn.execute("DELETE FROM unilog_held_letters WHERE consumer = %s", (consumer,)).rowcount
    query = "DELETE FROM unilog_held_letters WHERE consumer = %s AND origin_id = %s"
    return conn.execute(query, (consumer, origin_id)).rowcount


def delete_checkpoint(conn: psycopg.Connection[Any], name: str) -> tuple[Checkpoint | None, int]:
    """Delete consumer ``name``'s checkpoint and the records it holds (dead-lettered, not applied), in the caller's
    transaction; return the checkpoint that was deleted (None if it had none) and how many held records went.

    The row is locked first, so a batch the consumer is applying commits (or rolls back) before it goes."""
    checkpoint = _read_checkpoint(conn, name, for_update=True)
    conn.execute("DELETE FROM unilog_checkpoints WHERE name = %s", (name,))
    return checkpoint, release_held(conn, name)


def sessions_of(conn: psycopg.Connection[Any], names: list[str], prefixes: list[str]) -> list[tuple[int, str]]:
    """(pid, application_name) of the other sessions whose ``application_name`` is one of ``names`` or starts with
    one of ``prefixes``: how a process of a consumer or group shows it is connected (its ``unilog-consumer-NAME``
    session). Names longer than Postgres keeps (63 bytes) are compared as it keeps them."""
    rows = conn.execute(
        """
        SELECT pid, application_name FROM pg_stat_activity
        WHERE pid <> pg_backend_pid()
          AND (application_name = ANY(%s::text[])
               OR EXISTS (SELECT 1 FROM unnest(%s::text[]) AS p WHERE starts_with(application_name, p)))
        ORDER BY pid
        """,
        ([n[:63] for n in names], [p[:63] for p in prefixes]),
    ).fetchall()
    return [(int(pid), str(app)) for pid, app in rows]
