"""The connection of the node that serves a key, for writes that ``WAIT`` for replicas.

``WAIT n timeout`` counts the replicas that acknowledged every write *its own connection* sent before it: sent on
another connection (redis-py's pool hands out any) it counts nothing of those writes, and a cluster client sends a
keyless ``WAIT`` to every primary. So a write that must be replicated before unilog moves on is sent with its
``WAIT`` on one connection, taken from the pool of the node that owns the key's slot (the one pool of a single
Redis): ``node_connection``, written once for both faces (:mod:`unilog.engine._async.nodes`), over the pair here
that tells the faces apart, :func:`node_pool` for the threaded client and :func:`anode_pool` for the asyncio one
(the generated threaded face names the first where its source names the second).
"""

from __future__ import annotations

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


class _NodeConnections:
    """An asyncio cluster node's connections, lent and taken back as a pool's are (the node lends them itself)."""

    def __init__(self, node: Any) -> None:
        self.node = node

    async def get_connection(self) -> Any:
        return self.node.acquire_connection()

    async def release(self, conn: Any) -> None:
        self.node.release(conn)


def anode_pool(client: Any, key: str) -> Any:
    """:func:`node_pool` for redis-py's asyncio client: its pool, or on a cluster the connections of the node that
    serves ``key``, lent as a pool lends them (with ``await``)."""
    if isinstance(client, aredis.RedisCluster):
        node = client.get_node_from_key(key)
        if node is None:  # no node owns the slot now (a failover under way): retried as a connection failure
            raise redis.ConnectionError(f"no Redis Cluster node serves {key!r}")
        return _NodeConnections(node)
    return client.connection_pool
