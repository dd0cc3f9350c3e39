"""The staging table: what producers insert, what the streamer fetches, publishes and deletes, and its backlog.

Every fetch reads only rows below the visibility horizon, in (xid, id) order: see :func:`fetch_visible` for why
that order is final and no late commit is skipped.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import pq

from .positions import save_positions

NOTIFY_CHANNEL = "unilog_staged"

# Positional parameters (action, object, data, stream, key, traceparent, tracestate): a tuple skips the driver's
# per-call mapping of names to positions, on the producer's hot path. unilog_stage (migration unilog_0009) writes a
# row of staged_log_records in table mode and a transactional logical message in WAL capture mode, choosing under a
# lock a mode switch takes; it returns the row's id, or NULL for a message.
INSERT_STAGED = "SELECT unilog_stage(%s, %s, %s, %s, %s, %s, %s)"

# Many records in one statement (emit_many): seven text arrays of equal length, the columns of INSERT_STAGED's
# parameters, one element per record. unilog_stage runs once per element in the arrays' order (WITH ORDINALITY and
# the sort on it: the planner evaluates a volatile function in the select list after the sort), so rows get
# ascending ids and messages are written in that order; one row per record comes back, in the same order.
INSERT_STAGED_MANY = """
    SELECT unilog_stage(r.action, r.object, r.data, r.stream, r.key, r.traceparent, r.tracestate)
    FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[])
        WITH ORDINALITY AS r(action, object, data, stream, key, traceparent, tracestate, n)
    ORDER BY r.n
"""


def staged_columns(records: list[tuple[Any, ...]]) -> tuple[list[Any], ...]:
    """INSERT_STAGED_MANY's parameters for ``records`` (each one INSERT_STAGED's parameters): their columns."""
    return tuple(list(column) for column in zip(*records, strict=True))


# A staged row as the streamer reads it: (id, action, object, data, key, created_ms, traceparent, tracestate).
# ``data`` is Postgres's JSON text, passed through to Redis without decoding; plain tuples: the streamer's hot path.
StagedRow = tuple[int, str, str, str, str | None, int, str | None, str | None]


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


# The text of xid is selected under another name: an output column named "xid" would be what ORDER BY xid sorts by
# (output names win over input columns), in text order ('10000' < '9999'), past the index, and out of step with the
# numeric (xid, id) > cursor.
# The next batch of a source: only rows below the visibility horizon, after (xid, id), in (xid, id) order
# (see fetch_visible). Parameters: stream, after xid, after id, limit.
VISIBLE_BATCH = """
    FROM staged_log_records
    WHERE stream = %s AND xid < pg_snapshot_xmin(pg_current_snapshot()) AND (xid, id) > (%s::xid8, %s)
    ORDER BY xid, id
    LIMIT %s
"""

FETCH_BATCH = (
    "SELECT id, action, object, data::text, key, (extract(epoch FROM created_at) * 1000)::bigint, traceparent, "
    "tracestate, xid::text AS xid_text" + VISIBLE_BATCH
)

# The same batch as FETCH_BATCH, returned as ONE row: the count, every record's five publish arguments (data, action,
# object, created ms, key or '') already encoded as RESP bulk strings, and the last (xid, id). Postgres hands over
# the JSON text and does the per-record encoding in C, so the streamer touches no record in Python. The lengths are
# octet_length() of server-encoding text, so this is only used on UTF8 databases (see packed_fetch_supported).
FETCH_PACKED = (
    """
    WITH batch AS MATERIALIZED (
        SELECT xid, id, data::text AS data, action, object, coalesce(key, '') AS key,
               ((extract(epoch FROM created_at) * 1000)::bigint)::text AS created,
               coalesce(traceparent, '') AS tp, coalesce(tracestate, '') AS ts"""
    + VISIBLE_BATCH
    + """), last AS (
        SELECT xid, id FROM batch ORDER BY xid DESC, id DESC LIMIT 1
    ), traced AS (  -- the first ones only: they feed the publish span's links (and say the batch is traced)
        SELECT array_agg(tp) AS parents FROM (SELECT tp FROM batch WHERE tp <> '' ORDER BY xid, id LIMIT 128) t
    )
    SELECT (SELECT count(*) FROM batch),
           convert_to((SELECT string_agg(
               '$' || octet_length(data) || E'\\r\\n' || data || E'\\r\\n$' || octet_length(action) || E'\\r\\n'
               || action || E'\\r\\n$' || octet_length(object) || E'\\r\\n' || object || E'\\r\\n$'
               || octet_length(created) || E'\\r\\n' || created || E'\\r\\n$' || octet_length(key) || E'\\r\\n'
               || key || E'\\r\\n'
               || CASE WHEN (SELECT parents IS NOT NULL FROM traced) THEN
                    '$' || octet_length(tp) || E'\\r\\n' || tp || E'\\r\\n$' || octet_length(ts) || E'\\r\\n' || ts
                    || E'\\r\\n' ELSE '' END, '' ORDER BY xid, id) FROM batch), 'UTF8'),
           (SELECT xid::text FROM last), (SELECT id FROM last), (SELECT parents FROM traced)
