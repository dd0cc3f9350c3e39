"""The schema registry: record types' JSON Schemas by name and version (``unilog_schemas``) and each stream's
compatibility mode (``unilog_schema_modes``).

Written by ``unilog schema`` (and migrations), never by a producer at run time. These functions never commit: the
command registers a module's types in one transaction, so a refusal registers none of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from ..config import SCHEMA_MODES
from ..errors import ConfigurationError, SchemaIncompatible

# a stream without a row in unilog_schema_modes has the default
DEFAULT_SCHEMA_MODE = "backward"


@dataclass(frozen=True)
class SchemaRow:
    """One registered version of a record type. ``stream`` is ``''`` for the default stream; ``registered_at`` is
    None for a row not yet registered (the database sets it)."""

    name: str
    version: int
    stream: str
    object: str
    action: str
    schema: dict[str, Any]
    fingerprint: str
    registered_at: datetime | None = None
    retired_at: datetime | None = None

    @property
    def type_tag(self) -> str:
        return f"{self.name}@{self.version}"


_COLUMNS = "name, version, stream, object, action, schema, fingerprint, registered_at, retired_at"
SELECT_SCHEMAS = f"SELECT {_COLUMNS} FROM unilog_schemas"
INSERT_SCHEMA = (
    "INSERT INTO unilog_schemas (name, version, stream, object, action, schema, fingerprint) "
    "VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s) ON CONFLICT (name, version) DO NOTHING"
)
RETIRE_SCHEMA = (
    "UPDATE unilog_schemas SET retired_at = coalesce(retired_at, now()) WHERE name = %s AND version = %s "
    f"RETURNING {_COLUMNS}"
)
SET_MODE = (
    "INSERT INTO unilog_schema_modes (stream, mode) VALUES (%s, %s) ON CONFLICT (stream) DO UPDATE SET mode = "
    "excluded.mode"
)


def _row(values: tuple[Any, ...]) -> SchemaRow:
    name, version, stream, object_, action, schema, fingerprint, registered_at, retired_at = values
    if isinstance(schema, str):  # a connection whose jsonb loader gives text (Django registers one)
        schema = json.loads(schema)
    return SchemaRow(name, version, stream, object_, action, schema, fingerprint, registered_at, retired_at)


def stream_modes(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """Every stream's mode set with ``unilog schema mode`` (a stream not in it has the default)."""
    return {stream: mode for stream, mode in conn.execute("SELECT stream, mode FROM unilog_schema_modes").fetchall()}


def registered(conn: psycopg.Connection[Any], name: str | None = None) -> list[SchemaRow]:
    """Every registered version (retired ones included), of type ``name`` only if given, by name and version."""
    where, params = (" WHERE name = %s", (name,)) if name is not None else ("", ())
    rows = conn.execute(SELECT_SCHEMAS + where + " ORDER BY name, version", params).fetchall()
    return [_row(r) for r in rows]


def register(conn: psycopg.Connection[Any], row: SchemaRow) -> bool:
    """Register ``row`` in the caller's transaction; True if it was new, False if the same name and version were
    registered with the same fingerprint already (idempotent). Another fingerprint under that name and version is
    :class:`~unilog.errors.SchemaIncompatible`: a registered version never changes (bump the version)."""
    params = (row.name, row.version, row.stream, row.object, row.action, json.dumps(row.schema), row.fingerprint)
    if conn.execute(INSERT_SCHEMA, params).rowcount == 1:
        return True
    found = conn.execute(SELECT_SCHEMAS + " WHERE name = %s AND version = %s", (row.name, row.version)).fetchone()
    if found is None:  # deleted between the two statements: not a conflict, try once more
        return conn.execute(INSERT_SCHEMA, params).rowcount == 1
    existing = _row(found)
    if existing.fingerprint != row.fingerprint:
        raise SchemaIncompatible(changed_line(row, existing))
    return False


def changed_line(row: SchemaRow, existing: SchemaRow) -> str:
    """The one line refusing ``row``, whose schema differs from the one registered under its name and version."""
    return (
        f"{row.name} v{row.version}: the schema differs from the one registered as v{row.version} "
        f"({existing.fingerprint[:19]}, now {row.fingerprint[:19]}): a registered version never changes, "
        f"bump the version to v{row.version + 1}"
    )


def lock_registry(conn: psycopg.Connection[Any]) -> None:
    """Serialize registrations until the caller's transaction ends (a transaction-level advisory lock), so a check
    and the registration it allows see the same registry."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('unilog.schemas', 0))")


def stream_mode(conn: psycopg.Connection[Any], stream: str) -> str:
    """The compatibility mode of ``stream``'s record types (:data:`DEFAULT_SCHEMA_MODE` unless one was set)."""
    row = conn.execute("SELECT mode FROM unilog_schema_modes WHERE stream = %s", (stream,)).fetchone()
    return DEFAULT_SCHEMA_MODE if row is None else str(row[0])


def set_stream_mode(conn: psycopg.Connection[Any], stream: str, mode: str) -> None:
    """Set ``stream``'s compatibility mode (one of :data:`SCHEMA_MODES`, else ConfigurationError), in the caller's
    transaction."""
    if mode not in SCHEMA_MODES:
        raise ConfigurationError(f"{mode!r} is not a compatibility mode: one of {', '.join(SCHEMA_MODES)}")
    conn.execute(SET_MODE, (stream, mode))


def retire(conn: psycopg.Connection[Any], name: str, version: int) -> SchemaRow | None:
    """Mark ``name`` v``version`` retired (now, unless it was already: its first retirement stays), in the caller's
    transaction; the row, or None if that version is not registered. A retired version stays readable (``show``)
    but no longer counts in compatibility checks."""
    found = conn.execute(RETIRE_SCHEMA, (name, version)).fetchone()
    return None if found is None else _row(found)
