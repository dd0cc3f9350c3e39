"""Table mode's claims across streams: one statement claims the oldest committed staged rows of many sources (the
``stream`` column's values) at once, saving one claim per source; one statement re-reads saved claims; one deletes
every claim of a batch Redis confirmed, with its rows, and advances the positions.

The arguments of :mod:`unilog.store.claims` hold per source, claim by claim: a claim is taken from one snapshot, in id
order, and saved (one ``unilog_claims`` row per source, with its runs of consecutive ids) before anything of it is
sent. What differs is the candidates: not the rows after a cursor, but every committed row of the sources that is
not in a saved claim (the caller re-sends and deletes those before it claims anew, and deletes each batch before the
next claim over any of its sources: a claim over other sources may be taken while a batch is in flight), the lowest ids
first. So a record whose transaction committed after another's on the same row, and
which this claim takes, has the other one either published and deleted already or in this claim before it: per
source, commit order per key holds. No claim waits for an open transaction: its rows are taken by a later claim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from .claims import _COLUMNS, RESP_FIELDS

# The rows of a new claim: the lowest ids of the sources' committed rows (``before``: WAL mode's table passes publish
# only the rows that may predate the slot), as many as fit in ``budget`` bytes of data (the first always: a batch's
# body is one value, which Postgres caps at 1 GB), at most ``per_source`` of each source: its lowest, so still a
# prefix of its rows in id order (a source's part is sent in one script call, which this bounds). Scanned in id order
# by the primary key, the sources hashed. ``cut``: the budget leaves rows of the scan out (the bytes before the last
# row reach it); only then is the running sum that finds the last row taken computed (a window over the whole scan
# cost a tenth of the claim). A claim's runs of consecutive ids are found in the same window that numbers a source's
# rows (a run starts where the id before is not one less, ends where the next is not one more, or at the source's
# last row taken).
_SCANNED = f"""
    WITH looked AS MATERIALIZED (
        SELECT {_COLUMNS}, stream AS source FROM staged_log_records
        WHERE (stream = ANY(string_to_array(%(names)s, ' ')) OR (%(blank)s AND stream = ''))
          AND (%(before)s::xid8 IS NULL OR xid < %(before)s::xid8)
        ORDER BY id LIMIT %(limit)s
    ),"""

# Over few sources (``per_source`` of each fit in ``limit``), each source's lowest rows are read by its own index range
# instead, ``per_source`` at most, and the lowest ``limit`` ids of those taken: the same prefix of each source's rows in
# id order, with no row of the table read beyond them. The scan in id order read every row below the last it took:
# over two streams of 25,000 records, 5,000 of each a batch, each claim read what was left of the table; and a source
# with many rows at the lowest ids filled the scan's ``limit``, holding the others' rows above them back.
_PER_SOURCE = f"""
    WITH looked AS MATERIALIZED (
        SELECT l.* FROM unnest(string_to_array(%(names)s, ' ')
                               || CASE WHEN %(blank)s THEN ARRAY[''] ELSE ARRAY[]::text[] END) AS n(name)
        CROSS JOIN LATERAL (
            SELECT {_COLUMNS}, stream AS source FROM staged_log_records
            WHERE stream = n.name AND (%(before)s::xid8 IS NULL OR xid < %(before)s::xid8)
            ORDER BY id LIMIT %(per_source)s
        ) l
        ORDER BY l.id LIMIT %(limit)s
    ),"""

_NEW = """
    cut AS (
        SELECT sum(octet_length(data)) - (SELECT octet_length(data) FROM looked ORDER BY id DESC LIMIT 1)
               >= %(budget)s AS c
        FROM looked
    ),
    batch AS MATERIALIZED (
        SELECT t.source, t.source AS part, t.id, t.data, t.action, t.object, t.key, t.created_ms, t.tp, t.ts, t.ty,
               t.starts, t.ends OR t.rn = %(per_source)s AS ends
        FROM (
            SELECT s.*, row_number() OVER w AS rn,
                   coalesce(s.id - lag(s.id) OVER w <> 1, true) AS starts,
                   coalesce(lead(s.id) OVER w - s.id <> 1, true) AS ends
            FROM looked s
            WHERE NOT (SELECT c FROM cut) OR s.id <= (
                SELECT max(id) FROM (
                    SELECT id, sum(octet_length(data)) OVER (ORDER BY id ROWS UNBOUNDED PRECEDING)
                               - octet_length(data) AS before
                    FROM looked
                ) u WHERE before < %(budget)s
            )
            WINDOW w AS (PARTITION BY source ORDER BY id)
        ) t WHERE rn <= %(per_source)s
    )"""

# A new claim's parts saved, one claim per source, from the sources' aggregates (``per``, below).
_SAVED = """,
    claimed AS (
        INSERT INTO unilog_claims (source, lo, hi, records) SELECT source, lo, hi, n FROM per
        RETURNING claim, records, source AS part
    )"""

# Saved claims' rows again, by their ids (claims not deleted yet: re-sent after a crash); no runs to find.
_AGAIN = """
    WITH claimed AS MATERIALIZED (
        SELECT claim, records, claim AS part, source, lo, hi FROM unilog_claims WHERE claim = ANY(%(claims)s::bigint[])
    ),
    ids AS (
        SELECT c.source, c.part, g AS id FROM claimed c
        CROSS JOIN LATERAL unnest(c.lo, c.hi) AS r(lo, hi) CROSS JOIN LATERAL generate_series(r.lo, r.hi) AS g
    ),
    cut AS (SELECT false AS c),
    batch AS MATERIALIZED (
        SELECT {columns}, ids.source, ids.part, false AS starts, false AS ends FROM ids
        JOIN staged_log_records s ON s.stream = ids.source AND s.id = ids.id
    )""".format(columns=_COLUMNS.replace("id,", "s.id,", 1))

# ONE row for the whole batch: its publish arguments encoded as RESP bulk strings (as claims._PACKED does for one
# source: five arguments a record, seven when any record of the batch is traced, eight when any is typed; a field left
# empty is not written to the entry, so the stride changes no entry), part by part (a new batch's part is a source, a
# re-read one's a claim: a source may have several saved claims), each in id order; then per part, in the same order,
# its claim, source, the records the claim was saved with, its records, its bytes of the body and its oldest record's
# created time; then whether a byte budget left rows out (a new batch's ``cut``); then up to 128 traceparents a part
# (they only link the publish span), as "part traceparent". Postgres encodes every record in C and sorts the batch
# once (not a sort per claim: ten thousand of them at ten thousand streams); the streamer cuts the body at the parts'
# sizes (:func:`_claims`). A part's aggregates (``per``) are computed once, its runs with them: a new claim is saved
# from them (no second grouping of the batch).
_ENCODED = f"""
    , shape AS (
        SELECT CASE WHEN bool_or(coalesce(ty, '') <> '') THEN 8 WHEN bool_or(coalesce(tp, '') <> '') THEN 7 ELSE 5
               END AS stride FROM batch
    ), packed AS MATERIALIZED (
        SELECT source, part, id, created_ms, tp, starts, ends,
{RESP_FIELDS.rstrip().rstrip(",")} AS resp
        FROM (SELECT data, action, object, created_ms, created_ms::text AS created, coalesce(key, '') AS key,
                     coalesce(tp, '') AS tp, coalesce(ts, '') AS ts, coalesce(ty, '') AS ty, source, part, id,
                     starts, ends
              FROM batch) b,
             shape
    ), per AS MATERIALIZED (
        SELECT part, min(source) AS source, count(*) AS n, sum(octet_length(resp)) AS size,
               min(created_ms) AS created, array_agg(id ORDER BY id) FILTER (WHERE starts) AS lo,
               array_agg(id ORDER BY id) FILTER (WHERE ends) AS hi
        FROM packed GROUP BY part
    )"""

_FINAL = """
    SELECT (SELECT stride FROM shape),
           (SELECT convert_to(string_agg(resp, '' ORDER BY part, id), 'UTF8') FROM packed),
           array_agg(c.claim ORDER BY p.part), array_agg(p.source ORDER BY p.part),
           array_agg(c.records ORDER BY p.part), array_agg(p.n ORDER BY p.part),
           array_agg(p.size ORDER BY p.part), array_agg(p.created ORDER BY p.part),
           (SELECT c FROM cut),
           (SELECT array_agg(part::text || ' ' || tp) FROM (
                SELECT part, tp, row_number() OVER (PARTITION BY part ORDER BY id) AS k FROM packed WHERE tp <> ''
            ) t WHERE k <= 128)
    FROM per p JOIN claimed c USING (part)
