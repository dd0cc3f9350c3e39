"""Table mode's claims: a streamer takes the committed staged rows it has not published yet, in id order, and saves
the batch (a *claim*, in ``unilog_claims``) before it sends it; the claim is deleted with its rows, in the
transaction that advances the stream's positions, once Redis confirmed it.

Why id order is commit order for records that conflict on a row: a producer takes a row's lock (``UPDATE``,
``SELECT ... FOR UPDATE``) and holds it until its transaction ends; a second producer that wants the row waits for
that end, so everything it does after the lock, its emit included, follows the first one's commit. A record's id
comes from a sequence (cache 1: migration ``unilog_0011``) at emit, so the second record's id is the higher one. A
claim is read from one snapshot: a snapshot that sees the second record's commit also sees the first one's, which
ended before it, so the first record is either in an earlier claim or in the same claim, before it (a claim is
ordered by id). Positions are assigned in claim order, then id order, so the stream has the two records in the
order their transactions committed. (Records emitted *before* the lock is taken are not ordered by it: emit after
the write that locks the row.)

Why nothing committed is skipped and nothing waits for another transaction: a claim takes every committed row with
an id above the streamer's cursor (the highest id it claimed), up to the batch size, and the rows at or below the
cursor that were not visible at an earlier claim: those can only belong to transactions that snapshot saw in
progress (``xip``) or that started after it (``xid >= xmax``), which the streamer keeps (:class:`Cursor`) and looks
up by the (stream, xid, id) index. No claim waits for an open transaction: a row is claimed as soon as its own
transaction committed.

Why a re-send is deterministic: the claim is committed before the send. A claim still in the table after a crash is
re-read by its runs of ids (the same rows: none can enter a run, which is a range of consecutive ids all claimed)
and re-sent, claims in the order they were made, positions following the last committed ones: the same records get
the same positions, and Redis drops what it already has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from .positions import save_positions

# A staged row as the streamer reads it for a partitioned stream: (id, action, object, data, key, created_ms,
# traceparent, tracestate, record type). ``data`` is Postgres's JSON text, passed through to Redis without decoding.
StagedRow = tuple[int, str, str, str, str | None, int, str | None, str | None, str | None]

_COLUMNS = """id, data::text AS data, action, object, key,
               ((extract(epoch FROM created_at) * 1000)::bigint) AS created_ms,
               traceparent AS tp, tracestate AS ts, record_type AS ty"""

# The rows a new claim may take: (a) of transactions open at the last claim, (b) of transactions begun after it,
# both at or below the cursor, and (c) above the cursor; each by its index, the three disjoint. ``before`` bounds the
# xid (WAL mode's table passes publish only the rows that may predate the slot), NULL for none.
_CANDIDATES = f"""
    (SELECT {_COLUMNS} FROM staged_log_records
     WHERE stream = %(source)s AND xid = ANY(%(watch)s::xid8[]) AND xid < %(since)s::xid8 AND id <= %(cursor)s
       AND (%(before)s::xid8 IS NULL OR xid < %(before)s::xid8)
     ORDER BY id LIMIT %(limit)s)
    UNION ALL
    (SELECT {_COLUMNS} FROM staged_log_records
     WHERE stream = %(source)s AND xid >= %(since)s::xid8 AND id <= %(cursor)s
       AND (%(before)s::xid8 IS NULL OR xid < %(before)s::xid8)
     ORDER BY id LIMIT %(limit)s)
    UNION ALL
    (SELECT {_COLUMNS} FROM staged_log_records
     WHERE stream = %(source)s AND id > %(cursor)s AND (%(before)s::xid8 IS NULL OR xid < %(before)s::xid8)
     ORDER BY id LIMIT %(limit)s)
"""

# A new claim: the batch (the lowest ids of the candidates), its runs of consecutive ids saved in unilog_claims,
# and the snapshot it was read from (in progress, xmax), for the next claim's candidates (a) and (b).
_CLAIM = f"""
    WITH candidates AS MATERIALIZED ({_CANDIDATES}),
    batch AS MATERIALIZED (SELECT * FROM candidates ORDER BY id LIMIT %(limit)s),
    runs AS (
        SELECT min(id) AS lo, max(id) AS hi FROM (SELECT id, id - row_number() OVER (ORDER BY id) AS g FROM batch) t
        GROUP BY g
    ),
    claimed AS (
        INSERT INTO unilog_claims (source, lo, hi, records)
        SELECT %(source)s, array_agg(lo ORDER BY lo), array_agg(hi ORDER BY lo), sum(hi - lo + 1) FROM runs
        HAVING count(*) > 0
        RETURNING claim, records
    ),
    snap AS (SELECT pg_current_snapshot() AS s)
