"""The consumer-group worker for asyncio code: ``async def handler(conn, records)`` on a psycopg ``AsyncConnection``.

:class:`~unilog.GroupConsumer`'s contract, pass for pass, because both faces are one source
(:mod:`unilog.consume._async.group`; the threaded one is generated from it). ``unilog consume --group`` runs it for
an ``async def`` handler.
"""

from __future__ import annotations

from ._async.group import AsyncGroupConsumer

__all__ = ["AsyncGroupConsumer"]
