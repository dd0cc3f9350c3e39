"""Table mode's claims across streams: one statement claims the oldest committed staged rows of many sources (the
``stream`` column's values) at once, saving one claim per source; one statement re-reads saved claims; one deletes
every claim of a batch Redis confirmed, with its rows, and advances the positions.

The arguments of :mod:`unilog.store.claims` hold per source, claim by claim: a claim is taken from one snapshot, in id
order, and saved (one ``unilog_claims`` row per source, with its runs of consecutive ids) before anything of it is
sent. What differs is the candidates: not the rows after a cursor, but every committed row of the sources that is
not in a saved claim (the caller re-sends and deletes those before it claims anew, and deletes each batch before the
next claim), the lowest ids first. So a record whose transaction committed after another's on the same row, and
which this claim takes, has the other one either published and deleted already or in this claim before it: per
source, commit order per key holds. No claim waits for an open transaction: its rows are taken by a later claim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from .claims import _COLUMNS, RESP_FIELDS

# The rows of a new claim: the lowest ids of the sources' committed rows (``before``: WAL mode's table passes publish
# only the rows that may predate the slot), at most ``per_source`` of each source: its lowest, so still a prefix of
# its rows in id order (a source's part is sent in one script call, which this bounds). Scanned in id order by the
# primary key, the sources hashed.
_NEW = f"""
    WITH scanned AS MATERIALIZED (
        SELECT {_COLUMNS}, stream AS source FROM staged_log_records
        WHERE (stream = ANY(string_to_array(%(names)s, ' ')) OR (%(blank)s AND stream = ''))
          AND (%(before)s::xid8 IS NULL OR xid < %(before)s::xid8)
        ORDER BY id LIMIT %(limit)s
    ),
    ranked AS MATERIALIZED (SELECT s.*, row_number() OVER (PARTITION BY source ORDER BY id) AS rn FROM scanned s),
    rows AS MATERIALIZED (SELECT * FROM ranked WHERE rn <= %(per_source)s),
    runs AS (
        SELECT source, min(id) AS lo, max(id) AS hi FROM (SELECT source, id, id - rn AS g FROM rows) t
        GROUP BY source, g
    ),
    claimed AS (
        INSERT INTO unilog_claims (source, lo, hi, records)
        SELECT source, array_agg(lo ORDER BY lo), array_agg(hi ORDER BY lo), sum(hi - lo + 1) FROM runs
        GROUP BY source
        RETURNING claim, source, records
    ),
    batch AS MATERIALIZED (SELECT r.*, c.claim, c.records FROM rows r JOIN claimed c USING (source))
"""

# Saved claims' rows again, by their ids (claims not deleted yet: re-sent after a crash).
_AGAIN = f"""
    WITH claimed AS (SELECT claim, source, lo, hi, records FROM unilog_claims WHERE claim = ANY(%(claims)s::bigint[])),
    ids AS (
        SELECT c.claim, c.source, c.records, g AS id FROM claimed c
        CROSS JOIN LATERAL unnest(c.lo, c.hi) AS r(lo, hi) CROSS JOIN LATERAL generate_series(r.lo, r.hi) AS g
    ),
    batch AS MATERIALIZED (
        SELECT {_COLUMNS.replace("id,", "s.id,", 1)}, ids.source, ids.claim, ids.records FROM ids
        JOIN staged_log_records s ON s.stream = ids.source AND s.id = ids.id
    )
"""

# One row per claim: its publish arguments encoded as RESP bulk strings in id order (as claims._PACKED does for one
# source: five arguments a record, seven when any record of the claim is traced, eight when any is typed), in claim
# order, with its oldest record's created time and up to 128 traceparents (any: they only link the publish span).
# Postgres encodes every record in C; the streamer touches none in Python. One ordered aggregate: each is a sort.
_PER_CLAIM = f"""
    , packed AS (
        SELECT claim, source, records, data, action, object, created_ms, created_ms::text AS created,
               coalesce(key, '') AS key, coalesce(tp, '') AS tp, coalesce(ts, '') AS ts, coalesce(ty, '') AS ty, id
        FROM batch
    ), shape AS (
        SELECT claim, CASE WHEN bool_or(ty <> '') THEN 8 WHEN bool_or(tp <> '') THEN 7 ELSE 5 END AS stride
        FROM packed GROUP BY claim
    )
    SELECT p.claim, min(p.source), min(p.records), count(*), min(shape.stride),
           convert_to(string_agg(
{RESP_FIELDS}               '' ORDER BY p.id), 'UTF8'),
           min(p.created_ms),
           (array_agg(p.tp) FILTER (WHERE p.tp <> ''))[1:128]
    FROM packed p JOIN shape USING (claim)
    GROUP BY p.claim ORDER BY p.claim