"""

# A claim's ids, from its runs of consecutive ids (each id in a run was claimed, so there are at most `records`), as
# one array per source: the rows are then found by the primary key (`id = ANY`). A range join on the runs instead
# (`id BETWEEN lo AND hi`) is planned from unnest's guess of 10 runs; with streams staged interleaved a claim is
# thousands of one-id runs, and Postgres compared every row of the stream with every run: 10 s a 5,000-row claim at 4
# streams (bench drain_streams, issue 37's review), 0.02 s by the key.
_IDS = """
    ids AS MATERIALIZED (
        SELECT c.source, array_agg(g ORDER BY g) AS a FROM {claims} c
        CROSS JOIN LATERAL unnest(c.lo, c.hi) AS r(lo, hi) CROSS JOIN LATERAL generate_series(r.lo, r.hi) AS g
        GROUP BY c.source
    )"""

# A saved claim's rows again, by its ids (a claim not yet deleted: re-sent after a crash).
_AGAIN = f"""
    WITH claimed AS (SELECT claim, source, lo, hi, records FROM unilog_claims WHERE claim = %(claim)s),
    {_IDS.format(claims="claimed").strip()},
    batch AS MATERIALIZED (
        SELECT {_COLUMNS.replace("id,", "s.id,", 1)} FROM ids
        JOIN staged_log_records s ON s.stream = ids.source AND s.id = ANY(ids.a)
    ),
    snap AS (SELECT NULL::pg_snapshot AS s)
"""

# What either returns as ONE row: the count, every record's publish arguments already encoded as RESP bulk strings,
# in id order, the last id, the first 128 traceparents, the claim, the snapshot's in-progress xids and xmax, the
# records the claim was saved with, and the arguments per record (the stride). Each record has five arguments (data,
# action, object, created ms, key or ''); seven when any record of the batch has a traceparent (then traceparent and
# tracestate, maybe empty); eight when any is typed (then also its type, maybe empty). Postgres does the per-record
# encoding in C, so the streamer touches no record in Python. The lengths are octet_length() of server-encoding
# text: UTF8 databases only.
# A staged row's publish arguments as the RESP bulk strings publish.lua reads (5, 7 or 8 per the batch's stride),
# built in SQL so the streamer sends them unpacked: shared by the claim of one source and the claim across many.
RESP_FIELDS = """\
               '$' || octet_length(data) || E'\\r\\n' || data || E'\\r\\n$' || octet_length(action) || E'\\r\\n'
               || action || E'\\r\\n$' || octet_length(object) || E'\\r\\n' || object || E'\\r\\n$'
               || octet_length(created) || E'\\r\\n' || created || E'\\r\\n$' || octet_length(key) || E'\\r\\n'
               || key || E'\\r\\n'
               || CASE WHEN shape.stride >= 7 THEN
                    '$' || octet_length(tp) || E'\\r\\n' || tp || E'\\r\\n$' || octet_length(ts) || E'\\r\\n' || ts
                    || E'\\r\\n' ELSE '' END
               || CASE WHEN shape.stride = 8 THEN '$' || octet_length(ty) || E'\\r\\n' || ty || E'\\r\\n' ELSE '' END,
"""

_PACKED = f"""
    , packed AS (
        SELECT data, action, object, created_ms::text AS created, coalesce(key, '') AS key,
               coalesce(tp, '') AS tp, coalesce(ts, '') AS ts, coalesce(ty, '') AS ty, id FROM batch
    ), traced AS (  -- the first ones only: they feed the publish span's links (and say the batch is traced)
        SELECT array_agg(tp) AS parents FROM (SELECT tp FROM packed WHERE tp <> '' ORDER BY id LIMIT 128) t
    ), shape AS (
        SELECT CASE WHEN EXISTS (SELECT 1 FROM packed WHERE ty <> '') THEN 8
                    WHEN (SELECT parents IS NOT NULL FROM traced) THEN 7 ELSE 5 END AS stride
    )
    SELECT (SELECT count(*) FROM batch),
           convert_to((SELECT string_agg(
{RESP_FIELDS}               '' ORDER BY id) FROM packed, shape), 'UTF8'),
           (SELECT max(id) FROM batch), (SELECT parents FROM traced), (SELECT claim FROM claimed),
           (SELECT array_agg(x::text) FROM snap, pg_snapshot_xip(snap.s) x),
           (SELECT pg_snapshot_xmax(s)::text FROM snap), (SELECT records FROM claimed), (SELECT stride FROM shape)
