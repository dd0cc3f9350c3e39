"""Session-level advisory locks: which streamer publishes a stream, which worker owns a partition.

They are released when the session ends, including when its process is killed, so a standby takes over as soon as
Postgres notices the dead connection.
"""

from __future__ import annotations

from typing import Any

import psycopg


def try_stream_lock(conn: psycopg.Connection[Any], stream: str) -> bool:
    """Take the session-level advisory lock that makes one streamer the publisher of ``stream``.

    The lock is released when the session ends, including when its process is killed, so a standby
    streamer takes over as soon as Postgres notices the dead connection.
    """
    row = conn.execute("SELECT pg_try_advisory_lock(hashtextextended('unilog.stream:' || %s, 0))", (stream,)).fetchone()
    return bool(row and row[0])


PARTITION_LOCK = "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))"
PARTITION_UNLOCK = "SELECT pg_advisory_unlock(hashtextextended(%s, 0))"


def try_partition_lock(conn: psycopg.Connection[Any], key: str) -> bool:
    """Take the session-level lock on partition ``key`` (its owner's session holds it); False if another has it."""
    row = conn.execute(PARTITION_LOCK, (key,)).fetchone()
    return bool(row and row[0])


def release_partition_lock(conn: psycopg.Connection[Any], key: str) -> None:
    """Give partition ``key`` back (the lock taken by :func:`try_partition_lock` on this session)."""
    conn.execute(PARTITION_UNLOCK, (key,))


def stream_lock_holders(conn: psycopg.Connection[Any], stream: str) -> int:
    """How many sessions hold ``stream``'s publishing lock (1 when a streamer publishes it, 0 when none does)."""
    row = conn.execute(
        """
        SELECT count(*) FROM pg_locks
        WHERE locktype = 'advisory' AND granted AND objsubid = 1
          AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND ((classid::bigint << 32) | objid::bigint) = hashtextextended('unilog.stream:' || %s, 0)
        """,
        (stream,),
    ).fetchone()
    return int(row[0]) if row else 0
