"""The staging table: what producers insert, its sources and backlog, the open transactions that staged, and the
streamer's wake-up. What the streamer claims, sends and deletes is in :mod:`unilog.store.claims`."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import pq

from .connection import next_result

NOTIFY_CHANNEL = "unilog_staged"

# Positional parameters (action, object, data, stream, key, traceparent, tracestate, record type): a tuple skips
# the driver's per-call mapping of names to positions, on the producer's hot path. unilog_stage (migrations
# unilog_0009, 0010, 0013) writes a row of staged_log_records in table mode and a transactional logical message in
# WAL capture mode, choosing under a lock a mode switch takes; it returns the row's id, or NULL for a message.
INSERT_STAGED = "SELECT unilog_stage(%s, %s, %s, %s, %s, %s, %s, %s)"

# Many records in one statement (emit_many): eight text arrays of equal length, the columns of INSERT_STAGED's
# parameters, one element per record. unilog_stage runs once per element in the arrays' order (WITH ORDINALITY and
# the sort on it: the planner evaluates a volatile function in the select list after the sort), so rows get
# ascending ids and messages are written in that order; one row per record comes back, in the same order.
INSERT_STAGED_MANY = """
    SELECT unilog_stage(r.action, r.object, r.data, r.stream, r.key, r.traceparent, r.tracestate, r.type)
    FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[])
        WITH ORDINALITY AS r(action, object, data, stream, key, traceparent, tracestate, type, n)
    ORDER BY r.n
"""


def staged_columns(records: list[tuple[Any, ...]]) -> tuple[list[Any], ...]:
    """INSERT_STAGED_MANY's parameters for ``records`` (each one INSERT_STAGED's parameters): their columns."""
    return tuple(list(column) for column in zip(*records, strict=True))


# Finding the sources: a loose index scan (one probe a source) is what a big backlog of few streams needs (reading the
# table would read every row, each pass); over many sources of few rows each, a probe a source costs more than reading
# the rows once (10,000 sources of 5 rows: 65-110 ms against 20). So the loose scan stops at SKIP_UP_TO sources; past
# them, a table of at most SCAN_BYTES is read once (its sources hashed), a bigger one scanned on, loosely.
SKIP_UP_TO = 1000
SCAN_BYTES = 64 << 20

_SKIP = """
    WITH RECURSIVE s AS (
        (SELECT stream, 1 AS k FROM staged_log_records {after} ORDER BY stream LIMIT 1)
        UNION ALL
        SELECT (SELECT r.stream FROM staged_log_records r WHERE r.stream > s.stream ORDER BY r.stream LIMIT 1), s.k + 1
        FROM s WHERE s.stream IS NOT NULL AND s.k < %(up_to)s
    )
    SELECT stream FROM s WHERE stream IS NOT NULL
