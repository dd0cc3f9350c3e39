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


# -- the backfill step (unilog/harness/chaos/mirror.py) ------------------------------------------------------------

MIRROR_DDL = (
    "CREATE TABLE IF NOT EXISTS chaos_accounts (id BIGINT PRIMARY KEY, balance INT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS chaos_mirror (id BIGINT PRIMARY KEY, balance INT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS chaos_mirror_inversions (id BIGINT NOT NULL, before INT NOT NULL, got INT NOT NULL, "
    "action TEXT NOT NULL)",
)


def create_accounts(conn: psycopg.Connection[Any], rows: int) -> None:
    """The table the backfill step backfills (``rows`` rows, balance 0) and the mirror its consumer keeps."""
    for ddl in MIRROR_DDL:
        conn.execute(ddl)
    conn.execute("INSERT INTO chaos_accounts SELECT i, 0 FROM generate_series(1, %s) i ON CONFLICT DO NOTHING", (rows,))


def bump(conn: psycopg.Connection[Any], row_id: int) -> int | None:
    """Add 1 to a row's balance in the caller's transaction; its new balance (None: no such row)."""
    row = conn.execute("UPDATE chaos_accounts SET balance = balance + 1 WHERE id = %s RETURNING balance", (row_id,))
    found = row.fetchone()
    return None if found is None else int(found[0])


def mirror(conn: psycopg.Connection[Any], row_id: int, balance: int, action: str) -> None:
    """The mirror consumer's effect: the row's balance, as the record says (in the handler's transaction). A value
    that arrives out of order is kept in ``chaos_mirror_inversions``: an update's balance must be above the mirror's
    (each update adds 1), a backfill's at or above it (it may carry the value the last update's record already set)."""
    row = conn.execute("SELECT balance FROM chaos_mirror WHERE id = %s", (row_id,)).fetchone()
    before = None if row is None else int(row[0])
    if before is not None and (balance < before or (balance == before and action != "backfill")):
        conn.execute(
            "INSERT INTO chaos_mirror_inversions (id, before, got, action) VALUES (%s, %s, %s, %s)",
            (row_id, before, balance, action),
        )
    conn.execute(
        "INSERT INTO chaos_mirror (id, balance) VALUES (%s, %s) ON CONFLICT (id) DO UPDATE SET balance = %s",
        (row_id, balance, balance),
    )


def mirror_differences(conn: psycopg.Connection[Any]) -> tuple[int, list[tuple[int, int | None, int | None]]]:
    """(rows of ``chaos_accounts``, every row where the mirror differs: (id, table's balance, mirror's balance))."""
    row = conn.execute("SELECT count(*) FROM chaos_accounts").fetchone()
    differ = conn.execute(
        "SELECT coalesce(a.id, m.id), a.balance, m.balance FROM chaos_accounts a FULL JOIN chaos_mirror m USING (id) "
        "WHERE a.balance IS DISTINCT FROM m.balance ORDER BY 1"
    ).fetchall()
    return (int(row[0]) if row else 0), [(int(r[0]), r[1], r[2]) for r in differ]


def mirror_inversions(conn: psycopg.Connection[Any]) -> list[tuple[int, int, int, str]]:
    """Every value the mirror received out of order: (id, the mirror's balance, the record's, its action)."""
    rows = conn.execute("SELECT id, before, got, action FROM chaos_mirror_inversions ORDER BY id").fetchall()
    return [(int(r[0]), int(r[1]), int(r[2]), str(r[3])) for r in rows]


def first_applied_after(conn: psycopg.Connection[Any], since: float) -> dict[str, float]:
    """Each consumer's first application after ``since`` (epoch seconds): its transaction's start, epoch seconds."""
    rows = conn.execute(
        "SELECT consumer, extract(epoch FROM min(applied_at))::float8 FROM chaos_applied "
        "WHERE applied_at > to_timestamp(%s) GROUP BY consumer ORDER BY consumer",
        (since,),
    ).fetchall()
    return {str(name): float(at) for name, at in rows}


def staged_diagnosis(database_url: str) -> list[str]:
    """What a run that did not quiesce with rows staged needs to be understood: the rows' ids and transaction ids
    against the WAL capture's ``from_xid``, the capture's state (hold, saved mark), the database's slots, the losses
    recorded, and the sessions of unilog's processes. Best effort: a failed read is named instead."""
    lines: list[str] = []
    queries = {
        "staged rows": "SELECT count(*), min(id), max(id), min(xid::text::bigint), max(xid::text::bigint), "
        "min(created_at)::text, max(created_at)::text, count(DISTINCT stream) FROM staged_log_records",
        "claims": "SELECT claim, source, lo, hi, records FROM unilog_claims ORDER BY claim LIMIT 5",
        "capture": "SELECT slot_name, from_xid::text, message_lsn::text, message_ordinal, held_reason, held_saved, "
        "held_lsn::text, enabled_at::text FROM unilog_capture",
        "slots": "SELECT to_jsonb(s) - 'plugin' - 'slot_type' - 'datoid' FROM pg_replication_slots s",
        "losses": "SELECT id, slot, from_lsn::text, to_lsn::text, recovered, lost, detail FROM unilog_capture_losses",
        "positions": "SELECT stream, epoch, last_seq FROM unilog_stream_positions ORDER BY stream LIMIT 5",
        "sessions": "SELECT application_name, state, backend_xid::text, backend_xmin::text, "
        "(now() - xact_start)::text FROM pg_stat_activity WHERE application_name LIKE 'unilog-%%'",
        "wal": "SELECT pg_current_wal_insert_lsn()::text, pg_snapshot_xmax(pg_current_snapshot())::text",
    }
    try:
        with connect(database_url, autocommit=True) as conn:
            for name, query in queries.items():
                try:
                    lines.append(f"{name}: {conn.execute(query).fetchall()}")
                except psycopg.Error as exc:
                    lines.append(f"{name}: {type(exc).__name__}: {str(exc).strip()}")
    except Exception as exc:  # a diagnosis never fails the report
        lines.append(f"could not read the database: {exc!r}")
    return lines
