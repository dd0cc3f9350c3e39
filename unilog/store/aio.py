"""The asyncio face of the store: the statements the consumers run, on a psycopg ``AsyncConnection``.

They are written once, as this asyncio code (:mod:`unilog.store._async`), and the threaded face that
:mod:`unilog.store` names is generated from it by ``tools/faces.py`` (which names :mod:`unilog.store` where a source
names this module); like those functions, these never commit: the caller's transaction holds their effects too. Only
:func:`deadline` is written per face: a timeout of the event loop here, a watchdog thread there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg

from ._async.checkpoints import (
    ensure_checkpoint,
    ensure_checkpoints,
    hold_letter,
    lock_checkpoint,
    read_checkpoint,
    read_checkpoints,
    save_checkpoint,
    save_checkpoints,
    single_row_moved,
    take_held,
)
from ._async.connection import check_schema, connect_async
from ._async.groups import (
    advance_watermarks,
    claim_identities,
    claim_identities_many,
    group_watermarks,
    group_watermarks_many,
    prune_watermarks,
    read_committed,
    try_prune_lock,
)
from ._async.locks import release_partition_lock, try_partition_lock
from .rows import Checkpoint


@contextlib.asynccontextmanager
async def deadline(_conn: psycopg.AsyncConnection[Any], seconds: float | None) -> AsyncIterator[None]:
    """The block is cancelled after ``seconds`` (``TimeoutError``, retried as a connection failure): the asyncio
    face of :func:`unilog.store.deadline`."""
    if not seconds:
        yield
        return
    async with asyncio.timeout(seconds):
        yield


__all__ = [
    "Checkpoint",
    "advance_watermarks",
    "check_schema",
    "claim_identities",
    "claim_identities_many",
    "connect_async",
    "deadline",
    "ensure_checkpoint",
    "ensure_checkpoints",
    "group_watermarks",
    "group_watermarks_many",
    "hold_letter",
    "lock_checkpoint",
    "prune_watermarks",
    "read_checkpoint",
    "read_checkpoints",
    "read_committed",
    "release_partition_lock",
    "save_checkpoint",
    "save_checkpoints",
    "single_row_moved",
    "take_held",
    "try_partition_lock",
    "try_prune_lock",
]
