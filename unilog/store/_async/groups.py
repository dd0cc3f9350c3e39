"""Consumer groups in Postgres: the identities of records a group applied, and the watermarks that prune them;
the statements both faces of a group worker run (:mod:`unilog.store.groups` adds what only the threaded face has)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

Identity = tuple[str, int, int]  # (producer, epoch, seq)


WATERMARKS = "SELECT producer, epoch, seq FROM unilog_group_watermarks WHERE group_name = %s AND stream = %s"
CLAIM = """
    WITH ins AS (
        INSERT INTO unilog_processed (group_name, stream, producer, epoch, seq)
        SELECT %(g)s, %(s)s, r.p, r.e, n
        FROM unnest(%(p)s::text[], %(e)s::bigint[], %(lo)s::bigint[], %(hi)s::bigint[]) AS r(p, e, lo, hi),
             generate_series(r.lo, r.hi) AS n
        ON CONFLICT DO NOTHING
        RETURNING producer, epoch, seq
    )
    SELECT count(*),
           CASE WHEN count(*) < %(n)s THEN array_agg(producer) END,
           CASE WHEN count(*) < %(n)s THEN array_agg(epoch) END,
           CASE WHEN count(*) < %(n)s THEN array_agg(seq) END
    FROM ins
"""
# several streams: joined with the names' list, not `= ANY(...)` (which a generic plan compares element by element)
WATERMARKS_MANY = """
    SELECT w.stream, w.producer, w.epoch, w.seq
    FROM unnest(%s::text[]) AS n(stream)
    JOIN unilog_group_watermarks w ON w.group_name = %s AND w.stream = n.stream
"""
# CLAIM over several streams: the runs carry their stream; rows go in in the order given (streams in name order,
# so two workers claiming on the same streams wait for each other, never deadlock)
CLAIM_MANY = """
    WITH ins AS (
        INSERT INTO unilog_processed (group_name, stream, producer, epoch, seq)
        SELECT %(g)s, r.s, r.p, r.e, n
        FROM unnest(%(s)s::text[], %(p)s::text[], %(e)s::bigint[], %(lo)s::bigint[], %(hi)s::bigint[])
             WITH ORDINALITY AS r(s, p, e, lo, hi, k),
             generate_series(r.lo, r.hi) AS n
        ORDER BY r.k, n  -- the order given: streams in name order
        ON CONFLICT DO NOTHING
        RETURNING stream, producer, epoch, seq
    )
    SELECT count(*),
           CASE WHEN count(*) < %(n)s THEN array_agg(stream) END,
           CASE WHEN count(*) < %(n)s THEN array_agg(producer) END,
           CASE WHEN count(*) < %(n)s THEN array_agg(epoch) END,
           CASE WHEN count(*) < %(n)s THEN array_agg(seq) END
    FROM ins
"""
ADVANCE = """
        WITH pairs AS (
            SELECT DISTINCT producer, epoch FROM unilog_processed
            WHERE group_name = %(g)s AND stream = %(s)s AND producer <> ''
        ), current AS (
            SELECT p.producer, p.epoch, coalesce(w.seq, 0) AS seq
            FROM pairs p LEFT JOIN unilog_group_watermarks w
              ON w.group_name = %(g)s AND w.stream = %(s)s AND w.producer = p.producer AND w.epoch = p.epoch
        ), runs AS (
            SELECT c.producer, c.epoch, r.seq, r.seq - c.seq - row_number() OVER (
                PARTITION BY c.producer, c.epoch ORDER BY r.seq) AS offset_from_run
            FROM current c JOIN unilog_processed r
              ON r.group_name = %(g)s AND r.stream = %(s)s AND r.producer = c.producer AND r.epoch = c.epoch
             AND r.seq > c.seq
        ), advanced AS (
            SELECT producer, epoch, max(seq) AS seq FROM runs WHERE offset_from_run = 0 GROUP BY producer, epoch
        )
        INSERT INTO unilog_group_watermarks (group_name, stream, producer, epoch, seq)
        SELECT %(g)s, %(s)s, producer, epoch, seq FROM advanced
        ON CONFLICT (group_name, stream, producer, epoch) DO UPDATE SET seq = excluded.seq
        """
PRUNE = """
        DELETE FROM unilog_processed r USING unilog_group_watermarks w
        WHERE r.group_name = %(g)s AND r.stream = %(s)s
          AND w.group_name = r.group_name AND w.stream = r.stream AND w.producer = r.producer AND w.epoch = r.epoch
          AND r.seq <= w.seq
        """
# The prune locks of several streams, the free ones taken (each stream's as PRUNE_LOCK takes it), in a statement of
# their own: the statements after it take their snapshots after it, so they see what the lock's last holder committed
PRUNE_LOCKS = """
    SELECT coalesce(array_agg(n.stream), '{}') FROM unnest(%(s)s::text[]) AS n(stream)
    WHERE pg_try_advisory_xact_lock(hashtextextended('unilog.group:' || %(g)s || ':' || n.stream, 0))
