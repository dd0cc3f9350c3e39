"""Least-privilege Redis ACL users: the commands and key patterns each kind of unilog process needs.

:func:`acl_lines` renders them as ``ACL SETUSER`` lines for the configured streams (``unilog acl`` prints them).
Each user starts from nothing (``reset``) and gets only its commands, on its streams' keys: the stream itself, its
partitions (``<stream>.p*``), its dead letters and unilog's bookkeeping keys for it. No user gets ``KEYS``,
``FLUSH*``, ``CONFIG`` or any other administrative command.
"""

from __future__ import annotations

from collections.abc import Sequence

from .wire import attempts_key, dlq_key, hwm_key, meta_key, registry_key, workers_key

# Every process: connection checks (INFO: version and loading; PING: health checks; TYPE and EXISTS: one-line errors
# about keys of another type and missing streams), and MULTI/EXEC for the pipelines that must be atomic.
_COMMON = ["ping", "info", "type", "exists", "multi", "exec"]
COMMANDS: dict[str, list[str]] = {
    # the publish script (EVALSHA; SCRIPT LOAD when Redis forgot it), WAIT for replicas, retention
    # (the script itself runs XADD, HGET and HSET on the stream's high-water mark, as the calling user)
    "streamer": [
        *_COMMON,
        "evalsha",
        "script|load",
        "xadd",
        "hset",
        "scan",  # the check for keys in the layout before hash tags
        "wait",
        "xtrim",
        "xinfo|stream",
        "xinfo|groups",
        "xpending",
        "hgetall",
        "hget",
        "xrevrange",
    ],
    # reads after the checkpoint, retention registration, dead letters, the partitioned workers' heartbeats
    "consumer": [
        *_COMMON,
        "xread",
        "xrange",
        "xrevrange",
        "xinfo|stream",
        "xlen",
        "hset",
        "hget",
        "xadd",
        "scan",
        "zadd",
        "zrem",
        "zremrangebyscore",
        "zcard",
    ],
    # consumer groups: deliveries, claims, acknowledgements, attempt counts, dead letters
    "group": [
        *_COMMON,
        "xreadgroup",
        "xack",
        "xautoclaim",
        "xclaim",
        "xgroup|create",
        "xpending",
        "xinfo|groups",
        "xinfo|stream",
        "xrange",
        "hincrby",
        "hdel",
        "hget",
        "xadd",
        "xlen",
        "scan",
    ],
    # status, dead letters (list, replay, drop), registrations, partitioning, resets
    "operator": [
        *_COMMON,
        "xrange",
        "xrevrange",
        "xlen",
        "xinfo|stream",
        "xinfo|groups",
        "xpending",
        "xadd",
        "xdel",
        "hgetall",
        "hget",
        "hset",
        "hsetnx",
        "hdel",
        "scan",
        "xgroup|create",
        "xgroup|destroy",
        "renamenx",  # unilog stream relayout
        "xgroup|setid",
    ],
}
KINDS = tuple(COMMANDS)


def key_patterns(stream: str) -> list[str]:
    """The key patterns of ``stream``: itself, its partitions, its dead letters and unilog's keys for them."""
    streams = [stream, f"{stream}.p*"]
    keys = [*streams, *(dlq_key(s) for s in streams)]
    for s in streams:
        keys += [hwm_key(s), meta_key(s), registry_key(s), attempts_key(s, "*"), workers_key(s, "*")]
    return keys


def acl_line(kind: str, user: str, streams: Sequence[str], password: str = "<password>") -> str:
    """One ``ACL SETUSER`` line: ``user`` may run ``kind``'s commands on ``streams``' keys, with ``password``."""
    patterns = [f"~{key}" for stream in streams for key in key_patterns(stream)]
    commands = [f"+{command}" for command in COMMANDS[kind]]
    return " ".join(["ACL SETUSER", user, "reset", "on", f">{password}", "resetchannels", *patterns, *commands])


def acl_lines(users: dict[str, str], streams: Sequence[str], password: str = "<password>") -> list[str]:
    """The ``ACL SETUSER`` lines for ``users`` (kind -> user name)."""
    return [acl_line(kind, user, streams, password) for kind, user in users.items()]
