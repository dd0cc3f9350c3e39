"""Backfills' SQL: checking a table, its key and a ``--where`` before anything is staged, reading one page of rows
under row locks, and the cursor table ``unilog_backfills`` (migration unilog_0008).

The page statement and the cursor's update run in the caller's transaction (:mod:`unilog.produce.backfill` stages the
page's records in the same one); nothing here commits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

# the session-level lock a running backfill holds: one process per backfill, and `status` tells running from stopped
_LOCK_PREFIX = "unilog.backfill:"


@dataclass(frozen=True)
class Table:
    """A table as Postgres resolved the name: its oid, schema and name."""

    oid: int
    schema: str
    name: str
    kind: str

    @property
    def ident(self) -> sql.Composable:
        return sql.Identifier(self.schema, self.name)

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"


@dataclass(frozen=True)
class Column:
    """A table column: its name, its type as SQL text, whether it is NOT NULL, and its scalar type
    (``scalar_oid``/``scalar_name``/``scalar_kind``: the element type of an array, the base type of a domain)."""

    name: str
    type_sql: str
    attnum: int
    not_null: bool
    scalar_oid: int
    scalar_name: str
    scalar_kind: str

    @property
    def is_array(self) -> bool:
        return self.type_sql.endswith("]")


# A record's data is the row as one JSON object built by Postgres (row_to_json), so no value passes through a Python
# type: a jsonb 0.33333333333333333333 stays that, and a float4 0.1 is 0.1. Each column is put in by emit's rules:
# types JSON holds as they are (numbers, booleans, text, json/jsonb, dates and times as ISO 8601 strings), numeric
# and money as strings (emit's rule for Decimal: exact, and what a Numeric column emitted live looks like), bytea as
# base64, transaction ids as numbers, and every other type (interval, inet, a range, a composite...) as Postgres's
# text form; an array of any of them as a JSON array of the same.
_AS_JSON = frozenset(
    (
        *("bool", "int2", "int4", "int8", "float4", "float8", "text", "varchar", "bpchar", "char", "name"),
        *("citext", "uuid", "json", "jsonb", "date", "time", "timetz", "timestamp", "timestamptz"),
    )
)
_FLOATS = frozenset(("float4", "float8"))


def _value(column: Column, ref: sql.Composable) -> sql.Composable:
    """The column's value as row_to_json should see it (see above)."""
    arr = "[]" if column.is_array else ""
    name = column.scalar_name
    if name in _AS_JSON or column.scalar_kind == "e":  # an enum's label is a JSON string
        return ref
    if name == "numeric":
        return sql.SQL("{}::text" + arr).format(ref)
    if name == "money":
        return sql.SQL("{}::numeric" + arr + "::text" + arr).format(ref)
    if name in ("xid", "xid8", "oid"):
        return sql.SQL("{}::text" + arr + "::numeric" + arr).format(ref)
    if name == "bytea":
        one = "translate(encode({}, 'base64'), E'\\n', '')"
        if not column.is_array:
            return sql.SQL(one).format(ref)
        many = "CASE WHEN {} IS NULL THEN NULL ELSE ARRAY(SELECT " + one + " FROM unnest({}) AS e) END"
        return sql.SQL(many).format(ref, sql.Identifier("e"), ref)
    return sql.SQL("{}::text" + arr).format(ref)


def _not_finite(column: Column, ref: sql.Composable) -> sql.Composable | None:
    """For a float column: the column's name and what it holds when that is NaN or +-Infinity (no JSON number is),
    else NULL; None for other columns."""
    if column.scalar_name not in _FLOATS:
        return None
    bad = sql.SQL("ARRAY['NaN', 'Infinity', '-Infinity']::float8[]")
    if column.is_array:
        return sql.SQL("CASE WHEN {}::float8[] && {} THEN {} END").format(
            ref, bad, sql.Literal(f"data[{column.name!r}] contains NaN or Infinity")
        )
    return sql.SQL("CASE WHEN {}::float8 = ANY({}) THEN {} || {}::text END").format(
        ref, bad, sql.Literal(f"data[{column.name!r}] is "), ref
    )


def resolve_table(conn: psycopg.Connection[Any], name: str) -> Table | None:
    """The table (or view, partitioned table, ...) ``name`` denotes on the search path, or None if there is none;
    :class:`psycopg.errors.InvalidName` if ``name`` is not a name."""
    row = conn.execute(
        "SELECT c.oid, n.nspname, c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.oid = to_regclass(%s)",
        (name,),
    ).fetchone()
    return None if row is None else Table(int(row[0]), row[1], row[2], row[3])


def table_columns(conn: psycopg.Connection[Any], table: Table) -> list[Column]:
    """The table's columns in order (dropped ones left out)."""
    rows = conn.execute(
        """
        SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnum, a.attnotnull,
               coalesce(e.oid, b.oid), coalesce(e.typname, b.typname), coalesce(e.typtype, b.typtype)
        FROM pg_attribute a
        JOIN pg_type t ON t.oid = a.atttypid
        JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
        LEFT JOIN pg_type e ON e.oid = b.typelem AND b.typcategory = 'A'
        WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY a.attnum
        """,
        (table.oid,),
    ).fetchall()
    return [Column(r[0], r[1], int(r[2]), bool(r[3]), int(r[4]), r[5], r[6]) for r in rows]