"""
# ADVANCE over the streams of %(s)s (whose prune locks this transaction holds); a watermark never moves back
ADVANCE_MANY = """
    WITH pairs AS (
        SELECT DISTINCT r.stream, r.producer, r.epoch FROM unnest(%(s)s::text[]) AS n(stream)
        JOIN unilog_processed r ON r.group_name = %(g)s AND r.stream = n.stream AND r.producer <> ''
    ), current AS (
        SELECT p.stream, p.producer, p.epoch, coalesce(w.seq, 0) AS seq
        FROM pairs p LEFT JOIN unilog_group_watermarks w
          ON w.group_name = %(g)s AND w.stream = p.stream AND w.producer = p.producer AND w.epoch = p.epoch
    ), runs AS (
        SELECT c.stream, c.producer, c.epoch, r.seq, r.seq - c.seq - row_number() OVER (
            PARTITION BY c.stream, c.producer, c.epoch ORDER BY r.seq) AS offset_from_run
        FROM current c JOIN unilog_processed r
          ON r.group_name = %(g)s AND r.stream = c.stream AND r.producer = c.producer AND r.epoch = c.epoch
         AND r.seq > c.seq
    ), advanced AS (
        SELECT stream, producer, epoch, max(seq) AS seq FROM runs WHERE offset_from_run = 0
        GROUP BY stream, producer, epoch
    )
    INSERT INTO unilog_group_watermarks (group_name, stream, producer, epoch, seq)
    SELECT %(g)s, stream, producer, epoch, seq FROM advanced ORDER BY stream, producer, epoch
    ON CONFLICT (group_name, stream, producer, epoch)
    DO UPDATE SET seq = greatest(unilog_group_watermarks.seq, excluded.seq)
"""
PRUNE_LOCKED = """
    DELETE FROM unilog_processed r USING unnest(%(s)s::text[]) AS n(stream), unilog_group_watermarks w
    WHERE r.group_name = %(g)s AND r.stream = n.stream
      AND w.group_name = r.group_name AND w.stream = r.stream AND w.producer = r.producer AND w.epoch = r.epoch
      AND r.seq <= w.seq
"""
PRUNE_LOCK = "SELECT pg_try_advisory_xact_lock(hashtextextended('unilog.group:' || %s || ':' || %s, 0))"


async def group_watermarks(conn: psycopg.AsyncConnection[Any], group: str, stream: str) -> dict[tuple[str, int], int]:
    """(producer, epoch) -> the seq at or below which every record was applied by ``group``."""
    cursor = await conn.execute(WATERMARKS, (group, stream))
    return watermarks_from_rows(await cursor.fetchall())


async def group_watermarks_many(
    conn: psycopg.AsyncConnection[Any], group: str, streams: Sequence[str]
) -> dict[str, dict[tuple[str, int], int]]:
    """:func:`group_watermarks` of each of ``streams``, in one statement; a stream without any is left out."""
    cursor = await conn.execute(WATERMARKS_MANY, (list(streams), group))
    marks: dict[str, dict[tuple[str, int], int]] = {}
    for stream, producer, epoch, seq in await cursor.fetchall():
        marks.setdefault(stream, {})[(producer, int(epoch))] = int(seq)
    return marks


async def claim_identities_many(
    conn: psycopg.AsyncConnection[Any], group: str, identities: dict[str, Sequence[Identity]]
) -> dict[str, set[Identity]]:
    """:func:`claim_identities` on several streams (stream -> its distinct identities) in one statement, streams in
    name order; return each stream's new identities."""
    streams: list[str] = []
    params: dict[str, Any] = {"g": group, "p": [], "e": [], "lo": [], "hi": [], "n": 0}
    for stream in sorted(identities):
        producers, epochs, lows, highs = _runs(identities[stream])
        streams += [stream] * len(producers)
        params["p"] += producers
        params["e"] += epochs
        params["lo"] += lows
        params["hi"] += highs
        params["n"] += len(identities[stream])
    if not streams:
        return {}
    cursor = await conn.execute(CLAIM_MANY, {**params, "s": streams})
    row = await cursor.fetchone()
    assert row is not None
    if row[0] == params["n"]:
        return {stream: set(ids) for stream, ids in identities.items()}
    new: dict[str, set[Identity]] = {stream: set() for stream in identities}
    if row[0]:
        for stream, producer, epoch, seq in zip(row[1], row[2], row[3], row[4], strict=True):
            new[stream].add((producer, int(epoch), int(seq)))
    return new


