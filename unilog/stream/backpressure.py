"""Back-pressure: the streamer pauses before Redis refuses for want of memory.

Redis with ``maxmemory`` refuses writes (``-OOM``) once it is full, and the batch in flight is refused whole (the
records stay staged, nothing is lost, but every retry is refused again). The streamer therefore reads ``INFO
memory`` at most every ``interval`` seconds and stops publishing while ``used_memory`` is at or above ``limit`` of
``maxmemory``, before Redis refuses, as Debezium Server's Redis sink does; retention keeps trimming meanwhile (it
frees memory). The pause is logged once when it starts and once when it ends, with the cause, and exported
(``unilog_redis_memory_ratio``, ``unilog_streamer_paused``).
"""

from __future__ import annotations

import time

import structlog

from .. import engine, metrics

log = structlog.get_logger(__name__)


class MemoryWatch:
    """Whether the streamer should pause for Redis's memory. ``limit`` 0 (or no ``maxmemory``) never pauses."""

    def __init__(self, name: str, limit: float, interval: float = 1.0) -> None:
        self.name, self.limit, self.interval = name, limit, interval
        self.paused = False
        self.paused_since: float | None = None
        self.last: engine.MemoryUse | None = None
        self._checked = -interval

    def full(self, api: engine.RedisStreams) -> bool:
        """Read Redis's memory if due; return whether publishing must pause now."""
        if self.limit <= 0:
            return False
        now = time.monotonic()
        if now - self._checked < self.interval:
            return self.paused
        self._checked = now
        use = self.last = api.memory()
        metrics.REDIS_MEMORY_RATIO.set(use.ratio)
        full = use.limit > 0 and use.ratio >= self.limit
        if full != self.paused:
            self._changed(full, use)
        return full

    def _changed(self, full: bool, use: engine.MemoryUse) -> None:
        self.paused = full
        metrics.STREAMER_PAUSED.labels(self.name, "redis_memory").set(1 if full else 0)
        shown = {"used_mb": round(use.used / 2**20, 1), "maxmemory_mb": round(use.limit / 2**20, 1)}
        if full:
            self.paused_since = time.monotonic()
            log.warning(
                "publishing paused: Redis is nearly out of memory; records stay staged in Postgres",
                streamer=self.name,
                percent=round(use.ratio * 100, 1),
                limit_percent=round(self.limit * 100, 1),
                **shown,
            )
            return
        waited = time.monotonic() - (self.paused_since or time.monotonic())
        self.paused_since = None
        log.info("publishing resumed: Redis has room again", streamer=self.name, paused_seconds=round(waited, 1))

    def describe(self) -> str:
        """The cause, for an error line."""
        use = self.last
        at = (
            f"{use.ratio * 100:.0f} % of maxmemory ({use.used / 2**20:.1f} of {use.limit / 2**20:.1f} MB)"
            if use
            else ""
        )
        return f"Redis memory at {at}, at or above the streamer's limit of {self.limit * 100:.0f} %"