"""

CLAIM_ACROSS = _NEW + _PER_CLAIM
AGAIN_ACROSS = _AGAIN + _PER_CLAIM


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


def claim_across(
    conn: psycopg.Connection[Any],
    sources: list[str],
    limit: int,
    before: str | None = None,
    per_source: int | None = None,
) -> list[SourceClaim]:
    """Claim among the ``limit`` lowest-id committed rows of ``sources`` the lowest ``per_source`` of each source (None:
    all) in one statement, saving one claim per source, and return them in claim order (empty: nothing committed to
    claim). Every row of ``sources`` must be out of any saved claim (re-sent and deleted first): a saved claim's rows
    would be claimed again. The claims are saved in the caller's transaction: it must commit before any of them is
    sent."""
    if not sources:
        return []
    # one string, not a text[] of ten thousand elements (adapting those dominated the call): a stream name holds no
    # space (unilog.config.validate_stream_name); a row staged with no stream has '' (``blank``)
    names = " ".join(s for s in sources if s)
    params = {
        "names": names,
        "blank": "" in sources,
        "limit": limit,
        "before": before,
        "per_source": per_source or limit,
    }
    return _claims(conn.execute(CLAIM_ACROSS, params, binary=True, prepare=False).fetchall())


def reclaim_across(conn: psycopg.Connection[Any], claims: list[int]) -> list[SourceClaim]:
    """Saved claims' batches, the same records in the same order as when they were made, in claim order; a claim
    whose rows are all gone is missing from the result."""
    if not claims:
        return []
    return _claims(conn.execute(AGAIN_ACROSS, {"claims": claims}, binary=True, prepare=False).fetchall())


def _claims(rows: list[Any]) -> list[SourceClaim]:
    # read in binary: the integers are ints and the body bytes already (converting them again cost as much as the rest)
    return [
        SourceClaim(claim, source, count, saved or 0, stride, body, created, tuple(parents) if parents else ())
        for claim, source, saved, count, stride, body, created, parents in rows
    ]


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
_IDS = """
    ids AS MATERIALIZED (
        SELECT array_agg(g) AS a FROM c
        CROSS JOIN LATERAL unnest(c.lo, c.hi) AS r(lo, hi) CROSS JOIN LATERAL generate_series(r.lo, r.hi) AS g
    )"""

_LOCK_ACROSS = f"""
    WITH c AS (SELECT source, lo, hi FROM unilog_claims WHERE claim = ANY(string_to_array(%s, ' ')::bigint[])),
    {_IDS.strip()},
    locked AS (
        SELECT s.stream FROM ids JOIN staged_log_records s ON s.id = ANY(ids.a) FOR UPDATE OF s SKIP LOCKED
    )
    SELECT stream, count(*) FROM locked GROUP BY stream
"""


def no_jit(conn: psycopg.Connection[Any]) -> None:
    """Turn JIT compilation off for the session (committed here): the streamer's statements touch a batch of rows,
    and the planner's guess for a claim's runs (``generate_series``: a thousand rows a run) priced them high enough to
    compile, which cost more than the statements themselves. Commits."""
    conn.execute("SET jit = off")
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
    if lock_wait:
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{int(lock_wait * 1000)}ms",))
    try:
        row = conn.execute(_DELETE_ACROSS, (" ".join(map(str, claims)),), prepare=False).fetchone()
    except psycopg.errors.LockNotAvailable:
        conn.rollback()
        return None
    return int(row[0]) if row else 0