"""

# A batch read, not saved (:func:`read_across`): :data:`_FINAL`'s row without claims (each part a source, saved with
# its records), then the parts' claims to save as text, a line a part: "source lo,lo,.. hi,hi,.. records" (a stream
# name holds no space; a row staged with no stream has ''), which :data:`SAVE_READ` inserts as it is (no array of
# arrays to adapt: the runs of ten thousand sources); then the server's start time: a read saved on another server
# (a session that reached a promoted standby while the other still reached the old primary) saves nothing.
_READ_FINAL = """
    SELECT (SELECT stride FROM shape),
           (SELECT convert_to(string_agg(resp, '' ORDER BY part, id), 'UTF8') FROM packed),
           NULL::bigint[], array_agg(p.source ORDER BY p.part), array_agg(p.n ORDER BY p.part),
           array_agg(p.n ORDER BY p.part), array_agg(p.size ORDER BY p.part), array_agg(p.created ORDER BY p.part),
           (SELECT c FROM cut),
           (SELECT array_agg(part::text || ' ' || tp) FROM (
                SELECT part, tp, row_number() OVER (PARTITION BY part ORDER BY id) AS k FROM packed WHERE tp <> ''
            ) t WHERE k <= 128),
           string_agg(p.source || ' ' || array_to_string(p.lo, ',') || ' ' || array_to_string(p.hi, ',') || ' '
                      || p.n, E'\n' ORDER BY p.part),
           pg_postmaster_start_time()::text
    FROM per p
