"""The Postgres adapter: every SQL statement unilog runs lives here.

The streamer, the consumers and the CLI only call these functions; they never build SQL themselves. Functions take
an open psycopg connection and never commit unless their docstring says so: transaction boundaries belong to the
caller, because the guarantees (state and checkpoint in one transaction, delete only after Redis confirmed) are
decided there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from .config import redact_url
from .errors import SchemaMissing, ServerUnreachable

SCHEMA_HEAD = "unilog_0001"
VERSION_TABLE = "unilog_alembic_version"
NOTIFY_CHANNEL = "unilog_staged"


# -- connections ------------------------------------------------------------------------------------------------------


def connect(conninfo: str, *, autocommit: bool = False, application_name: str = "unilog") -> psycopg.Connection[Any]:
    """Open a psycopg connection, turning connection failures into :class:`ServerUnreachable`.

    The error names the server with its password redacted and says what to check.
    """
    try:
        return psycopg.connect(conninfo, autocommit=autocommit, application_name=application_name, connect_timeout=10)
    except psycopg.OperationalError as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise ServerUnreachable(
            f"cannot connect to Postgres at {redact_url(conninfo)}: {reason} "
            "(is the server running and DATABASE_URL right?)"
        ) from None


def check_schema(conn: psycopg.Connection[Any]) -> None:
    """Raise :class:`SchemaMissing` unless unilog's migrations are applied up to :data:`SCHEMA_HEAD` or later."""
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (VERSION_TABLE,)).fetchone()
    if not row or not row[0]:
        raise SchemaMissing("the database has no unilog schema: run `unilog migrate` (with DATABASE_URL set) first")
    versions = {r[0] for r in conn.execute(sql.SQL("SELECT version_num FROM {}").format(sql.Identifier(VERSION_TABLE)))}
    if not versions or not any(v >= SCHEMA_HEAD for v in versions if v.startswith("unilog_")):
        raise SchemaMissing(
            f"the unilog schema is at {sorted(versions) or 'no revision'}, this unilog needs {SCHEMA_HEAD}: "
            "run `unilog migrate`"
        )


# -- producer ---------------------------------------------------------------------------------------------------------

INSERT_STAGED = (
    "INSERT INTO staged_log_records (action, object, data, stream, key) "
    "VALUES (%(action)s, %(object)s, %(data)s::jsonb, %(stream)s, %(key)s) RETURNING id"
)


# -- streamer ---------------------------------------------------------------------------------------------------------


# A staged row as the streamer reads it: (id, action, object, data, key, created_ms). ``data`` is Postgres's JSON
# text, passed through to Redis without decoding; plain tuples because this is the streamer's hot path.
StagedRow = tuple[int, str, str, str, str | None, int]


@dataclass(frozen=True, slots=True)
class ProducerIdentity:
    """This database's identity as a producer: positions are per (producer, stream)."""

    producer_id: str
    epoch: int


def producer_identity(conn: psycopg.Connection[Any]) -> ProducerIdentity:
    """Read this database's producer id and epoch."""
    row = conn.execute("SELECT producer_id, epoch FROM unilog_producer").fetchone()
    if row is None:
        raise SchemaMissing("unilog_producer is empty: run `unilog migrate` again")
    return ProducerIdentity(producer_id=row[0], epoch=row[1])


def staged_sources(conn: psycopg.Connection[Any]) -> list[str]:
    """Distinct values of ``staged_log_records.stream``, found with a loose index scan (fast on big backlogs)."""
    rows = conn.execute(
        """
        WITH RECURSIVE s AS (
            (SELECT stream FROM staged_log_records ORDER BY stream LIMIT 1)
            UNION ALL
            SELECT (SELECT r.stream FROM staged_log_records r WHERE r.stream > s.stream ORDER BY r.stream LIMIT 1)
            FROM s WHERE s.stream IS NOT NULL
        )
        SELECT stream FROM s WHERE stream IS NOT NULL
        """
    ).fetchall()
    return [r[0] for r in rows]


FETCH_BATCH = """
    SELECT id, action, object, data::text, key, (extract(epoch FROM created_at) * 1000)::bigint
    FROM staged_log_records
    WHERE stream = %s AND xid < pg_snapshot_xmin(pg_current_snapshot())
    ORDER BY xid, id
    LIMIT %s
"""


def fetch_visible(conn: psycopg.Connection[Any], source: str, limit: int) -> list[StagedRow]:
    """The next ``limit`` staged records of ``source`` below the visibility horizon, in (xid, id) order.

    Only rows written by transactions older than every transaction still running are read, so no transaction
    can later commit a row that sorts before one already returned: the order is final, and a late commit is
    published after, never skipped.
    """
    return conn.execute(FETCH_BATCH, (source, limit)).fetchall()


