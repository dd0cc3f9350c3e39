"""The chaos run's own tables, and every SQL statement the harness runs on them.

``chaos_applied`` gets one row per record a consumer applies, written in the handler's transaction (no unique
constraint: a record applied twice shows up twice). ``chaos_produced`` names the records the direct producers
staged, in their transaction, so the database says which unknown outcomes committed. The application's source
table decides the rest: its rows are the records its API created (cid ``<object>-<id>``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from psycopg import sql

from ..app import App

DDL = (
    """
    CREATE TABLE IF NOT EXISTS chaos_applied (
        consumer   TEXT NOT NULL,
        cid        TEXT NOT NULL,
        entry_id   TEXT,
        applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS chaos_produced (
        cid    TEXT PRIMARY KEY,
        row_id BIGINT,
        poison BOOLEAN NOT NULL DEFAULT false
    )
    """,
)

TRACK = (
    "INSERT INTO chaos_applied (consumer, cid, entry_id) SELECT %s, c, e FROM unnest(%s::text[], %s::text[]) AS t(c, e)"
)


def connect(database_url: str, **options: Any) -> psycopg.Connection[Any]:
    """A plain psycopg connection, as an application opens one (the harness uses no internals of the library)."""
    return psycopg.connect(database_url, connect_timeout=5, **options)


def create(conn: psycopg.Connection[Any]) -> None:
    for ddl in DDL:
        conn.execute(ddl)


def nonempty(conn: psycopg.Connection[Any], app: App) -> dict[str, int]:
    """Row counts of the tables that must start empty (the app's source and state, the chaos tables, staging)."""
    found = {}
    for table in (app.source_table, *app.state_tables, "chaos_applied", "chaos_produced", "staged_log_records"):
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()
        if row and row[0]:
            found[table] = int(row[0])
    return found


def track(conn: psycopg.Connection[Any], consumer: str, cids: Sequence[str], entry_ids: Sequence[str]) -> None:
    """Record that ``consumer`` applied these records, in the caller's (the handler's) transaction."""
    conn.execute(TRACK, (consumer, list(cids), list(entry_ids)))


def produced(conn: psycopg.Connection[Any], cid: str, *, row_id: int | None = None, poison: bool = False) -> None:
    """Record a record a direct producer staged, in its transaction."""
    conn.execute("INSERT INTO chaos_produced (cid, row_id, poison) VALUES (%s, %s, %s)", (cid, row_id, poison))


def applied(conn: psycopg.Connection[Any], names: Iterable[str]) -> dict[str, list[str]]:
    """Per consumer, the cid of every application, in order (every name in ``names`` is a key)."""
    result: dict[str, list[str]] = {name: [] for name in names}
    with conn.cursor() as cur:
        for consumer, cid in cur.execute("SELECT consumer, cid FROM chaos_applied ORDER BY applied_at"):
            result.setdefault(consumer, []).append(cid)
    return result


def canonical(conn: psycopg.Connection[Any], app: App) -> set[str]:
    """The cids the database says exist: every source row (by its producer's cid, else ``<object>-<id>``) and every
    record staged without one (poison)."""
    query = sql.SQL(
        """
        SELECT coalesce(p.cid, {prefix} || r.id) FROM {table} r LEFT JOIN chaos_produced p ON p.row_id = r.id
        UNION ALL
        SELECT cid FROM chaos_produced WHERE row_id IS NULL
        """
    ).format(prefix=sql.Literal(f"{app.source_object}-"), table=sql.Identifier(app.source_table))
    return {r[0] for r in conn.execute(query)}


def poison(conn: psycopg.Connection[Any]) -> set[str]:
    return {r[0] for r in conn.execute("SELECT cid FROM chaos_produced WHERE poison")}


def source_rows(conn: psycopg.Connection[Any], app: App) -> int:
    """How many source rows exist (0 before the app's tables do)."""
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (app.source_table,)).fetchone()
    if not row or not row[0]:
        return 0
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(app.source_table))).fetchone()
    return int(row[0]) if row else 0