"""
_SKIP_FIRST = _SKIP.format(after="")
_SKIP_AFTER = _SKIP.format(after="WHERE stream > %(after)s")


def staged_sources(conn: psycopg.Connection[Any]) -> list[str]:
    """Distinct values of ``staged_log_records.stream`` (in no particular order): by a loose index scan, or by one
    read of a small table holding many of them (see :data:`SKIP_UP_TO`)."""
    found = [r[0] for r in conn.execute(_SKIP_FIRST, {"up_to": SKIP_UP_TO}).fetchall()]
    if len(found) < SKIP_UP_TO:
        return found
    size = conn.execute("SELECT pg_relation_size('staged_log_records'::regclass)").fetchone()
    if size is not None and size[0] <= SCAN_BYTES:
        return [r[0] for r in conn.execute("SELECT stream FROM staged_log_records GROUP BY stream").fetchall()]
    while True:
        more = [r[0] for r in conn.execute(_SKIP_AFTER, {"after": found[-1], "up_to": SKIP_UP_TO}).fetchall()]
        found += more
        if len(more) < SKIP_UP_TO:
            return found


def has_staged(conn: psycopg.Connection[Any], source: str) -> bool:
    """Whether committed rows of ``source`` exist at all (claimed or not)."""
    row = conn.execute("SELECT EXISTS (SELECT 1 FROM staged_log_records WHERE stream = %s)", (source,)).fetchone()
    return bool(row and row[0])


def staged_backlog(conn: psycopg.Connection[Any]) -> tuple[int, float | None]:
    """(number of committed staged records, age in seconds of the oldest one or None)."""
    row = conn.execute(
        "SELECT count(*), extract(epoch FROM now() - min(created_at))::float8 FROM staged_log_records"
    ).fetchone()
    assert row is not None
    return int(row[0]), row[1]


def staged_by_stream(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, float | None]]:
    """Per ``stream`` column value ('' = the default stream): (committed staged records, oldest age in seconds)."""
    rows = conn.execute(
        """
        SELECT stream, count(*), extract(epoch FROM now() - min(created_at))::float8
        FROM staged_log_records GROUP BY stream
        """
    ).fetchall()
    return {r[0]: (int(r[1]), r[2]) for r in rows}


def oldest_stager(conn: psycopg.Connection[Any]) -> dict[str, Any] | None:
    """The oldest open transaction of this database, other than the caller's, that has staged rows (it holds its
    lock on ``staged_log_records`` until it ends): only its own records wait for it. None if there is none. unilog's
    own sessions (``application_name`` ``unilog-...``: a streamer deleting what it published) are not producers."""
    row = conn.execute(
        r"""
        SELECT a.pid, a.datname, a.application_name, a.state, extract(epoch FROM now() - a.xact_start)::float8,
               left(regexp_replace(a.query, '\s+', ' ', 'g'), 80)
        FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'relation' AND l.relation = 'staged_log_records'::regclass AND l.mode = 'RowExclusiveLock'
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND a.backend_xid IS NOT NULL AND a.pid <> pg_backend_pid()
          AND a.application_name NOT LIKE 'unilog-%'
        ORDER BY a.xact_start
        LIMIT 1
        """
    ).fetchone()
    if row is None:
        return None
    keys = ("pid", "database", "application_name", "state", "age_seconds", "query")
    return dict(zip(keys, row, strict=True))


def describe_holder(holder: dict[str, Any] | None) -> str:
    """One line naming an open transaction (for logs and errors)."""
    if holder is None:
        return "none is open any more"
    return (
        f"pid {holder['pid']} (application {holder['application_name'] or '-'!r}, {holder['state']}, "
        f"open {holder['age_seconds']:.0f}s, database {holder['database']}): {holder['query']!r}"
    )


def listen(conn: psycopg.Connection[Any]) -> None:
    """Subscribe ``conn`` (autocommit) to the staging trigger's NOTIFY, sent when a transaction that staged commits
    while a streamer sleeps (see :func:`try_sleep`)."""
    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")


def unlisten(conn: psycopg.Connection[Any]) -> None:
    """End ``conn``'s subscriptions; once this returns, the server sends it no notification (what came before is
    dropped), so it can be closed without the server writing to a closed socket."""
    conn.execute("UNLISTEN *")
    discard_notifies(conn)


def discard_notifies(conn: psycopg.Connection[Any]) -> int:
    """Drop every notification ``conn`` has received, and what its socket holds, without waiting; return how many.
    psycopg keeps each notification that arrives while ``conn`` runs a statement until it is read: a ``LISTEN``
    session that only needs to know *that* something arrived must read them, or keep one object per NOTIFY."""
    return sum(1 for _ in conn.notifies(timeout=0))


def try_sleep(conn: psycopg.Connection[Any]) -> bool:
    """Try to take the wake-up lock exclusively on ``conn`` (an autocommit ``LISTEN`` session), without waiting:
    from then on every transaction that stages notifies at commit. False if a transaction that staged without
    notifying still holds the lock shared (its commit will send no NOTIFY: the caller must look again soon), or
    another streamer sleeps on it (:func:`another_sleeps`). Never a lock wait: a ``lock_timeout`` leaves an ERROR
    line in the server's log per try, which a standby retrying on an idle system wrote 10 times a second."""
    row = conn.execute("SELECT pg_try_advisory_lock(hashtextextended('unilog.wakeup', 0))").fetchone()
    return bool(row and row[0])


def another_sleeps(conn: psycopg.Connection[Any]) -> bool:
    """Whether another session holds the wake-up lock exclusively: a streamer sleeps on it, so every transaction
    that stages notifies at commit, and a ``LISTEN`` session hears each commit as that streamer does."""
    row = conn.execute(
        """
        SELECT EXISTS (
            SELECT 1 FROM pg_locks l, (SELECT hashtextextended('unilog.wakeup', 0) AS key) k
            WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.mode = 'ExclusiveLock'
              AND l.pid <> pg_backend_pid()
              AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
              AND l.classid::text::bigint = (k.key >> 32) & 4294967295 AND l.objid::text::bigint = k.key & 4294967295)
        """
    ).fetchone()
    return bool(row and row[0])


# Giving the wake-up lock back also notifies: another streamer may sleep on LISTEN without the lock (it found this
# one asleep, see another_sleeps), hearing producers only while this one sleeps; told that it stopped, it looks and
# takes the lock in turn, so a commit on its streams never waits for its poll.
_WAKE = "SELECT pg_advisory_unlock(hashtextextended('unilog.wakeup', 0)), pg_notify('unilog_staged', 'awake')"


def wake_soon(conn: psycopg.Connection[Any]) -> None:
    """:func:`wake`, sent without waiting for the reply: the server gives the lock back while the caller goes on
    (a streamer woken by a commit looks for it on its other connection at once). The caller must read the reply
    with :func:`wake_done` before ``conn`` runs anything else."""
    conn.pgconn.send_query(_WAKE.encode())
    conn.pgconn.flush()


def wake_done(conn: psycopg.Connection[Any]) -> None:
    """Read the reply of the :func:`wake_soon` sent on ``conn``."""
    while (result := next_result(conn.pgconn)) is not None:
        if result.status == pq.ExecStatus.FATAL_ERROR:
            raise psycopg.OperationalError(result.error_message.decode(errors="replace").strip())


def wake(conn: psycopg.Connection[Any]) -> None:
    """Give the wake-up lock back: producers stop notifying (this streamer is busy, it will look anyway)."""
    conn.execute(_WAKE)
