"""Moving a deployment's Redis keys to the hash-tagged layout (see :mod:`unilog.wire`): ``unilog stream relayout``.

Before the layout, a stream's bookkeeping keys were named ``unilog:hwm:<stream>``, ``<stream>:dlq`` and so on. Run
the relayout once, with the streamers and consumers stopped: each old key is renamed to its new name (``RENAME`` is
atomic per key), partitions included. A key whose new name already exists is left in place and reported: nothing
is overwritten. Until then a streamer refuses to publish a stream that still has old keys (:func:`legacy_keys`), so
retention can never trim behind a registration it cannot see.

The keys are found by one ``SCAN`` of the names holding the stream's name (its partitions' keys hold it too): a
key is read or renamed only when it exists, so a least-privilege user never touches a name outside its ACL (Redis
would refuse it and log the refusal in ``ACL LOG``) unless an old key really is there.
"""

from __future__ import annotations

import re
from typing import Any

import redis

from ..wire import legacy_keys as legacy_names
from ..wire import legacy_patterns, meta_key, to_str
from ._sync.base import Adapter
from .commands import issues


def _found(client: Any, stream: str) -> set[str]:
    """Every key whose name holds ``stream`` (stream names have no glob characters: ``validate_stream_name``)."""
    return {to_str(key) for key in client.scan_iter(match=f"*{stream}*", count=1000)}


def _partitions(client: Any, stream: str, found: set[str]) -> int:
    for key in (meta_key(stream), f"unilog:meta:{stream}"):
        value = client.hget(key, "partitions") if key in found else None
        if value:
            return int(value)
    return 1


def _streams(client: Any, stream: str, found: set[str]) -> list[str]:
    count = _partitions(client, stream, found)
    return [stream, *(f"{stream}.p{i}" for i in range(count))] if count > 1 else [stream]


def _moves(stream: str, found: set[str]) -> list[tuple[str, str]]:
    moves = [(old, new) for old, new in legacy_names(stream).items() if old in found]
    for old_prefix, new_prefix in legacy_patterns(stream).values():
        moves += [
            (name, new_prefix + name.removeprefix(old_prefix)) for name in sorted(found) if name.startswith(old_prefix)
        ]
    return moves


def legacy_keys(client: Any, stream: str) -> list[str]:
    """The keys of ``stream`` (and its partitions) still named in the old layout. A least-privilege user whose ACL
    (``unilog acl``) covers only the new names cannot see old ones, nor could a process running as it have used
    them: for it there are none."""
    try:
        found = _found(client, stream)
        return [old for name in _streams(client, stream, found) for old, _ in _moves(name, found)]
    except redis.exceptions.NoPermissionError:
        return []


_OLD_PREFIXES = ("unilog:meta:", "unilog:consumers:", "unilog:hwm:", "unilog:attempts:", "unilog:workers:")


def legacy_keys_many(client: Any, streams: list[str]) -> dict[str, list[str]]:
    """:func:`legacy_keys` of many streams with one ``SCAN`` of the keyspace, not one per stream: the streams (of
    ``streams``) with keys in the old layout, and those keys. A key of the new layout holds a hash tag (``{``),
    which no stream name may: the few keys without one that have an old key's shape are matched to the streams
    (and their partitions, ``<stream>.p<n>``) they could belong to."""
    try:
        old = [
            name
            for name in (to_str(key) for key in client.scan_iter(match="*", count=1000))
            if "{" not in name and (name.startswith(_OLD_PREFIXES) or name.endswith(":dlq"))
        ]
    except redis.exceptions.NoPermissionError:
        return {}
    found: dict[str, list[str]] = {}
    for stream in streams:
        keys = [name for name in old if stream in name and _belongs(name, stream)]
        if keys:
            found[stream] = keys
    return found


def _belongs(name: str, stream: str) -> bool:
    """Whether the old-layout key ``name`` is one of ``stream``'s or its partitions'."""
    pattern = re.escape(stream) + r"(\.p\d+)?"
    exact = rf"unilog:(meta|consumers|hwm):{pattern}|{pattern}:dlq"
    return bool(re.fullmatch(exact, name) or re.fullmatch(rf"unilog:(attempts|workers):{pattern}:.+", name))


def relayout(client: Any, stream: str) -> tuple[list[tuple[str, str]], list[str]]:
    """Rename ``stream``'s (and its partitions') old keys; return (renamed (old, new), kept because new existed)."""
    renamed: list[tuple[str, str]] = []
    kept: list[str] = []
    found = _found(client, stream)
    for name in _streams(client, stream, found):
        for old, new in _moves(name, found):
            if client.renamenx(old, new):
                renamed.append((old, new))
            else:
                kept.append(old)
    return renamed, kept


class Layout(Adapter):
    """The key layout: the streamer's check for old names, and the operator's move to the new ones."""

    @issues("scan", "hget")
    def legacy_keys(self, stream: str) -> list[str]:
        """``stream``'s keys still in the layout before hash tags (see :func:`legacy_keys`)."""
        return legacy_keys(self.client, stream)

    @issues("scan")
    def legacy_keys_many(self, streams: list[str]) -> dict[str, list[str]]:
        """Which of ``streams`` have keys in the layout before hash tags, and those keys (one scan: see
        :func:`legacy_keys_many`)."""
        return legacy_keys_many(self.client, streams)

    @issues("scan", "hget", "renamenx")
    def relayout(self, stream: str) -> tuple[list[tuple[str, str]], list[str]]:
        """Rename ``stream``'s old-layout keys (see :func:`relayout`)."""
        return relayout(self.client, stream)