"""

SAVE_READ = """
    INSERT INTO unilog_claims (source, lo, hi, records)
    SELECT split_part(l, ' ', 1), string_to_array(split_part(l, ' ', 2), ',')::bigint[],
           string_to_array(split_part(l, ' ', 3), ',')::bigint[], split_part(l, ' ', 4)::integer
    FROM unnest(string_to_array(%s, E'\n')) WITH ORDINALITY AS u(l, k)
    WHERE pg_postmaster_start_time()::text = %s
    ORDER BY k
    RETURNING source, claim
"""

CLAIM_ACROSS = _SCANNED + _NEW + _ENCODED + _SAVED + _FINAL
CLAIM_FEW = _PER_SOURCE + _NEW + _ENCODED + _SAVED + _FINAL
AGAIN_ACROSS = _AGAIN + _ENCODED + _FINAL
READ_ACROSS = _SCANNED + _NEW + _ENCODED + _READ_FINAL
READ_FEW = _PER_SOURCE + _NEW + _ENCODED + _READ_FINAL


@dataclass(slots=True)  # not frozen: a batch makes one per stream, and a frozen one's __init__ costs six times more
class SourceClaim:
    """One source's part of a claim across sources, encoded for Redis (see :class:`unilog.wire.Packed`); read-only
    by contract."""

    claim: int
    source: str
    count: int
    saved: int  # the records the claim was saved with
    stride: int
    body: bytes
    first_created_ms: int | None
    parents: tuple[str, ...]


# The statements over a batch's sources or claims are never prepared: a generic plan cannot hash `= ANY(array)` (the
# array is no constant there), and compares each row with every element: rows x streams.


# Bytes of records' data a batch across streams claims at most: its body is one value in Postgres (capped at 1 GB,
# and held a few times over while it is built) and one piece of the streamer's memory. 80,000 records of 200 bytes
# are 16 MB.
BATCH_BYTES = 64 << 20


@dataclass(frozen=True)
class Across:
    """A claim across sources: its parts in claim order (empty: nothing committed to claim), whether the byte
    budget left committed rows out (more is ready), and whether it took its ``limit`` of records (more may be)."""

    claims: list[SourceClaim]
    cut: bool = False
    filled: bool = False


def claim_across(
    conn: psycopg.Connection[Any],
    sources: list[str],
    limit: int,
    before: str | None = None,
    per_source: int | None = None,
    budget: int | None = None,
) -> Across:
    """Claim the lowest ``per_source`` committed rows of each of ``sources`` (None: all) among their ``limit``
    lowest-id committed rows (as many as fit in ``budget`` bytes of data, :data:`BATCH_BYTES` by default, one at
    least), in one statement, saving one claim per source. Over few sources (``per_source`` of each fit in
    ``limit``), the ``limit`` lowest ids are taken among each source's lowest ``per_source``: a source with many rows
    at the lowest ids does not hold the others' back. Every row of ``sources`` must be out of any saved claim
    (re-sent and deleted first): a saved claim's rows would be claimed again. The claims are saved in the caller's
    transaction: it must commit before any of them is sent."""
    if not sources:
        return Across([])
    statement, params = _claim_params(sources, limit, before, per_source, budget, read=False)
    row = conn.execute(statement, params, binary=True, prepare=False).fetchone()
    assert row is not None  # an aggregate without GROUP BY: always one row
    return Across(_claims(row), bool(row[8]), sum(row[5] or ()) >= limit)


def _claim_params(
    sources: list[str], limit: int, before: str | None, per_source: int | None, budget: int | None, *, read: bool
) -> tuple[str, dict[str, Any]]:
    """A claim's (or, with ``read``, a read's) statement and parameters."""
    # one string, not a text[] of ten thousand elements (adapting those dominated the call): a stream name holds no
    # space (unilog.config.validate_stream_name); a row staged with no stream has '' (``blank``)
    names = " ".join(s for s in sources if s)
    params = {
        "names": names,
        "blank": "" in sources,
        "limit": limit,
        "before": before,
        "per_source": per_source or limit,
        "budget": budget or BATCH_BYTES,
    }
    few = len(sources) * (per_source or limit) <= limit  # each source's index range, not a scan (_PER_SOURCE)
    if read:
        return (READ_FEW if few else READ_ACROSS), params
    return (CLAIM_FEW if few else CLAIM_ACROSS), params


@dataclass(frozen=True)
class Read:
    """A batch across sources read and not saved (:func:`read_across`): what :func:`claim_across` would claim from
    the same snapshot, to be saved by :func:`save_read`."""

    row: Any  # the statement's row (as :func:`claim_across`'s, without claims), then its parts' claims as text
    limit: int  # the records it could take


def read_across(
    conn: psycopg.Connection[Any],
    sources: list[str],
    limit: int,
    before: str | None = None,
    per_source: int | None = None,
    budget: int | None = None,
) -> Read:
    """What :func:`claim_across` with the same arguments would claim, read and not saved: no row is written, so any
    session may read it (a second one, while the streamer's own claims other sources). Its rows' ids are valid for
    as long as nothing deletes rows of ``sources`` meanwhile: only their owner does, after it saved and sent them, so
    the owner saves it (:func:`save_read`) before anything else of ``sources``; rows committed since its snapshot
    are left to a later claim, as a claim leaves those committed after its own."""
    if not sources:
        return Read((None,) * 12, limit)
    statement, params = _claim_params(sources, limit, before, per_source, budget, read=True)
    row = conn.execute(statement, params, binary=True, prepare=False).fetchone()
    assert row is not None  # an aggregate without GROUP BY: always one row
    return Read(row, limit)


def save_read(conn: psycopg.Connection[Any], read: Read) -> Across | None:
    """Save ``read``'s claims (one per source) in the caller's transaction, which must commit before any of them is
    sent, and return them as :func:`claim_across` does; None if ``conn`` is a session of another server than the
    read's (nothing saved). The caller must own the sources and must not have deleted or claimed rows of them since
    the read."""
    row = read.row
    if not row[3]:
        return Across([])
    claim_of = dict(conn.execute(SAVE_READ, (row[10], row[11]), prepare=False).fetchall())
    if not claim_of:
        return None
    saved = (row[0], row[1], [claim_of[s] for s in row[3]], *row[3:10])  # the row as claim_across's
    return Across(_claims(saved), bool(row[8]), sum(row[5] or ()) >= read.limit)


def reclaim_across(conn: psycopg.Connection[Any], claims: list[int]) -> list[SourceClaim]:
    """Saved claims' batches, the same records in the same order as when they were made, in claim order; a claim
    whose rows are all gone is missing from the result."""
    if not claims:
        return []
    row = conn.execute(AGAIN_ACROSS, {"claims": claims}, binary=True, prepare=False).fetchone()
    return _claims(row, by_claim=True)


def _claims(row: Any, *, by_claim: bool = False) -> list[SourceClaim]:
    """The batch's row (see ``_ENCODED``) as one claim per part, in claim order (the order they were made, and so
    sent and re-sent in), each with its slice of the body."""
    # read in binary: the integers are ints and the body bytes already (converting them again cost as much as the rest)
    stride, body, claims, sources, saved, counts, sizes, created, _cut, traced = row
    if not claims:
        return []
    parents: dict[str, list[str]] = {}
    for item in traced or ():
        part, _, parent = item.partition(" ")
        parents.setdefault(part, []).append(parent)
    out, at = [], 0
    for claim, source, was, count, size, first in zip(claims, sources, saved, counts, sizes, created, strict=True):
        linked = parents.get(str(claim) if by_claim else source) if parents else None
        piece = body[at : at + size]
        out.append(SourceClaim(claim, source, count, was or 0, stride, piece, first, tuple(linked or ())))
        at += size
    out.sort(key=lambda c: c.claim)
    return out


def pending_across(conn: psycopg.Connection[Any], sources: list[str]) -> list[tuple[int, str, int]]:
    """The claims of ``sources`` saved and not yet deleted (their batches may be in Redis), oldest first, as
    (claim, source, records)."""
    rows = conn.execute(
        "SELECT claim, source, records FROM unilog_claims WHERE source = ANY(%s::text[]) ORDER BY claim", (sources,)
    ).fetchall()
    return [(int(r[0]), r[1], int(r[2])) for r in rows]


# The ids of claims, as one array: the rows are then found by the primary key, one index scan for the whole batch (a
# join on the runs was planned per source and row). An id is one row's, and a claim's runs hold only ids of rows it
# claimed: the rows' own ``stream`` says which source each is (a filter on the sources was not hashed: sources x rows).
# A claim whose runs are all of one id (``lo = hi``: most over thousands of streams) gives its ``lo`` as it is, one
# set-returning call in the select list, not a function scan per claim and run (that was two fifths of the delete of a
# piece of 1,250 claims); a series per run cost a fifth of it.
_IDS = """
    ids AS MATERIALIZED (
        SELECT array_agg(x) AS a FROM (
            SELECT unnest(c.lo) AS x FROM c WHERE c.lo = c.hi
            UNION ALL
            SELECT generate_series(r.lo, r.hi) FROM c CROSS JOIN LATERAL unnest(c.lo, c.hi) AS r(lo, hi)
            WHERE c.lo <> c.hi
        ) t
    )"""

_LOCK_ACROSS = f"""
    WITH c AS (SELECT source, lo, hi FROM unilog_claims WHERE claim = ANY(string_to_array(%s, ' ')::bigint[])),
    {_IDS.strip()},
    locked AS (
        SELECT s.stream FROM ids JOIN staged_log_records s ON s.id = ANY(ids.a) FOR UPDATE OF s SKIP LOCKED
    )
    SELECT stream, count(*) FROM locked GROUP BY stream
