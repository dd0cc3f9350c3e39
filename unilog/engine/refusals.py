"""Telling Redis's refusals apart: what a retry fixes (a lost connection, ``LOADING``, ``OOM``:
:func:`hint` says what to do) from what it cannot (a replica, an ACL refusal: :func:`fatal` gives the one line).

Part of the Redis adapter (``unilog.engine``): the library reaches these through ``engine.fatal`` and friends;
connecting is :mod:`unilog.engine.connection`'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import redis

from ..errors import (
    ConfigurationError,
    RedisPermissionDenied,
    RedisReadOnly,
    WrongKeyType,
)
from ..wire import hwm_key

# Failures no retry can fix: a replica where the primary should be, an ACL refusal. Workers stop with :func:`fatal`'s
# line instead of retrying them as they retry a lost connection.
FATAL: tuple[type[Exception], ...] = (redis.ReadOnlyError, redis.exceptions.NoPermissionError)


def fatal(exc: BaseException) -> ConfigurationError | None:
    """The one-line error for a Redis failure no retry can fix (see :data:`FATAL`), or None."""
    if isinstance(exc, redis.ReadOnlyError):
        return read_only(str(exc))
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return no_permission(str(exc))
    return None


# where a refusal inside a script says it came from: Redis 6.2's "Error running script (call to f_...): @user_script:1:
# @user_script: 1: ...", 7's "... script: on @user_script:1." (the script's internals, not the user's business)
_SCRIPT_CONTEXT = re.compile(
    r"Error running script \(call to f_[0-9a-f]+\): |@user_script: ?\d+: | script: on @user_script:\d+\."
)


def no_permission(detail: str, stream: str | None = None) -> RedisPermissionDenied:
    """The one line for ``NOPERM``: what Redis refused (the command, or a key), and where the right ACL comes from."""
    detail = detail.strip().splitlines()[0] if detail.strip() else "permission denied"
    detail = _SCRIPT_CONTEXT.sub("", detail).removeprefix("NOPERM ").removeprefix("-NOPERM ")
    where = f" on {stream!r}" if stream else ""
    return RedisPermissionDenied(
        f"Redis refused (NOPERM){where}: {detail}. The Redis user in REDIS_URL lacks a permission this process needs: "
        "`unilog acl --streams ...` prints the ACL SETUSER line of each kind of process"
    )


def read_only(detail: str) -> RedisReadOnly:
    return RedisReadOnly(
        f"the Redis server refuses writes, it is a read-only replica ({detail.strip()}): point REDIS_URL at the "
        "primary (after a failover, the new one)"
    )


def out_of_memory(exc: BaseException) -> bool:
    """Whether Redis refused for want of memory (``-OOM``, also when a script quotes it)."""
    return isinstance(exc, redis.exceptions.OutOfMemoryError) or "OOM command not allowed" in str(exc)


def hint(exc: BaseException) -> str | None:
    """What an operator should know about a Redis failure that unilog retries, or None."""
    if isinstance(exc, redis.BusyLoadingError):
        return "Redis is loading its data set after a restart; unilog retries until it answers"
    if isinstance(exc, redis.exceptions.OutOfMemoryError) or "-OOM " in str(exc):  # a script quotes it
        return (
            "Redis reached maxmemory: records stay staged in Postgres until it accepts writes; raise maxmemory, or "
            "find the consumer that holds retention back (unilog status)"
        )
    if isinstance(exc, redis.AuthenticationError):
        return "Redis refused the credentials: fix the user and password in REDIS_URL"
    return None


def type_checked(stream: str) -> tuple[str, str]:
    """The keys whose types a ``WRONGTYPE`` refusal on ``stream`` is explained by."""
    return stream, hwm_key(stream)


def batch_refusal(exc: BaseException) -> Exception | None:
    """:func:`refusal` of a batch across streams (no one stream to name, no key types read), or None: a replica's
    ``READONLY`` or an ACL refusal, quoted by a script as a plain error, is the one line a single stream's gets; a
    refusal the adapter already made one line (of the stream a script call stopped at) is that line."""
    if isinstance(exc, ConfigurationError):
        return exc
    return refusal(exc, "", {}) if isinstance(exc, redis.ResponseError) else None


def refusal(exc: redis.ResponseError, stream: str, kinds: Mapping[str, str]) -> Exception | None:
    """The one-line error for a refusal no retry can fix, or None: ``kinds`` are the types of the keys of
    :func:`type_checked` (read by the caller, sync or asyncio, only for a ``WRONGTYPE`` refusal)."""
    text = str(exc)
    for key, wanted in zip(type_checked(stream), ("stream", "hash"), strict=True):
        kind = kinds.get(key, "none")
        if kind not in (wanted, "none"):
            return WrongKeyType(
                f"the Redis key {key!r} holds a {kind}, not a {wanted}: another application uses that "
                "name; use another stream name (UNILOG_STREAM, emit(stream=...)) or remove that key"
            )
    if "READONLY" in text:  # inside a script (Redis 6.2) the reply is a plain error quoting it
        return read_only(text.rpartition("-")[2] or text)
    if isinstance(exc, redis.ReadOnlyError):  # Redis 7 names it inside a script too (redis-py drops the word)
        return read_only(text)
    # an ACL refusal inside the publish script: Redis 6.2's words, then 7's
    script_refused = "user executing the script can't" in text or "ACL failure in script" in text
    if "NOPERM" in text or script_refused or isinstance(exc, redis.exceptions.NoPermissionError):
        return no_permission(text, stream)
    return None
