"""Retention's bookkeeping: consumers register their checkpoints, and a stream is trimmed only behind the lowest
(the decision is :func:`unilog.stream.retention.trim`'s; these are its commands)."""

from __future__ import annotations

from typing import Any

from ..wire import registry_key, to_str
from .base import Adapter
from .commands import issues


class Retention(Adapter):
    """The registry of consumers' checkpoints on a stream, and trimming."""

    @issues("hset")
    def register(self, stream: str, consumer: str, last_id: str) -> None:
        """Record ``consumer``'s checkpoint on ``stream`` (after its commit), so trimming never passes it."""
        self.client.hset(registry_key(stream), consumer, last_id)

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
