"""Retention's bookkeeping: consumers register their checkpoints, and a stream is trimmed only behind the lowest
(the decision is :func:`unilog.stream.retention.trim`'s; these are its commands)."""

from __future__ import annotations

from typing import Any

from ..wire import registry_key, to_str
from ._sync.retention import RetentionCore
from .commands import issues


class Retention(RetentionCore):
    """The registry of consumers' checkpoints on a stream (a consumer's registration:
    :class:`~unilog.engine._sync.retention.RetentionCore`, generated: both faces register), and trimming."""

    @issues("hdel")
    def unregister(self, stream: str, consumer: str) -> bool:
        """Stop holding back trimming for ``consumer``; returns whether it was registered."""
        return bool(self.client.hdel(registry_key(stream), consumer))

    @issues("hgetall")
    def registered(self, stream: str) -> dict[str, str]:
        """Registered consumers of ``stream`` and their checkpoints."""
        raw: Any = self.client.hgetall(registry_key(stream))
        return {to_str(k): to_str(v) for k, v in raw.items()}

    @issues("xtrim")
    def trim(self, stream: str, *, min_id: str | None = None, max_len: int | None = None) -> int:
        """Trim entries below ``min_id`` (exactly) and/or beyond ``max_len`` (approximately); return entries removed."""
        removed = 0
        if min_id is not None:
            removed += int(self.client.xtrim(stream, minid=min_id, approximate=False))
        if max_len is not None:
            removed += int(self.client.xtrim(stream, maxlen=max_len, approximate=True))
        return removed
