"""The asyncio face of the Redis adapter (:class:`unilog.AsyncConsumer`, :class:`unilog.AsyncGroupConsumer`), on
redis-py's asyncio client.

:class:`AsyncRedisStreams` is the asyncio source of every method both faces have (``unilog/engine/_async/``: reads
after a checkpoint, registration, dead letters, group work), the very code the threaded
:class:`~unilog.engine.RedisStreams` is generated from, declarations (``@issues``) included; only connecting is
written here. The client is configured as the threaded one is (redis-py's own retries off: unilog retries whole
passes, whose outcome it knows); a ``redis+cluster://`` URL gives redis-py's asyncio cluster client.
"""

from __future__ import annotations

from typing import Any

from redis import asyncio as aredis
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ._async.groups import AsyncGroupsCore
from ._async.letters import AsyncLettersCore
from ._async.partitions import AsyncPartitionsCore
from ._async.read import AsyncReadingCore
from ._async.retention import AsyncRetentionCore
from ._async.server import ping
from .base import Entry
from .connection import CLUSTER_SCHEMES, QUIET, cluster_options

__all__ = ["AsyncRedisStreams", "Entry", "connect_async", "ping"]


def connect_async(url: str, *, socket_timeout: float | None = 10.0) -> Any:
    """An asyncio client for ``url`` (a single Redis, or a cluster by ``redis+cluster://``); connects lazily."""
    common: dict[str, Any] = {
        "retry": Retry(NoBackoff(), 0),
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": 10.0,
        "decode_responses": False,
        **QUIET,
    }
    if url.split("://", 1)[0].lower() in CLUSTER_SCHEMES:
        nodes, options = cluster_options(url)
        return aredis.RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in nodes], **common, **options)
    return aredis.Redis.from_url(url, retry_on_timeout=False, health_check_interval=30, **common)


class AsyncRedisStreams(AsyncLettersCore, AsyncReadingCore, AsyncGroupsCore, AsyncRetentionCore, AsyncPartitionsCore):
    """What the asyncio consumers ask of Redis: every concern's methods that both faces have, over one client (close
    it with ``aclose()``). The same contracts, commands and declarations as the threaded methods of the same names,
    which are generated from these."""