"""


# The memory a streamer's sort may take before it spills to disk (kB): a batch across ten thousand streams sorts its
# rows by stream (its claims' runs) and its body (80,000 records of some 200 bytes); at the default 4 MB both spilled,
# a merge on disk each batch. A session setting, one per streamer: raised, never lowered below the server's.
SORT_MEMORY_KB = 64 * 1024


def tune_streamer_session(conn: psycopg.Connection[Any]) -> None:
    """Set the streamer's session up for its batch statements (committed here). JIT compilation off: the statements
    touch a batch of rows, and the planner's guess for a claim's runs (``generate_series``: a thousand rows a run)
    priced them high enough to compile, which cost more than the statements themselves. ``work_mem`` raised to
    :data:`SORT_MEMORY_KB` where the server's is lower. Commits."""
    conn.execute("SET jit = off")
    conn.execute(
        "SELECT set_config('work_mem', %s, false) FROM pg_settings WHERE name = 'work_mem' AND setting::bigint < %s",
        (f"{SORT_MEMORY_KB}kB", SORT_MEMORY_KB),
    )
    conn.commit()


def lock_across(conn: psycopg.Connection[Any], claims: list[int]) -> dict[str, int]:
    """Lock the rows of ``claims`` for the caller's transaction, skipping those another session holds (a session
    that locked staged rows would hold a batch of thousands of streams back: only the streams it holds wait); return
    the rows locked per source (a source with none is missing)."""
    rows = conn.execute(_LOCK_ACROSS, (" ".join(map(str, claims)),), prepare=False).fetchall()
    return {r[0]: int(r[1]) for r in rows}