"""

# The same as rows (a partitioned stream's batch is split by key in Python), each row carrying the claim and snapshot.
_ROWS = """
    SELECT id, action, object, data, key, created_ms, tp, ts, ty,
           (SELECT claim FROM claimed), (SELECT array_agg(x::text) FROM snap, pg_snapshot_xip(snap.s) x),
           (SELECT pg_snapshot_xmax(s)::text FROM snap), (SELECT records FROM claimed)
    FROM batch ORDER BY id
"""

CLAIM_PACKED = _CLAIM + _PACKED
CLAIM_ROWS = _CLAIM + _ROWS
AGAIN_PACKED = _AGAIN + _PACKED
AGAIN_ROWS = _AGAIN + _ROWS


@dataclass
class Cursor:
    """Where a streamer's next claim of one source starts: every row with an id at or below ``last`` was claimed, or
    belongs to a transaction in ``watch`` (in progress at the last claim) or with an xid at or above ``since``
    (begun after it), or was rolled back. Valid while the streamer holds the source's stream lock; a new one reads
    the source from its first staged row."""

    last: int = -(2**63)  # below every id: an adopted table's ids may be zero or negative
    watch: tuple[str, ...] = ()
    since: str = "0"
    cut: bool = False  # the last claim was cut among rows at or below ``last``: they match again until deleted

    def params(self, source: str, limit: int, before: str | None) -> dict[str, Any]:
        return {
            "source": source,
            "limit": limit,
            "cursor": self.last,
            "watch": list(self.watch),
            "since": self.since,
            "before": before,
        }

    def advance(self, last: int | None, count: int, limit: int, xip: list[str] | None, xmax: str | None) -> None:
        """After a claim of ``count`` rows (up to id ``last``) read from a snapshot with in-progress ``xip`` and
        ``xmax``. When the batch was cut among rows at or below the cursor (a large transaction that was open at the
        last claim), those not taken are still found only by the old ``watch`` and ``since``: both are kept (and the
        snapshot's in-progress ones added). Otherwise every candidate at or below the new cursor was claimed, and
        what may still appear there belongs to the snapshot's in-progress transactions or later ones.

        After a cut, the claimed rows still match ``watch`` and ``since`` until their delete commits: ``cut`` is set,
        and the next claim must wait for that delete (claims are not pipelined meanwhile)."""
        if xmax is None:
            return
        in_progress = tuple(xip or ())
        self.cut = count >= limit and (last is None or last <= self.last)
        if self.cut:
            self.watch = tuple(sorted(set(self.watch) | set(in_progress)))
            return
        self.watch, self.since = in_progress, xmax
        if last is not None and last > self.last:
            self.last = last


@dataclass(frozen=True)
class Claim:
    """A claimed batch as Postgres returns it: packed (``body`` set) or as rows (``rows`` set)."""

    claim: int
    count: int
    last: int
    body: bytes = b""
    parents: tuple[str, ...] = ()
    rows: list[StagedRow] = field(default_factory=list)
    xip: list[str] | None = None
    xmax: str | None = None
    saved: int = 0  # the records the claim was saved with
    stride: int = 5  # a packed body's arguments per record (see _PACKED)


def packed_fetch_supported(conn: psycopg.Connection[Any]) -> bool:
    """Whether packed claims can be used: their byte lengths are right only in a UTF8 database."""
    return conn.info.parameter_status("server_encoding") == "UTF8"


def claim_packed(
    conn: psycopg.Connection[Any], source: str, limit: int, cursor: Cursor, before: str | None = None
) -> Claim | None:
    """Claim the next batch of ``source`` after ``cursor`` (see the module's docstring) and return it encoded for
    Redis, or None when nothing committed is left to claim. The claim is saved in the caller's transaction: it must
    commit before the batch is sent. When any record has a traceparent, each record has seven arguments (its
    traceparent and tracestate, maybe empty, after the five), eight when any is typed (its type last), else five:
    see :class:`unilog.wire.Packed`."""
    row = conn.execute(CLAIM_PACKED, cursor.params(source, limit, before), binary=True).fetchone()
    return _packed(row)


def claim_rows(
    conn: psycopg.Connection[Any], source: str, limit: int, cursor: Cursor, before: str | None = None
) -> Claim | None:
    """:func:`claim_packed`, returning the batch as rows (for a stream split into partitions by key)."""
    rows = conn.execute(CLAIM_ROWS, cursor.params(source, limit, before)).fetchall()
    return _rows(rows)


def reclaim_packed(conn: psycopg.Connection[Any], claim: int) -> Claim | None:
    """A saved claim's batch, the same records in the same order as when it was made, encoded for Redis."""
    row = conn.execute(AGAIN_PACKED, {"claim": claim}, binary=True).fetchone()
    result = _packed(row)
    return (
        None
        if result is None
        else Claim(
            claim, result.count, result.last, result.body, result.parents, saved=result.saved, stride=result.stride
        )
    )


def reclaim_rows(conn: psycopg.Connection[Any], claim: int) -> Claim | None:
    """:func:`reclaim_packed`, as rows."""
    result = _rows(conn.execute(AGAIN_ROWS, {"claim": claim}).fetchall())
    return None if result is None else Claim(claim, result.count, result.last, rows=result.rows, saved=result.saved)


def _packed(row: Any) -> Claim | None:
    if row is None or not row[0]:
        return None
    count, body, last, parents, claim, xip, xmax, saved, stride = row
    parents = tuple(parents or ())
    return Claim(
        int(claim or 0),
        int(count),
        int(last),
        bytes(body),
        parents,
        xip=list(xip or []),
        xmax=xmax,
        saved=saved,
        stride=int(stride),
    )


def _rows(rows: list[Any]) -> Claim | None:
    if not rows:
        return None
    first = rows[0]
    staged: list[StagedRow] = [row[:9] for row in rows]
    return Claim(
        int(first[9] or 0),
        len(rows),
        int(rows[-1][0]),
        rows=staged,
        xip=list(first[10] or []),
        xmax=first[11],
        saved=int(first[12] or 0),
    )


def pending_claims(conn: psycopg.Connection[Any], source: str) -> list[int]:
    """The claims of ``source`` saved and not yet deleted (their batches may be in Redis), oldest first."""
    rows = conn.execute("SELECT claim FROM unilog_claims WHERE source = %s ORDER BY claim", (source,)).fetchall()
    return [int(r[0]) for r in rows]


def any_pending_claims(conn: psycopg.Connection[Any]) -> list[str]:
    """The sources with a claim saved and not yet deleted."""
    rows = conn.execute("SELECT DISTINCT source FROM unilog_claims ORDER BY source").fetchall()
    return [r[0] for r in rows]


def drop_claim(conn: psycopg.Connection[Any], claim: int) -> None:
    """Delete a claim whose rows are all gone (published and deleted by another streamer), in the caller's
    transaction."""
    conn.execute("DELETE FROM unilog_claims WHERE claim = %s", (claim,))


_DELETE_CLAIMED = f"""
    WITH c AS (DELETE FROM unilog_claims WHERE claim = %s RETURNING source, lo, hi),
    {_IDS.format(claims="c").strip()},
    d AS (DELETE FROM staged_log_records s USING ids WHERE s.stream = ids.source AND s.id = ANY(ids.a) RETURNING 1)
    SELECT count(*) FROM d
"""


def delete_claimed(
    conn: psycopg.Connection[Any],
    claim: int,
    epoch: int,
    last_seqs: dict[str, int],
    *,
    lock_wait: float | None = None,
) -> int | None:
    """Delete a published claim and its rows, and advance each target stream's position, in the caller's
    transaction. Returns the number of rows deleted; the caller must check it equals the claim's count (fewer means
    another session deleted some). With ``lock_wait``, a row another session holds locked is waited for that many
    seconds at most: then None is returned, the caller's transaction rolled back (the claim stays saved)."""
    if lock_wait:  # at least 1 ms: a lock_timeout of 0 would wait for ever
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{max(1, int(lock_wait * 1000))}ms",))
    try:
        row = conn.execute(_DELETE_CLAIMED, (claim,)).fetchone()
        save_positions(conn, epoch, last_seqs)
    except psycopg.errors.LockNotAvailable:
        if not lock_wait:
            raise
        conn.rollback()
        return None
    return int(row[0]) if row else 0
