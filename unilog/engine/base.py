"""What both faces of the Redis adapter share that is not code to generate: the types of an entry, of fields, of a
write that waited for replicas and of the clients each face holds.

The adapter's base class is generated like the methods both faces have: :class:`~unilog.engine._sync.base.Adapter`
(the client, ``explained``, ``close``) from :class:`~unilog.engine._async.base.AsyncAdapter` (see
:mod:`unilog.engine._async`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, TypeAlias

import redis
from redis import asyncio as aredis

Fields = Mapping[str, Any]
Entry = tuple[bytes, dict[bytes, bytes]]

# The client each face holds (a cluster client, redis-py's other class, is used alike: the adapter sends the same
# commands on it); the generated code names ``Client`` where its asyncio source names ``AsyncClient``.
Client: TypeAlias = redis.Redis
AsyncClient: TypeAlias = aredis.Redis


class Written(NamedTuple):
    """A write that may have waited for replicas (``WAIT`` on its own connection): the id it made, how many replicas
    acknowledged it and how many were wanted (0: it did not wait)."""

    id: str
    replicas: int = 0
    wanted: int = 0

    @property
    def confirmed(self) -> bool:
        """Whether enough replicas acknowledged it: a failover now keeps it."""
        return self.replicas >= self.wanted
