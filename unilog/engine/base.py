"""What every concern of the Redis adapter shares: the client it holds, and refusals turned into one-line errors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import redis

from ..wire import to_str
from .commands import issues
from .refusals import refusal, type_checked

Fields = Mapping[str, Any]
Entry = tuple[bytes, dict[bytes, bytes]]


class Adapter:
    """A concern of the adapter (publishing, reading, groups, ...): the redis-py client it sends its commands on.
    :class:`~unilog.engine.RedisStreams` is all of them over one client."""

    def __init__(self, client: redis.Redis) -> None:
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
            kinds = {k: to_str(self.client.type(k)) for k in type_checked(stream)} if "WRONGTYPE" in str(exc) else {}
            raise refusal(exc, stream, kinds) or exc from None

    @issues()
    def close(self) -> None:
        self.client.close()