def has_staged(conn: psycopg.Connection[Any], source: str) -> bool:
    """Whether committed rows of ``source`` exist at all (visible or still behind the horizon)."""
    row = conn.execute("SELECT EXISTS (SELECT 1 FROM staged_log_records WHERE stream = %s)", (source,)).fetchone()
    return bool(row and row[0])


def last_published_seq(conn: psycopg.Connection[Any], stream: str, epoch: int) -> int:
    """The last sequence number published on ``stream`` in ``epoch`` (0 if none)."""
    row = conn.execute("SELECT epoch, last_seq FROM unilog_stream_positions WHERE stream = %s", (stream,)).fetchone()
    if row is None or row[0] != epoch:
        return 0
    return int(row[1])


def delete_published(conn: psycopg.Connection[Any], ids: Sequence[int], stream: str, epoch: int, last_seq: int) -> int:
    """Delete the published rows and advance the stream's position, in the caller's transaction.

    Returns the number of rows deleted; the caller must check it equals ``len(ids)``.
    """
    cur = conn.execute("DELETE FROM staged_log_records WHERE id = ANY(%s)", (list(ids),))
    conn.execute(
        """
        INSERT INTO unilog_stream_positions (stream, epoch, last_seq) VALUES (%s, %s, %s)
        ON CONFLICT (stream) DO UPDATE SET epoch = excluded.epoch, last_seq = excluded.last_seq, updated_at = now()
        """,
        (stream, epoch, last_seq),
    )
    return cur.rowcount


def try_stream_lock(conn: psycopg.Connection[Any], stream: str) -> bool:
    """Take the session-level advisory lock that makes one streamer the publisher of ``stream``.

    The lock is released when the session ends, including when its process is killed, so a standby
    streamer takes over as soon as Postgres notices the dead connection.
    """
    row = conn.execute("SELECT pg_try_advisory_lock(hashtextextended('unilog.stream:' || %s, 0))", (stream,)).fetchone()
    return bool(row and row[0])


def staged_backlog(conn: psycopg.Connection[Any]) -> tuple[int, float | None]:
    """(number of committed staged records, age in seconds of the oldest one or None)."""
    row = conn.execute(
        "SELECT count(*), extract(epoch FROM now() - min(created_at))::float8 FROM staged_log_records"
    ).fetchone()
    assert row is not None
    return int(row[0]), row[1]


# -- consumers --------------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Checkpoint:
    """A consumer's progress: the last stream entry it consumed and, per producer, the last (epoch, seq) applied."""

    name: str
    stream: str
    last_id: str = "0-0"
    positions: dict[str, tuple[int, int]] = field(default_factory=dict)

    def copy(self) -> Checkpoint:
        return Checkpoint(self.name, self.stream, self.last_id, dict(self.positions))


def _checkpoint_from_row(name: str, row: tuple[Any, ...]) -> Checkpoint:
    stream, last_id, positions = row
    return Checkpoint(name, stream, last_id, {p: (int(e), int(s)) for p, (e, s) in positions.items()})


def ensure_checkpoint(conn: psycopg.Connection[Any], name: str, stream: str) -> Checkpoint:
    """Return consumer ``name``'s checkpoint, creating it at the stream's beginning if it does not exist."""
    conn.execute(
        "INSERT INTO unilog_checkpoints (name, stream) VALUES (%s, %s) ON CONFLICT (name) DO NOTHING", (name, stream)
    )
    row = conn.execute("SELECT stream, last_id, positions FROM unilog_checkpoints WHERE name = %s", (name,)).fetchone()
    assert row is not None
    return _checkpoint_from_row(name, row)


def lock_checkpoint(conn: psycopg.Connection[Any], name: str) -> Checkpoint | None:
    """Lock and return the checkpoint row, in the caller's transaction, so two copies of one consumer serialize."""
    row = conn.execute(
        "SELECT stream, last_id, positions FROM unilog_checkpoints WHERE name = %s FOR UPDATE", (name,)
    ).fetchone()
    return None if row is None else _checkpoint_from_row(name, row)


def save_checkpoint(conn: psycopg.Connection[Any], checkpoint: Checkpoint) -> None:
    """Write the checkpoint in the caller's transaction (which also holds the consumer's state changes)."""
    conn.execute(
        "UPDATE unilog_checkpoints SET last_id = %s, positions = %s::jsonb, updated_at = now() WHERE name = %s",
        (checkpoint.last_id, json.dumps({p: list(pos) for p, pos in checkpoint.positions.items()}), checkpoint.name),
    )


def list_checkpoints(conn: psycopg.Connection[Any]) -> list[Checkpoint]:
    """Every consumer checkpoint, by name."""
    rows = conn.execute("SELECT name, stream, last_id, positions FROM unilog_checkpoints ORDER BY name").fetchall()
    return [_checkpoint_from_row(r[0], r[1:]) for r in rows]
