"""The connection of the node that serves a key, for writes that ``WAIT`` for replicas.

``WAIT n timeout`` counts the replicas that acknowledged every write *its own connection* sent before it: sent on
another connection (redis-py's pool hands out any) it counts nothing of those writes, and a cluster client sends a
keyless ``WAIT`` to every primary. So a write that must be replicated before unilog moves on is sent with its
``WAIT`` on one connection, taken from the pool of the node that owns the key's slot (the one pool of a single
Redis): :func:`node_connection` for the threaded client, :func:`async_node_connection` for the asyncio one (the
generated threaded face of ``unilog/engine/_async/`` names the first where its source names the second).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import redis
from redis import asyncio as aredis


def clustered(client: Any) -> bool:
    """Whether ``client`` is a cluster client (a ``redis+cluster://`` URL), of either face."""
    return isinstance(client, (redis.RedisCluster, aredis.RedisCluster))


def replicas_wanted(client: Any, wait_replicas: int | None) -> int:
    """The replicas a write must reach: ``wait_replicas``, or when it is None, 1 on a cluster (whose primaries have
    replicas to fail over to) and 0 on a single Redis."""
    if wait_replicas is None:
        return 1 if clustered(client) else 0
    return wait_replicas


def node_pool(client: Any, key: str) -> Any:
    """The threaded client's connection pool of the node that serves ``key`` (the one pool of a single Redis)."""
    if isinstance(client, redis.RedisCluster):
        return client.get_redis_connection(client.get_node_from_key(key)).connection_pool
    return client.connection_pool


@contextlib.contextmanager
def node_connection(client: Any, key: str) -> Iterator[Any]:
    """One connection of the node that serves ``key`` (threaded client); a connection whose exchange failed part
    way is closed, never reused (its replies are out of step)."""
    pool = node_pool(client, key)
    conn = pool.get_connection()
    try:
        yield conn
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


@contextlib.asynccontextmanager
async def async_node_connection(client: Any, key: str) -> AsyncIterator[Any]:
    """:func:`node_connection` for redis-py's asyncio client (a cluster node lends its connections itself)."""
    if isinstance(client, aredis.RedisCluster):
        node = client.get_node_from_key(key)
        if node is None:  # no node owns the slot now (a failover under way): retried as a connection failure
            raise redis.ConnectionError(f"no Redis Cluster node serves {key!r}")
        conn = node.acquire_connection()
        try:
            yield conn
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            node.release(conn)
        return
    pool = client.connection_pool
    conn = await pool.get_connection()
    try:
        yield conn
    except BaseException:
        await conn.disconnect()
        raise
    finally:
        await pool.release(conn)