def privileges(conn: psycopg.Connection[Any], table: Table) -> tuple[bool, bool]:
    """(may SELECT the table, may UPDATE some column of it: what ``SELECT ... FOR SHARE`` needs) for this role."""
    row = conn.execute(
        "SELECT has_table_privilege(%s::oid, 'SELECT'), has_any_column_privilege(%s::oid, 'UPDATE')",
        (table.oid, table.oid),
    ).fetchone()
    assert row is not None
    return bool(row[0]), bool(row[1])


def is_unique_key(conn: psycopg.Connection[Any], table: Table, column: Column) -> bool:
    """Whether a valid, non-partial unique index (a primary key included) covers exactly ``column``."""
    row = conn.execute(
        """
        SELECT EXISTS (
            SELECT 1 FROM pg_index i
            WHERE i.indrelid = %s AND i.indisunique AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL
              AND i.indnkeyatts = 1 AND i.indkey[0] = %s
        )
        """,
        (table.oid, column.attnum),
    ).fetchone()
    return bool(row and row[0])


def check_orderable(conn: psycopg.Connection[Any], table: Table, column: Column) -> None:
    """Plan ``ORDER BY column``: raises (``UndefinedFunction``: no ordering operator) if its type has no order."""
    conn.execute(sql.SQL("EXPLAIN SELECT 1 FROM {} ORDER BY {}").format(table.ident, sql.Identifier(column.name)))


def page_query(table: Table, columns: list[Column], key: Column, where: str | None, after: bool) -> sql.Composed:
    """The page statement: per row, the key as text, the row's data as JSON text (see :func:`_value`) and why it
    cannot be a record (a float column's NaN or Infinity; NULL if it can), of the next rows after the cursor
    (``after``: a parameter, the last key as text) that match ``where``, in key order, ``LIMIT`` a parameter, each
    row locked ``FOR SHARE`` (an update of one waits for the page's commit; the page waits for an update in
    progress)."""
    key_ident = sql.Identifier(key.name)
    conditions: list[sql.Composable] = []
    if where:
        conditions.append(_where(where))
    if after:
        conditions.append(sql.SQL("{} > %s::{}").format(key_ident, sql.SQL(key.type_sql)))
    filtered = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions) if conditions else sql.SQL("")
    refs = [sql.Identifier(table.name, c.name) for c in columns]
    values = sql.SQL(", ").join(
        sql.SQL("{} AS {}").format(_value(c, ref), sql.Identifier(c.name)) for c, ref in zip(columns, refs, strict=True)
    )
    checks = [e for c, ref in zip(columns, refs, strict=True) if (e := _not_finite(c, ref)) is not None]
    bad = sql.SQL("coalesce({})").format(sql.SQL(", ").join(checks)) if checks else sql.SQL("NULL::text")
    return sql.SQL(
        "SELECT {}::text AS unilog_key, (SELECT row_to_json(unilog_row) FROM (SELECT {}) AS unilog_row)::text, {} "
        "FROM {}{} ORDER BY {} LIMIT %s FOR SHARE OF {}"
    ).format(
        key_ident,
        values,
        bad,
        table.ident,
        filtered,
        sql.Identifier(table.schema, table.name, key.name),
        sql.Identifier(table.name),
    )


def _where(where: str) -> sql.Composable:
    """The operator's ``--where`` in parentheses, its ``%`` escaped (statements here always pass parameters)."""
    return sql.SQL("(") + sql.SQL(where.replace("%", "%%")) + sql.SQL(")")


def check_page(
    conn: psycopg.Connection[Any], table: Table, columns: list[Column], key: Column, where: str | None
) -> None:
    """Plan the page statement (nothing read, nothing locked): raises psycopg's error if ``where`` does not parse,
    names what does not exist, or cannot go with row locks."""
    query = page_query(table, columns, key, where, after=True)
    conn.execute(sql.SQL("EXPLAIN ") + query, (None, 1))


def estimate_rows(conn: psycopg.Connection[Any], table: Table, where: str | None, exact_below: int) -> int:
    """The rows ``where`` matches: the planner's estimate (from ``pg_class.reltuples``), counted exactly when the
    estimate is below ``exact_below`` (small tables, and tables never analyzed, are estimated poorly)."""
    filtered = sql.SQL(" WHERE ") + _where(where) if where else sql.SQL("")
    body = sql.SQL("SELECT 1 FROM {}{}").format(table.ident, filtered)
    row = conn.execute(sql.SQL("EXPLAIN (FORMAT JSON) ") + body, ()).fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    estimate = int(plan[0]["Plan"]["Plan Rows"])
    if estimate < exact_below:
        counted = conn.execute(sql.SQL("SELECT count(*) FROM ({}) AS rows").format(body), ()).fetchone()
        estimate = int(counted[0]) if counted else estimate
    return estimate


