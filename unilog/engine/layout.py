"""Moving a deployment's Redis keys to the hash-tagged layout (see :mod:`unilog.wire`): ``unilog stream relayout``.

Before the layout, a stream's bookkeeping keys were named ``unilog:hwm:<stream>``, ``<stream>:dlq`` and so on. Run
the relayout once, with the streamers and consumers stopped: each old key is renamed to its new name (``RENAME`` is
atomic per key), partitions included. A key whose new name already exists is left in place and reported: nothing
is overwritten. Until then a streamer refuses to publish a stream that still has old keys (:func:`legacy_keys`), so
retention can never trim behind a registration it cannot see.
"""

from __future__ import annotations

from typing import Any

import redis

from ..wire import legacy_keys as legacy_names
from ..wire import legacy_patterns, meta_key, to_str


def _partitions(client: Any, stream: str) -> int:
    for key in (meta_key(stream), f"unilog:meta:{stream}"):
        value = client.hget(key, "partitions")
        if value:
            return int(value)
    return 1


def _streams(client: Any, stream: str) -> list[str]:
    count = _partitions(client, stream)
    return [stream, *(f"{stream}.p{i}" for i in range(count))] if count > 1 else [stream]


def _moves(client: Any, stream: str) -> list[tuple[str, str]]:
    moves = [(old, new) for old, new in legacy_names(stream).items() if client.exists(old)]
    for pattern, (old_prefix, new_prefix) in legacy_patterns(stream).items():
        for key in client.scan_iter(match=pattern, count=1000):
            name = to_str(key)
            moves.append((name, new_prefix + name.removeprefix(old_prefix)))
    return moves


def legacy_keys(client: Any, stream: str) -> list[str]:
    """The keys of ``stream`` (and its partitions) still named in the old layout. A least-privilege user whose ACL
    (``unilog acl``) covers only the new names cannot see old ones, nor could a process running as it have used
    them: for it there are none."""
    try:
        return [old for name in _streams(client, stream) for old, _ in _moves(client, name)]
    except redis.exceptions.NoPermissionError:
        return []


def relayout(client: Any, stream: str) -> tuple[list[tuple[str, str]], list[str]]:
    """Rename ``stream``'s (and its partitions') old keys; return (renamed (old, new), kept because new existed)."""
    renamed: list[tuple[str, str]] = []
    kept: list[str] = []
    for name in _streams(client, stream):
        for old, new in _moves(client, name):
            if client.renamenx(old, new):
                renamed.append((old, new))
            else:
                kept.append(old)
    return renamed, kept