_DELETE_ACROSS = f"""
    WITH c AS (
        DELETE FROM unilog_claims WHERE claim = ANY(string_to_array(%s, ' ')::bigint[]) RETURNING source, lo, hi
    ),
    {_IDS.strip()},
    d AS (
        DELETE FROM staged_log_records s USING ids WHERE s.id = ANY(ids.a) RETURNING 1
    )
    SELECT count(*) FROM d
"""


def delete_across(conn: psycopg.Connection[Any], claims: list[int], *, lock_wait: float | None = None) -> int | None:
    """Delete published claims and their rows in one statement, in the caller's transaction (the positions are saved
    in it too: :func:`unilog.store.save_positions`). Returns the rows deleted; the caller must check it equals the
    claims' records (fewer means another session deleted some). With ``lock_wait``, a row another session holds
    locked is waited for that many seconds at most: then None is returned, the caller's transaction rolled back."""
    if lock_wait:  # at least 1 ms: a lock_timeout of 0 would wait for ever
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{max(1, int(lock_wait * 1000))}ms",))
    try:
        row = conn.execute(_DELETE_ACROSS, (" ".join(map(str, claims)),), prepare=False).fetchone()
    except psycopg.errors.LockNotAvailable:
        conn.rollback()
        return None
    return int(row[0]) if row else 0


def open_while_sending(conn: psycopg.Connection[Any]) -> None:
    """Let the caller's transaction stay open, idle, while Redis appends (a batch sent in pieces is deleted piece by
    piece in one transaction, committed once Redis confirmed every piece): the server's
    ``idle_in_transaction_session_timeout``, if set, would end the session at every slow piece, and each retry would
    take the same path. For this transaction only."""
    conn.execute("SELECT set_config('idle_in_transaction_session_timeout', '0', true)")
