"""This database's identity as a producer (id and epoch) and the last position published per stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from ..errors import SchemaMissing


@dataclass(frozen=True, slots=True)
class ProducerIdentity:
    """This database's identity as a producer: positions are per (producer, stream)."""

    producer_id: str
    epoch: int


def producer_identity(conn: psycopg.Connection[Any]) -> ProducerIdentity:
    """Read this database's producer id and epoch."""
    row = conn.execute("SELECT producer_id, epoch FROM unilog_producer").fetchone()
    if row is None:
        raise SchemaMissing("unilog_producer is empty: run `unilog migrate` again")
    return ProducerIdentity(producer_id=row[0], epoch=row[1])


_CURRENT_IDENTITY = """
    SELECT (SELECT system_identifier FROM pg_control_system()),
           (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def resolve_identity(conn: psycopg.Connection[Any]) -> tuple[ProducerIdentity, bool]:
    """This database's producer identity, starting a new epoch if the database was restored or copied.

    A restore into another cluster (its transaction ids restart lower) or a copy into another database changes
    the cluster's system identifier or the database's oid. Then, in one transaction: the epoch is incremented (so
    positions restart at 1 in an epoch consumers have not seen, instead of colliding with old ones) and staged rows
    whose ``xid`` lies in this cluster's future get xid 1: they predate every transaction of this cluster (WAL
    mode's ``from_xid`` and table mode's look-up of rows of open transactions compare xids).
    Returns (identity, whether a new epoch began). Commits.
    """
    with conn.transaction():
        row = conn.execute(
            "SELECT producer_id, epoch, system_identifier, database_oid FROM unilog_producer FOR UPDATE"
        ).fetchone()
        if row is None:
            raise SchemaMissing("unilog_producer is empty: run `unilog migrate` again")
        current = conn.execute(_CURRENT_IDENTITY).fetchone()
        assert current is not None
        if (row[2], row[3]) == tuple(current):
            return ProducerIdentity(row[0], row[1]), False
        conn.execute(
            "UPDATE unilog_producer SET epoch = epoch + 1, system_identifier = %s, database_oid = %s", tuple(current)
        )
        conn.execute(
            "UPDATE staged_log_records SET xid = '1'::xid8 WHERE xid >= pg_snapshot_xmax(pg_current_snapshot())"
        )
        return ProducerIdentity(row[0], row[1] + 1), True


def adopt_identity(conn: psycopg.Connection[Any], producer_id: str) -> None:
    """Make a copied database a distinct producer in epoch 1 (test databases cloned from a template). Commits."""
    with conn.transaction():
        conn.execute(
            "UPDATE unilog_producer SET producer_id = %s, epoch = 1, "
            f"(system_identifier, database_oid) = ({_CURRENT_IDENTITY})",
            (producer_id,),
        )


def set_producer_id(conn: psycopg.Connection[Any], producer_id: str) -> None:
    """Name this database's producer (``unilog migrate --producer-id``), in the caller's transaction."""
    conn.execute("UPDATE unilog_producer SET producer_id = %s", (producer_id,))


def last_published_seq(conn: psycopg.Connection[Any], stream: str, epoch: int) -> int:
    """The last sequence number published on ``stream`` in ``epoch`` (0 if none)."""
    row = conn.execute("SELECT epoch, last_seq FROM unilog_stream_positions WHERE stream = %s", (stream,)).fetchone()
    if row is None or row[0] != epoch:
        return 0
    return int(row[1])


def last_published_seqs(conn: psycopg.Connection[Any], streams: list[str], epoch: int) -> dict[str, int]:
    """:func:`last_published_seq` of each of ``streams``, in one statement."""
    rows = conn.execute(
        "SELECT stream, epoch, last_seq FROM unilog_stream_positions WHERE stream = ANY(string_to_array(%s, ' '))",
        (" ".join(streams),),
    ).fetchall()
    found = {r[0]: int(r[2]) for r in rows if r[1] == epoch}
    return {stream: found.get(stream, 0) for stream in streams}


def save_positions(conn: psycopg.Connection[Any], epoch: int, last_seqs: dict[str, int]) -> None:
    """Record each target stream's last published position (in the caller's transaction, with the delete of the
    rows it published: both modes)."""
    if not last_seqs:
        return
    # one statement for a batch of thousands of streams, rows locked in name order; the lists go as one string each
    # (a stream name holds no space: unilog.config.validate_stream_name), not as arrays of thousands of elements
    streams = sorted(last_seqs)
    conn.execute(
        """
        INSERT INTO unilog_stream_positions (stream, epoch, last_seq)
        SELECT s, %s, q::bigint FROM unnest(string_to_array(%s, ' '), string_to_array(%s, ' ')) AS t(s, q)
        ON CONFLICT (stream) DO UPDATE SET epoch = excluded.epoch, last_seq = excluded.last_seq, updated_at = now()
        """,
        (epoch, " ".join(streams), " ".join(str(last_seqs[s]) for s in streams)),
    )
