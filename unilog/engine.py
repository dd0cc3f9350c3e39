"""The stream engine adapter: every Redis command unilog sends lives here.

The client is configured deliberately: redis-py's default retries a command that timed out, and a retried ``XADD``
whose first attempt did reach Redis appends the entry twice. unilog turns those retries off and retries whole
batches itself, where the outcome is known and deduplicated by position.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .config import redact_url
from .errors import ServerUnreachable

Fields = Mapping[str, Any]
Entry = tuple[bytes, dict[bytes, bytes]]


def connect(url: str, *, socket_timeout: float | None = 10.0) -> redis.Redis:
    """A redis-py client with retries off (see the module docstring) and bytes responses (decoded lazily)."""
    return redis.Redis.from_url(
        url,
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
        socket_timeout=socket_timeout,
        socket_connect_timeout=10.0,
        health_check_interval=30,
        decode_responses=False,
    )


def ping(client: redis.Redis, url: str) -> str:
    """Check the server answers and return its version; raise :class:`ServerUnreachable` if it does not."""
    try:
        info = client.info("server")
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        raise ServerUnreachable(
            f"cannot connect to Redis at {redact_url(url)}: {exc} (is the server running and REDIS_URL right?)"
        ) from None
    return str(info.get("redis_version", "?"))


@dataclass(frozen=True)
class StreamInfo:
    """A stream's length and the ids of its first and last entries (None when empty or missing)."""

    length: int
    first_id: str | None
    last_id: str | None


class RedisStreams:
    """Publishing to and reading from Redis Streams."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def publish(self, stream: str, entries: Sequence[Fields]) -> list[bytes]:
        """Append ``entries`` to ``stream`` with one pipelined round trip; return their ids in order.

        Raises a redis error if any ``XADD`` failed: entries before the failure may have been appended (Redis has
        no rollback), which is why every entry carries a position that consumers deduplicate on.
        """
        pipe = self.client.pipeline(transaction=False)
        for fields in entries:
            pipe.xadd(stream, fields)  # type: ignore[arg-type]
        return list(pipe.execute(raise_on_error=True))

    def read(self, stream: str, after_id: str, count: int, block_ms: int | None) -> list[Entry]:
        """Up to ``count`` entries after ``after_id``, waiting up to ``block_ms`` if there are none yet."""
        reply: Any = self.client.xread({stream: after_id}, count=count, block=block_ms)
        if not reply:
            return []
        return list(reply[0][1])

    def info(self, stream: str) -> StreamInfo:
        """Length and first/last ids of ``stream``; an absent stream has length 0."""
        pipe = self.client.pipeline(transaction=False)
        pipe.xlen(stream)
        pipe.xrange(stream, count=1)
        pipe.xrevrange(stream, count=1)
        length, first, last = pipe.execute()
        return StreamInfo(
            length=int(length),
            first_id=first[0][0].decode() if first else None,
            last_id=last[0][0].decode() if last else None,
        )

    def entries_after(self, stream: str, after_id: str) -> int:
        """How many entries follow ``after_id`` (a consumer's lag in entries); linear in the lag."""
        total = 0
        start = "(" + after_id
        while True:
            chunk: Any = self.client.xrange(stream, min=start, count=10_000)
            total += len(chunk)
            if len(chunk) < 10_000:
                return total
            start = "(" + chunk[-1][0].decode()

    def close(self) -> None:
        self.client.close()


def to_str(value: Any) -> str:
    """Decode a Redis reply value (bytes) to ``str``."""
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)
