"""Consistent reads for reconciliation: one exported REPEATABLE READ snapshot shared by parallel readers.

The driver exports the snapshot and keeps its transaction open while executors import it, so every slice of the
source table, the staged records and the stream position are read as of one instant.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
from psycopg import sql


def export_snapshot(conn: psycopg.Connection[Any]) -> str:
    """Begin a REPEATABLE READ transaction on ``conn`` and export its snapshot; the caller keeps the transaction
    open (the snapshot lives as long as it) and ends it with a rollback."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    row = conn.execute("SELECT pg_export_snapshot()").fetchone()
    assert row is not None
    return str(row[0])


def import_snapshot(conn: psycopg.Connection[Any], snapshot: str) -> None:
    """Begin a REPEATABLE READ transaction on ``conn`` that sees exactly what ``snapshot`` saw."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))


def _table(name: str) -> sql.Identifier:
    return sql.Identifier(*name.split("."))  # "schema.table" or "table"


def id_bounds(conn: psycopg.Connection[Any], table: str) -> tuple[int, int]:
    """(min(id), max(id)) of ``table``, (0, 0) when it is empty."""
    query = sql.SQL("SELECT coalesce(min(id), 0), coalesce(max(id), 0) FROM {}").format(_table(table))
    row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def rows_between(
    conn: psycopg.Connection[Any], table: str, columns: Sequence[str], lo: int, hi: int
) -> Iterator[tuple[Any, ...]]:
    """``columns`` of the rows of ``table`` with ``lo <= id < hi``."""
    query = sql.SQL("SELECT {} FROM {} WHERE id >= %s AND id < %s").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in columns), _table(table)
    )
    yield from conn.execute(query, (lo, hi))


def staged_records(conn: psycopg.Connection[Any], sources: Sequence[str]) -> list[tuple[str, str, Any]]:
    """(action, object, decoded data) of every staged record of ``sources`` (values of the ``stream`` column)."""
    return conn.execute(
        "SELECT action, object, data FROM staged_log_records WHERE stream = ANY(%s)", (list(sources),)
    ).fetchall()
