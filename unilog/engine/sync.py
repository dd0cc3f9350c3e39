"""The threaded face of the Redis adapter, under the module name that code generated from the asyncio workers
imports (``from ...engine.aio import AsyncRedisStreams`` becomes ``from ...engine.sync import RedisStreams``; see
:mod:`unilog.consume`)."""

from __future__ import annotations

from . import Entry, RedisStreams

__all__ = ["Entry", "RedisStreams"]