def read_page(
    conn: psycopg.Connection[Any], query: sql.Composed, last_key: str | None, limit: int
) -> list[tuple[Any, ...]]:
    """Run :func:`page_query`'s statement (``query``, built with ``after=last_key is not None``)."""
    params = (limit,) if last_key is None else (last_key, limit)
    return conn.execute(query, params).fetchall()


# -- the cursor table ---------------------------------------------------------------------------------------------

CURSOR_COLUMNS = (
    "name, table_name, key_column, where_sql, stream, object, action, batch_size, rate, last_key, rows_done, "
    "rows_estimate, status, extract(epoch FROM started_at)::float8, extract(epoch FROM updated_at)::float8, "
    "extract(epoch FROM finished_at)::float8, record_type"
)
_FIELDS = (
    "name", "table", "key", "where", "stream", "object", "action", "batch_size", "rate", "last_key", "rows_done",
    "rows_estimate", "status", "started_at", "updated_at", "finished_at", "record_type",
)  # fmt: skip


def _cursor(row: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(_FIELDS, row, strict=True))


def start_backfill(conn: psycopg.Connection[Any], spec: dict[str, Any]) -> None:
    """Create the cursor row ``spec["name"]`` at the start (or start a finished or cancelled one over)."""
    conn.execute(
        """
        INSERT INTO unilog_backfills (name, table_name, key_column, where_sql, stream, object, action, batch_size, rate,
                                      rows_estimate, record_type)
        VALUES (%(name)s, %(table)s, %(key)s, %(where)s, %(stream)s, %(object)s, %(action)s, %(batch_size)s, %(rate)s,
                %(rows_estimate)s, %(record_type)s)
        ON CONFLICT (name) DO UPDATE SET
            table_name = EXCLUDED.table_name, key_column = EXCLUDED.key_column, where_sql = EXCLUDED.where_sql,
            stream = EXCLUDED.stream, object = EXCLUDED.object, action = EXCLUDED.action,
            record_type = EXCLUDED.record_type,
            batch_size = EXCLUDED.batch_size, rate = EXCLUDED.rate, rows_estimate = EXCLUDED.rows_estimate,
            last_key = NULL, rows_done = 0, status = 'running', started_at = now(), updated_at = now(),
            finished_at = NULL
        """,
        spec,
    )


def get_backfill(conn: psycopg.Connection[Any], name: str) -> dict[str, Any] | None:
    """The cursor row ``name`` as a dict (see ``_FIELDS``), or None."""
    row = conn.execute(f"SELECT {CURSOR_COLUMNS} FROM unilog_backfills WHERE name = %s", (name,)).fetchone()
    return None if row is None else _cursor(row)


def lock_backfill(conn: psycopg.Connection[Any], name: str) -> dict[str, Any] | None:
    """The cursor row ``name``, locked until the caller's transaction ends (a cancel waits for the page)."""
    row = conn.execute(f"SELECT {CURSOR_COLUMNS} FROM unilog_backfills WHERE name = %s FOR UPDATE", (name,)).fetchone()
    return None if row is None else _cursor(row)


def advance_backfill(conn: psycopg.Connection[Any], name: str, last_key: str, rows: int) -> None:
    """Move the cursor past a page of ``rows`` rows whose last key is ``last_key``."""
    conn.execute(
        "UPDATE unilog_backfills SET last_key = %s, rows_done = rows_done + %s, updated_at = now() WHERE name = %s",
        (last_key, rows, name),
    )


def set_pace(conn: psycopg.Connection[Any], name: str, batch_size: int, rate: float | None) -> None:
    """Give backfill ``name`` a new page size and rate (a resume with other options)."""
    conn.execute(
        "UPDATE unilog_backfills SET batch_size = %s, rate = %s, updated_at = now() WHERE name = %s",
        (batch_size, rate, name),
    )


def finish_backfill(conn: psycopg.Connection[Any], name: str, status: str) -> bool:
    """Set a running backfill's final ``status`` (``done``, ``cancelled``); False if it was not running."""
    row = conn.execute(
        "UPDATE unilog_backfills SET status = %s, updated_at = now(), finished_at = now() "
        "WHERE name = %s AND status = 'running' RETURNING name",
        (status, name),
    ).fetchone()
    return row is not None


def list_backfills(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    """Every cursor row, newest first, each with ``active``: whether a process runs it now (holds its lock)."""
    rows = conn.execute(
        f"""
        SELECT {CURSOR_COLUMNS}, EXISTS (
            SELECT 1 FROM pg_locks
            WHERE locktype = 'advisory' AND granted AND objsubid = 1
              AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
              AND ((classid::bigint << 32) | objid::bigint) = hashtextextended(%s || name, 0)
        )
        FROM unilog_backfills ORDER BY started_at DESC, name
        """,
        (_LOCK_PREFIX,),
    ).fetchall()
    return [{**_cursor(r[:-1]), "active": bool(r[-1])} for r in rows]


def try_backfill_lock(conn: psycopg.Connection[Any], name: str) -> bool:
    """Take the session-level lock of backfill ``name`` (held while a process runs it); False if another holds it."""
    row = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s || %s, 0))", (_LOCK_PREFIX, name)).fetchone()
    return bool(row and row[0])
