"""Least-privilege Postgres roles: exactly what each kind of unilog process may do to unilog's tables.

:data:`GRANTS` is the single statement of it (docs/guides/security.md prints the same list); :func:`grant` applies
it to roles the operator names, creating them if asked, in the caller's transaction. Roles are quoted as
identifiers, never pasted into SQL text. The application's own tables (a consumer's state, the producer's
business rows) are the application's to grant.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

# (privileges, table) per role kind. ``SELECT (id)``: emit's INSERT ... RETURNING id reads the new row's id, and
# only that column, so a producer can stage records but never read or delete them.
GRANTS: dict[str, list[tuple[str, str]]] = {
    "producer": [
        ("INSERT", "staged_log_records"),
        ("SELECT (id)", "staged_log_records"),
        ("USAGE", "SEQUENCE staged_log_records_id_seq"),
        ("SELECT", "SEQUENCE unilog_emit_mode"),  # unilog_stage reads the mode: a row, or a message in WAL mode
        ("SELECT", "unilog_schemas"),  # unilog_emit with a record type checks it against the registry
    ],
    "streamer": [
        # INSERT: a lost slot's record messages are staged again as rows (unilog/store/recovery.py)
        ("SELECT, INSERT, UPDATE, DELETE", "staged_log_records"),
        ("USAGE", "SEQUENCE staged_log_records_id_seq"),
        ("SELECT, INSERT, DELETE", "unilog_claims"),  # table mode's batches, saved before they are sent
        ("USAGE", "SEQUENCE unilog_claims_claim_seq"),
        ("SELECT, UPDATE", "unilog_producer"),
        ("SELECT, INSERT, UPDATE", "unilog_stream_positions"),
        # the mode and the last message published; WAL mode also needs the role attribute REPLICATION (security.md)
        ("SELECT, UPDATE", "unilog_capture"),
        ("SELECT, UPDATE", "SEQUENCE unilog_emit_mode"),  # a lost slot switches producers to rows
        ("SELECT, INSERT", "unilog_capture_losses"),  # a lost slot's recovery records what it cost
        ("USAGE", "SEQUENCE unilog_capture_losses_id_seq"),
        ("SELECT", "unilog_alembic_version"),
        ("EXECUTE", "FUNCTION pg_control_system()"),
    ],
    "consumer": [
        ("SELECT, INSERT, UPDATE", "unilog_checkpoints"),
        ("SELECT, INSERT, DELETE", "unilog_held_letters"),
        ("SELECT, INSERT, UPDATE, DELETE", "unilog_processed"),
        ("SELECT, INSERT, UPDATE, DELETE", "unilog_group_watermarks"),
        ("SELECT", "unilog_alembic_version"),
    ],
    "operator": [
        ("SELECT", "staged_log_records"),
        ("SELECT", "unilog_producer"),
        ("SELECT", "unilog_stream_positions"),
        ("SELECT", "unilog_capture"),
        ("SELECT, UPDATE", "unilog_capture_losses"),  # `unilog capture losses --ack`
        ("SELECT", "unilog_claims"),
        ("SELECT", "unilog_backfills"),  # `unilog status` shows the backfills
        ("SELECT", "unilog_schemas"),  # `unilog schema list|show|export|check`, `unilog asyncapi`, the dashboard
        ("SELECT", "unilog_schema_modes"),
        ("SELECT", "SEQUENCE unilog_emit_mode"),
        ("SELECT, INSERT, UPDATE, DELETE", "unilog_checkpoints"),
        ("SELECT, INSERT, DELETE", "unilog_held_letters"),
        ("SELECT, INSERT, UPDATE, DELETE", "unilog_processed"),
        ("SELECT, INSERT, UPDATE, DELETE", "unilog_group_watermarks"),
        ("SELECT", "unilog_alembic_version"),
    ],
}
KINDS = tuple(GRANTS)


def grant_statements(kind: str, role: str, schema: str = "public") -> list[sql.Composed]:
    """The ``GRANT`` statements that give ``role`` what a ``kind`` process needs (schema usage first)."""
    statements = [sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), sql.Identifier(role))]
    for privileges, target in GRANTS[kind]:
        on = target if " " in target else f"TABLE {target}"
        statements.append(sql.SQL(f"GRANT {privileges} ON {on} TO ") + sql.Identifier(role))
    return statements


def role_exists(conn: psycopg.Connection[Any], role: str) -> bool:
    row = conn.execute("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %s)", (role,)).fetchone()
    return bool(row and row[0])


def create_role(conn: psycopg.Connection[Any], role: str) -> None:
    """Create ``role`` as a login role without a password (set one, or use certificates, outside unilog)."""
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))


def grant(conn: psycopg.Connection[Any], kind: str, role: str) -> list[str]:
    """Apply :data:`GRANTS` for ``kind`` to ``role`` in the caller's transaction; return the statements as text."""
    row = conn.execute("SELECT current_schema()").fetchone()
    done = []
    for statement in grant_statements(kind, role, str(row[0]) if row else "public"):
        conn.execute(statement)
        done.append(statement.as_string(conn))
    return done