"""
)

# Where a fetch starts: the (xid, id) of the last row published, or the very beginning.
START = ("0", 0)


def fetch_visible(
    conn: psycopg.Connection[Any], source: str, limit: int, after: tuple[str, int] = START
) -> tuple[list[StagedRow], tuple[str, int]]:
    """The next ``limit`` staged records of ``source`` below the visibility horizon, in (xid, id) order, and the
    (xid, id) of the last one.

    Only rows written by transactions older than every transaction still running are read, so no transaction
    can later commit a row that sorts before one already returned: the order is final, and a late commit is
    published after, never skipped. For the same reason a publisher holding the stream's lock may pass the last
    (xid, id) it published as ``after``: every row before it is gone, and starting there skips the dead index
    entries a large drained backlog leaves at the front of the index. It also makes the batch exactly the rows
    in the range (``after``, last]: no row can appear in that range later (see :func:`delete_published`).
    """
    rows = conn.execute(FETCH_BATCH, (source, after[0], after[1], limit)).fetchall()
    if not rows:
        return [], after
    last = rows[-1]
    return [row[:8] for row in rows], (last[8], last[0])


def packed_fetch_supported(conn: psycopg.Connection[Any]) -> bool:
    """Whether :func:`fetch_packed` can be used: its byte lengths are right only in a UTF8 database."""
    return conn.info.parameter_status("server_encoding") == "UTF8"


def fetch_packed(
    conn: psycopg.Connection[Any], source: str, limit: int, after: tuple[str, int] = START
) -> tuple[int, bytes, tuple[str, int], list[str]]:
    """The batch :func:`fetch_visible` would return, as (count, RESP-encoded publish arguments, last (xid, id),
    the first 128 of the records' traceparents).

    Same rows, same order, same guarantees; count 0 means nothing visible (and ``after`` is returned as last). When
    any record has a traceparent, each record has seven arguments (its traceparent and tracestate, maybe empty, after
    the five), else five: see :class:`unilog.wire.Packed`.
    """
    row = conn.execute(FETCH_PACKED, (source, after[0], after[1], limit), binary=True).fetchone()
    if row is None or not row[0]:
        return 0, b"", after, []
    count, body, last_xid, last_id, parents = row
    return int(count), bytes(body), (str(last_xid), int(last_id)), list(parents or [])


def has_staged(conn: psycopg.Connection[Any], source: str) -> bool:
    """Whether committed rows of ``source`` exist at all (visible or still behind the horizon)."""
    row = conn.execute("SELECT EXISTS (SELECT 1 FROM staged_log_records WHERE stream = %s)", (source,)).fetchone()
    return bool(row and row[0])


def delete_published(
    conn: psycopg.Connection[Any],
    source: str,
    after: tuple[str, int],
    last: tuple[str, int],
    count: int,
    epoch: int,
    last_seqs: dict[str, int],
) -> int:
    """Delete the published batch, the ``count`` rows of ``source`` in the (xid, id) range (``after``, ``last``],
    and advance each target stream's position, in the caller's transaction.

    The range holds exactly the rows that were fetched: they were all below the visibility horizon, so every
    transaction that could write a row into the range had ended before the fetch. Returns the number of rows
    deleted; the caller must check it equals the batch's size (fewer means another session deleted some).
    """
    # The LIMIT stops the index scan at the batch's end: a row comparison bounds the start of a btree scan but not
    # its end, and a large transaction's rows all share one xid (measured: 20 ms instead of 1 ms per 1000 rows).
    cur = conn.execute(
        """
        DELETE FROM staged_log_records WHERE ctid = ANY(ARRAY(
            SELECT ctid FROM staged_log_records
            WHERE stream = %s AND (xid, id) > (%s::xid8, %s) AND (xid, id) <= (%s::xid8, %s)
            ORDER BY xid, id LIMIT %s))
        """,
        (source, after[0], after[1], last[0], last[1], count),
    )
    save_positions(conn, epoch, last_seqs)
    return cur.rowcount


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


def horizon_holder(conn: psycopg.Connection[Any]) -> dict[str, Any] | None:
    """The oldest transaction in the cluster that holds an xid, which holds back publication of every record
    committed after it began (any database: transaction ids are cluster-wide). None if there is none."""
    row = conn.execute(
        r"""
        SELECT pid, datname, application_name, state, extract(epoch FROM now() - xact_start)::float8,
               left(regexp_replace(query, '\s+', ' ', 'g'), 80)
        FROM pg_stat_activity
        WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()
        ORDER BY xact_start
        LIMIT 1
        """
    ).fetchone()
    if row is None:
        return None
    keys = ("pid", "database", "application_name", "state", "age_seconds", "query")
    return dict(zip(keys, row, strict=True))


def held_back(conn: psycopg.Connection[Any], sources: list[str]) -> int:
    """How many committed records of ``sources`` are not yet publishable: at or above the visibility horizon."""
    row = conn.execute(
        "SELECT count(*) FROM staged_log_records "
        "WHERE stream = ANY(%s) AND xid >= pg_snapshot_xmin(pg_current_snapshot())",
        (sources,),
    ).fetchone()
    return int(row[0]) if row else 0


def describe_holder(holder: dict[str, Any] | None) -> str:
    """One line naming the session that holds the horizon (for logs and errors)."""
    if holder is None:
        return "no open transaction holds it any more"
    return (
        f"pid {holder['pid']} (application {holder['application_name'] or '-'!r}, {holder['state']}, "
        f"open {holder['age_seconds']:.0f}s, database {holder['database']}): {holder['query']!r}"
    )


def listen(conn: psycopg.Connection[Any]) -> None:
    """Subscribe ``conn`` (autocommit) to the staging trigger's NOTIFY, sent when a transaction that staged commits
    while a streamer sleeps (see :func:`try_sleep`)."""
    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")


def discard_notifies(conn: psycopg.Connection[Any]) -> int:
    """Drop every notification ``conn`` has received, and what its socket holds, without waiting; return how many.
    psycopg keeps each notification that arrives while ``conn`` runs a statement until it is read: a ``LISTEN``
    session that only needs to know *that* something arrived must read them, or keep one object per NOTIFY."""
    return sum(1 for _ in conn.notifies(timeout=0))


def try_sleep(conn: psycopg.Connection[Any], wait: float = 0.0) -> bool:
    """Take the wake-up lock exclusively on ``conn`` (an autocommit ``LISTEN`` session): from then on every
    transaction that stages notifies at commit. A transaction that staged without notifying holds the lock shared
    until it ends: wait up to ``wait`` seconds for those to end (meanwhile the waiting request makes new ones
    notify). False if they did not, or another streamer sleeps: the caller must look again rather than sleep."""
    if wait <= 0:
        row = conn.execute("SELECT pg_try_advisory_lock(hashtextextended('unilog.wakeup', 0))").fetchone()
        return bool(row and row[0])
    # one round trip: the timeout is set for the lock's wait and reset after it in the same statement; if the wait
    # times out, the failed statement's transaction takes the setting back with it
    try:
        conn.execute(
            "SELECT set_config('lock_timeout', %s, false), pg_advisory_lock(hashtextextended('unilog.wakeup', 0)), "
            "set_config('lock_timeout', '0', false)",
            (str(max(1, round(wait * 1000))),),
        )
        return True
    except psycopg.errors.LockNotAvailable:
        return False


def wake_soon(conn: psycopg.Connection[Any]) -> None:
    """:func:`wake`, sent without waiting for the reply: the server gives the lock back while the caller goes on
    (a streamer woken by a commit looks for it on its other connection at once). The caller must read the reply
    with :func:`wake_done` before ``conn`` runs anything else."""
    conn.pgconn.send_query(b"SELECT pg_advisory_unlock(hashtextextended('unilog.wakeup', 0))")
    conn.pgconn.flush()


def wake_done(conn: psycopg.Connection[Any]) -> None:
    """Read the reply of the :func:`wake_soon` sent on ``conn``."""
    while (result := conn.pgconn.get_result()) is not None:
        if result.status == pq.ExecStatus.FATAL_ERROR:
            raise psycopg.OperationalError(result.error_message.decode(errors="replace").strip())


def wake(conn: psycopg.Connection[Any]) -> None:
    """Give the wake-up lock back: producers stop notifying (this streamer is busy, it will look anyway)."""
    conn.execute("SELECT pg_advisory_unlock(hashtextextended('unilog.wakeup', 0))")