def watermarks_from_rows(rows: Sequence[tuple[Any, ...]]) -> dict[tuple[str, int], int]:
    return {(r[0], int(r[1])): int(r[2]) for r in rows}


def claim_params(group: str, stream: str, identities: Sequence[Identity]) -> dict[str, Any]:
    """:data:`CLAIM`'s parameters: ``identities`` as runs of consecutive seqs."""
    producers, epochs, lows, highs = _runs(identities)
    return {"g": group, "s": stream, "p": producers, "e": epochs, "lo": lows, "hi": highs, "n": len(identities)}


def claimed_from_row(row: tuple[Any, ...] | None, identities: Sequence[Identity]) -> set[Identity]:
    """The new identities, from :data:`CLAIM`'s one row."""
    assert row is not None
    if row[0] == len(identities):
        return set(identities)
    if not row[0]:
        return set()
    return {(p, int(e), int(n)) for p, e, n in zip(row[1], row[2], row[3], strict=True)}


async def claim_identities(
    conn: psycopg.AsyncConnection[Any], group: str, stream: str, identities: Sequence[Identity]
) -> set[Identity]:
    """Insert ``identities`` (distinct) as applied by ``group`` in the caller's transaction; return those that were
    new.

    Identities already present belong to records this group applied before (a redelivery): the caller skips them.
    They are sent as runs of consecutive seqs, which is what a stream's positions mostly are, and the new ones are
    listed only when some were not new: the common batch costs a few values each way, not one per record.
    """
    if not identities:
        return set()
    cursor = await conn.execute(CLAIM, claim_params(group, stream, identities))
    row = await cursor.fetchone()
    return claimed_from_row(row, identities)


def _runs(identities: Sequence[Identity]) -> tuple[list[str], list[int], list[int], list[int]]:
    """``identities`` as runs of consecutive seqs per (producer, epoch): four parallel lists."""
    producers: list[str] = []
    epochs: list[int] = []
    lows: list[int] = []
    highs: list[int] = []
    last: Identity | None = None
    for identity in identities:
        producer, epoch, seq = identity
        if last is not None and seq == last[2] + 1 and epoch == last[1] and producer == last[0]:
            highs[-1] = seq
        else:
            producers.append(producer)
            epochs.append(epoch)
            lows.append(seq)
            highs.append(seq)
        last = identity
    return producers, epochs, lows, highs


async def advance_watermarks(conn: psycopg.AsyncConnection[Any], group: str, stream: str) -> int:
    """Move each (producer, epoch) watermark over the contiguous run of applied seqs above it and prune the rows
    at or below it, in the caller's transaction; return rows pruned. Seqs are dense per producer and stream, so a
    watermark never passes a record that was not applied (a dead letter, say): that record blocks it until it is
    replayed and applied, or dropped."""
    await conn.execute(ADVANCE, {"g": group, "s": stream})
    return (await conn.execute(PRUNE, {"g": group, "s": stream})).rowcount


async def prune_watermarks(
    conn: psycopg.AsyncConnection[Any], group: str, streams: Sequence[str]
) -> tuple[int, list[str]]:
    """:func:`advance_watermarks` on each of ``streams`` whose prune lock is free (taken here, for the caller's
    transaction; the others are being pruned by another worker), in three statements; return the rows pruned and
    the streams pruned."""
    if not streams:
        return 0, []
    row = await (await conn.execute(PRUNE_LOCKS, {"g": group, "s": list(streams)})).fetchone()
    locked = list(row[0]) if row else []
    if not locked:
        return 0, []
    await conn.execute(ADVANCE_MANY, {"g": group, "s": locked})
    return (await conn.execute(PRUNE_LOCKED, {"g": group, "s": locked})).rowcount, locked


async def read_committed(conn: psycopg.AsyncConnection[Any]) -> None:
    """Run the transaction just begun at READ COMMITTED, whatever ``default_transaction_isolation`` says: a group's
    claim of identities relies on each statement seeing the commits before it (a prune that committed while the claim
    waited on its rows; at REPEATABLE READ the watermarks read after the claim would not show it). The first
    statement of the transaction."""
    await conn.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")


async def try_prune_lock(conn: psycopg.AsyncConnection[Any], group: str, stream: str) -> bool:
    """Take the transaction-level lock that lets one worker of ``group`` prune at a time; False if another has it."""
    row = await (await conn.execute(PRUNE_LOCK, (group, stream))).fetchone()
    return bool(row and row[0])
