"""Checking a Redis server before work: it answers, takes the credentials, is not loading and is recent enough.
Both faces check alike (the refusals' words are those of :mod:`unilog.engine._async.connection`)."""

from __future__ import annotations

import redis

from ..base import AsyncClient
from ..commands import issues
from .connection import ping_refusal, version_refusal


@issues("info", "ping")
async def ping(client: AsyncClient, url: str) -> str:
    """Check the server answers, accepts the credentials and is recent enough; return its version.

    Raises :class:`ServerUnreachable` (not running, still loading its data), :class:`RedisAuthFailed` or
    :class:`UnsupportedServer` (older than 6.2), each naming the server (password redacted) and the fix.
    """
    try:
        try:
            version = str((await client.info("server")).get("redis_version", "?"))
            # INFO answers while loading; streams don't
            loading = bool((await client.info("persistence")).get("loading"))
        except redis.exceptions.NoPermissionError:  # an ACL user without INFO: a PING still shows it answers
            await client.ping()
            return "?"
        if loading:
            raise redis.BusyLoadingError("loading")
    except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, OSError) as exc:
        raise ping_refusal(exc, url) from None
    if (too_old := version_refusal(version, url)) is not None:
        try:
            raise too_old
        finally:
            del too_old  # it holds the error, whose traceback holds this frame: a cycle
    return version
