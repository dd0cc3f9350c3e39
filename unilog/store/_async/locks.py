"""The partition locks both faces of a partition worker take: session-level advisory locks, released when the
session ends (its process killed included), so another worker takes the partition over as soon as Postgres notices
the dead connection (:mod:`unilog.store.locks` adds the streamers' locks, which only the threaded face takes)."""

from __future__ import annotations

from typing import Any

import psycopg

PARTITION_LOCK = "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))"
PARTITION_UNLOCK = "SELECT pg_advisory_unlock(hashtextextended(%s, 0))"


async def try_partition_lock(conn: psycopg.AsyncConnection[Any], key: str) -> bool:
    """Take the session-level lock on partition ``key`` (its owner's session holds it); False if another has it."""
    row = await (await conn.execute(PARTITION_LOCK, (key,))).fetchone()
    return bool(row and row[0])


async def release_partition_lock(conn: psycopg.AsyncConnection[Any], key: str) -> None:
    """Give partition ``key`` back (the lock taken by ``try_partition_lock`` on this session)."""
    await conn.execute(PARTITION_UNLOCK, (key,))
