# Generated from unilog/engine/_async/base.py by tools/faces.py: do not edit.
"""What every concern of the Redis adapter holds: the client it sends its commands on, refusals turned into one-line
errors, and closing the client.

One source, two faces: written once for redis-py's asyncio client under ``_async/``, and generated for its threaded
one under ``_sync/`` (see :mod:`unilog.engine`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import redis

from ...wire import to_str
from ..base import Client
from ..commands import issues
from ..refusals import refusal, type_checked
from .nodes import node_connection


class Adapter:
    """A concern of the adapter (publishing, reading, groups, ...) over one client: every concern of a face is one
    class over the same client (:class:`~unilog.engine.RedisStreams`, :class:`~unilog.engine.aio.RedisStreams`).
    """

    def __init__(self, client: Client) -> None:
        self.client = client

    @issues("type")  # only after a WRONGTYPE refusal: the types of the keys that explain it
    @contextlib.contextmanager
    def explained(self, stream: str) -> Iterator[None]:
        """Turn refusals no retry can fix into one-line errors naming the key and the fix: a key of another type at
        the stream's name (or its bookkeeping's), a Redis user without the permission (see
        :func:`~unilog.engine.refusals.refusal`)."""
        try:
            yield
        except redis.ResponseError as exc:
            kinds = {}
            if "WRONGTYPE" in str(exc):
                kinds = {k: to_str(self.client.type(k)) for k in type_checked(stream)}
            raise refusal(exc, stream, kinds) or exc from None

    @issues("wait")
    def _confirmed(
        self, key: str, commands: Sequence[Sequence[Any]], replicas: int, timeout_ms: int
    ) -> tuple[list[Any], int]:
        """Send ``commands`` to the node that serves ``key``, then ``WAIT replicas timeout_ms``, all on one of its
        connections (see :mod:`unilog.engine.nodes`: another connection's ``WAIT`` would count none of these
        writes); return the commands' replies and how many replicas acknowledged them. A refused command raises its
        ``ResponseError`` once every reply was read (the connection stays in step)."""
        with node_connection(self.client, key) as conn:
            conn.send_packed_command(conn.pack_commands([*commands, ("WAIT", replicas, timeout_ms)]))
            replies = [_reply(conn) for _ in commands]
            acknowledged = int(conn.read_response())
        for reply in replies:
            if isinstance(reply, redis.ResponseError):
                try:
                    raise reply
                finally:
                    del reply, replies  # each holds the error, whose traceback holds this frame: a cycle
        return replies, acknowledged

    @issues()
    def close(self) -> None:
        """Close the client (its connections)."""
        self.client.close()


def _reply(conn: Any) -> Any:
    """The next reply on ``conn``; a refusal is returned, not raised, so the replies after it are read too."""
    try:
        return conn.read_response()
    except redis.ResponseError as exc:
        return exc
