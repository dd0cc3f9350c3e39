"""The asyncio face of the Redis adapter (:class:`unilog.AsyncConsumer`, :class:`unilog.AsyncGroupConsumer`), on
redis-py's asyncio client.

:class:`AsyncRedisStreams` is the asyncio source of every method both faces have (``unilog/engine/_async/``: reads
after a checkpoint, registration, dead letters, group work), the very code the threaded
:class:`~unilog.engine.RedisStreams` is generated from, declarations (``@issues``) included, and so is connecting
(:mod:`unilog.engine._async.connection`): the client is configured as the threaded one is (redis-py's own retries
off: unilog retries whole passes, whose outcome it knows); a ``redis+cluster://`` URL gives redis-py's asyncio
cluster client.
"""

from __future__ import annotations

from ._async.connection import connect_async
from ._async.groups import AsyncGroupsCore
from ._async.letters import AsyncLettersCore
from ._async.partitions import AsyncPartitionsCore
from ._async.read import AsyncReadingCore
from ._async.retention import AsyncRetentionCore
from ._async.server import ping
from .base import Entry

__all__ = ["AsyncRedisStreams", "Entry", "connect_async", "ping"]


class AsyncRedisStreams(AsyncLettersCore, AsyncReadingCore, AsyncGroupsCore, AsyncRetentionCore, AsyncPartitionsCore):
    """What the asyncio consumers ask of Redis: every concern's methods that both faces have, over one client (close
    it with ``aclose()``). The same contracts, commands and declarations as the threaded methods of the same names,
    which are generated from these."""
