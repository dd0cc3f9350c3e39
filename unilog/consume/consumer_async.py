"""The checkpoint consumer for asyncio code: ``async def handler(conn, records)`` on a psycopg ``AsyncConnection``.

The contract is :class:`~unilog.Consumer`'s, pass for pass, because both faces are one source
(:mod:`unilog.consume._async.checkpoint`; the threaded one is generated from it). It runs in any event loop:
``asyncio.create_task(consumer.run(stop))`` beside a web app's own tasks, or ``unilog consume module:async_handler``
(the command line sees the handler is a coroutine function).
"""

from __future__ import annotations

from ._async.checkpoint import AsyncConsumer
from .records import AsyncHandler

__all__ = ["AsyncConsumer", "AsyncHandler"]
