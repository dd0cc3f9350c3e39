"""Consumer groups: deliveries, claims of idle entries, acknowledgements, failed attempts, and what groups hold.

A group worker's commands (both faces have them) are generated from :mod:`unilog.engine._async.groups`; what groups
hold (pending summaries, ``XINFO GROUPS``) is the threaded face's only."""

from __future__ import annotations

from typing import Any

import redis

from ..wire import attempts_key, to_str
from ._sync.groups import GroupsCore
from .commands import issues
from .replies import no_such_key


class Groups(GroupsCore):
    """Consumer groups: a group worker's commands (:class:`~unilog.engine._sync.groups.GroupsCore`, generated: both
    faces have them), and what groups hold, for operators and retention."""

    @issues("xpending")
    def pending_summary(self, stream: str, group: str) -> dict[str, Any]:
        """Pending entries of ``group``: count, lowest and highest id, and count per consumer."""
        info: Any = self.client.xpending(stream, group)
        return {
            "count": int(info["pending"]),
            "min": to_str(info["min"]) if info["min"] else None,
            "max": to_str(info["max"]) if info["max"] else None,
            "consumers": {to_str(c["name"]): int(c["pending"]) for c in info["consumers"]},
        }

    @issues("xinfo|groups")
    def groups(self, stream: str) -> list[dict[str, Any]]:
        """``XINFO GROUPS`` for ``stream`` (empty if the stream does not exist), keys and values decoded."""
        try:
            raw: Any = self.client.xinfo_groups(stream)
        except redis.ResponseError as exc:
            if no_such_key(exc):
                return []
            raise
        return [{to_str(k): (to_str(v) if isinstance(v, bytes) else v) for k, v in g.items()} for g in raw]

    @issues("xgroup|destroy", "del")
    def destroy_group(self, stream: str, group: str) -> bool:
        """Remove ``group`` from ``stream`` (its position and pending entries) and its failed-attempt counts; return
        whether the group existed."""
        pipe = self.client.pipeline(transaction=False)
        pipe.xgroup_destroy(stream, group)
        pipe.delete(attempts_key(stream, group))
        try:
            destroyed, _ = pipe.execute()
        except redis.ResponseError as exc:
            if "requires the key to exist" in str(exc):  # no stream, no group (the attempts key goes all the same)
                return False
            raise
        return bool(destroyed)
