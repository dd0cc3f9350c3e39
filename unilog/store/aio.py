"""The checkpoint consumer's statements on a psycopg ``AsyncConnection``, for :class:`unilog.AsyncConsumer`.

The SQL is the checkpoints module's own (imported, not rewritten), so the asyncio consumer reads and saves the same
rows the same way; like those functions, these never commit: the caller's transaction holds its effects too.
"""

from __future__ import annotations

from typing import Any

import psycopg

from .checkpoints import (
    HOLD_LETTER,
    SAVE_CHECKPOINT,
    SELECT_CHECKPOINT,
    TAKE_HELD,
    Checkpoint,
    checkpoint_from_row,
    save_params,
)
from .connection import connect_options, unreachable


async def connect_async(
    conninfo: str, *, application_name: str = "unilog", timeout: float | None = None
) -> psycopg.AsyncConnection[Any]:
    """Open an asyncio connection with :func:`unilog.store.connect`'s keepalives; failures are
    :class:`ServerUnreachable` naming the server (password redacted)."""
    try:
        return await psycopg.AsyncConnection.connect(conninfo, **connect_options(application_name, timeout))
    except psycopg.OperationalError as exc:
        raise unreachable(conninfo, exc) from None


async def read_checkpoint(conn: psycopg.AsyncConnection[Any], name: str, *, lock: bool = False) -> Checkpoint | None:
    """Consumer ``name``'s checkpoint; with ``lock``, row-locked in the caller's transaction (copies serialize)."""
    cursor = await conn.execute(SELECT_CHECKPOINT + (" FOR UPDATE" if lock else ""), (name,))
    row = await cursor.fetchone()
    return None if row is None else checkpoint_from_row(name, row)


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
