"""The connection of the node that serves a key, for a write sent with its ``WAIT`` (see :mod:`unilog.engine.nodes`:
another connection's ``WAIT`` would count none of that write)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from ..nodes import anode_pool


@contextlib.asynccontextmanager
async def async_node_connection(client: Any, key: str) -> AsyncIterator[Any]:
    """One connection of the node that serves ``key`` (the one pool of a single Redis); a connection whose exchange
    failed part way is closed, never reused (its replies are out of step)."""
    pool = anode_pool(client, key)
    conn = await pool.get_connection()
    try:
        yield conn
    except BaseException:
        await conn.disconnect()
        raise
    finally:
        await pool.release(conn)
