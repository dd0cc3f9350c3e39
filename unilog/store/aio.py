"""The asyncio face of the store: the statements the consumers run, on a psycopg ``AsyncConnection``.

The SQL is the store's own (imported, not rewritten), so the asyncio workers read and save the same rows the same
way; like those functions, these never commit: the caller's transaction holds its effects too. The names and
signatures are those of :mod:`unilog.store` (with ``await``), because the workers' sync face is generated from
their asyncio source by naming :mod:`unilog.store` where the source names this module (``tools/faces.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg

from . import groups
from .checkpoints import (
    HOLD_LETTER,
    INSERT_CHECKPOINT,
    SAVE_CHECKPOINT,
    SELECT_CHECKPOINT,
    TAKE_HELD,
    Checkpoint,
    checkpoint_from_row,
    save_params,
)
from .connection import (
    HAS_VERSION_TABLE,
    VERSION_TABLE,
    VERSIONS,
    connect_options,
    schema_verdict,
    standby_refusal,
    unreachable,
    version_refusal,
)
from .locks import PARTITION_LOCK, PARTITION_UNLOCK


async def connect_async(
    conninfo: str, *, autocommit: bool = False, application_name: str = "unilog", timeout: float | None = None
) -> psycopg.AsyncConnection[Any]:
    """:func:`unilog.store.connect` for asyncio: the same keepalives and refusals (:class:`ServerUnreachable`
    naming the server, password redacted; a server older than unilog supports)."""
    try:
        conn = await psycopg.AsyncConnection.connect(
            conninfo, autocommit=autocommit, **connect_options(application_name, timeout)
        )
    except psycopg.OperationalError as exc:
        raise unreachable(conninfo, exc) from None
    if (refused := version_refusal(conn, conninfo) or standby_refusal(conn, conninfo)) is not None:
        await conn.close()
        raise refused
    return conn


@contextlib.asynccontextmanager
async def deadline(_conn: psycopg.AsyncConnection[Any], seconds: float | None) -> AsyncIterator[None]:
    """The block is cancelled after ``seconds`` (``TimeoutError``, retried as a connection failure): the asyncio
    face of :func:`unilog.store.deadline`."""
    if not seconds:
        yield
        return
    async with asyncio.timeout(seconds):
        yield


async def check_schema(conn: psycopg.AsyncConnection[Any]) -> None:
    """See :func:`unilog.store.check_schema`."""
    row = await (await conn.execute(HAS_VERSION_TABLE, (VERSION_TABLE,))).fetchone()
    versions = {r[0] for r in await (await conn.execute(VERSIONS)).fetchall()} if row and row[0] else None
    schema_verdict(versions)


async def read_checkpoint(conn: psycopg.AsyncConnection[Any], name: str, *, lock: bool = False) -> Checkpoint | None:
    """Consumer ``name``'s checkpoint; with ``lock``, row-locked in the caller's transaction (copies serialize)."""
    cursor = await conn.execute(SELECT_CHECKPOINT + (" FOR UPDATE" if lock else ""), (name,))
    row = await cursor.fetchone()
    return None if row is None else checkpoint_from_row(name, row)


async def ensure_checkpoint(conn: psycopg.AsyncConnection[Any], name: str, stream: str) -> Checkpoint:
    """See :func:`unilog.store.ensure_checkpoint`."""
    await conn.execute(INSERT_CHECKPOINT, (name, stream))
    checkpoint = await read_checkpoint(conn, name)
    assert checkpoint is not None
    return checkpoint


async def lock_checkpoint(conn: psycopg.AsyncConnection[Any], name: str) -> Checkpoint | None:
    """See :func:`unilog.store.lock_checkpoint`."""
    return await read_checkpoint(conn, name, lock=True)


async def save_checkpoint(conn: psycopg.AsyncConnection[Any], checkpoint: Checkpoint) -> None:
    """Write the checkpoint in the caller's transaction."""
    await conn.execute(SAVE_CHECKPOINT, save_params(checkpoint))


async def hold_letter(conn: psycopg.AsyncConnection[Any], consumer: str, stream: str, origin_id: str) -> None:
    """See :func:`unilog.store.hold_letter`."""
    await conn.execute(HOLD_LETTER, (consumer, origin_id, stream))


async def take_held(conn: psycopg.AsyncConnection[Any], consumer: str, origin_ids: list[str]) -> set[str]:
    """See :func:`unilog.store.take_held`."""
    cursor = await conn.execute(TAKE_HELD, (consumer, origin_ids))
    return {row[0] for row in await cursor.fetchall()}


# -- consumer groups (the statements of ``store.groups``) ------------------------------------------------------------


async def group_watermarks(conn: psycopg.AsyncConnection[Any], group: str, stream: str) -> dict[tuple[str, int], int]:
    """See :func:`unilog.store.group_watermarks`."""
    cursor = await conn.execute(groups.WATERMARKS, (group, stream))
    return groups.watermarks_from_rows(await cursor.fetchall())


async def claim_identities(
    conn: psycopg.AsyncConnection[Any], group: str, stream: str, identities: list[groups.Identity]
) -> set[groups.Identity]:
    """See :func:`unilog.store.claim_identities`."""
    if not identities:
        return set()
    cursor = await conn.execute(groups.CLAIM, groups.claim_params(group, stream, identities))
    return groups.claimed_from_row(await cursor.fetchone(), identities)


async def try_prune_lock(conn: psycopg.AsyncConnection[Any], group: str, stream: str) -> bool:
    """See :func:`unilog.store.try_prune_lock`."""
    row = await (await conn.execute(groups.PRUNE_LOCK, (group, stream))).fetchone()
    return bool(row and row[0])


async def advance_watermarks(conn: psycopg.AsyncConnection[Any], group: str, stream: str) -> int:
    """See :func:`unilog.store.advance_watermarks`."""
    await conn.execute(groups.ADVANCE, {"g": group, "s": stream})
    return (await conn.execute(groups.PRUNE, {"g": group, "s": stream})).rowcount


async def try_partition_lock(conn: psycopg.AsyncConnection[Any], key: str) -> bool:
    """See :func:`unilog.store.try_partition_lock`."""
    row = await (await conn.execute(PARTITION_LOCK, (key,))).fetchone()
    return bool(row and row[0])


async def release_partition_lock(conn: psycopg.AsyncConnection[Any], key: str) -> None:
    """See :func:`unilog.store.release_partition_lock`."""
    await conn.execute(PARTITION_UNLOCK, (key,))
