# Generated from unilog/engine/_async/nodes.py by tools/faces.py: do not edit.
"""The connection of the node that serves a key, for a write sent with its ``WAIT`` (see :mod:`unilog.engine.nodes`:
another connection's ``WAIT`` would count none of that write)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..nodes import node_pool


@contextlib.contextmanager
def node_connection(client: Any, key: str) -> Iterator[Any]:
    """One connection of the node that serves ``key`` (the one pool of a single Redis); a connection whose exchange
    failed part way is closed, never reused (its replies are out of step)."""
    pool = node_pool(client, key)
    conn = pool.get_connection()
    try:
        yield conn
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)
