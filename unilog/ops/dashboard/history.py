"""The dashboard's sampler: the status report every few seconds, and each consumer's lag over the last minutes."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import psycopg
import structlog

from ... import engine
from ...config import Settings
from ...errors import UnilogError
from ...health import HEALTH

log = structlog.get_logger(__name__)


class History:
    """Lag samples per consumer (``stream/name``), the last ``seconds`` of them, and the latest status report."""

    def __init__(self, settings: Settings, *, interval: float = 2.0, seconds: float = 600.0) -> None:
        self.settings = settings
        self.interval = interval
        self.seconds = seconds
        self.latest: dict[str, Any] | None = None
        self.error: str | None = None
        self._series: dict[str, deque[tuple[float, int, float]]] = {}
        self._lock = threading.Lock()

    def sample(self) -> None:
        """Read the status once and add a lag sample per consumer and group."""
        from ..status import collect_status

        try:
            report = collect_status(self.settings)
        except (UnilogError, psycopg.Error, engine.RedisError, OSError) as exc:
            # a server restarting, its sessions ended, a cluster failing over: the page says so, /readyz fails, the
            # next sample tries again; the process lives on. One line per cause, not one per sample.
            error = " ".join(str(exc).split()) or type(exc).__name__
            with self._lock:
                known, self.error = self.error, error
            if error != known:
                log.error("cannot read the status; retrying", error=error, retry_in=self.interval)
            HEALTH.unready("dashboard", error)
            return
        if self.error is not None:
            log.info("the status can be read again")
        HEALTH.reached("dashboard")
        now = time.time()
        rows = [(f"{c['stream']}/{c['name']}", c) for c in report["consumers"]]
        rows += [(f"{s['name']}/{g['name']} (group)", g) for s in report["streams"] for g in s["groups"]]
        with self._lock:
            self.latest, self.error = report, None
            for key, row in rows:
                series = self._series.setdefault(key, deque())
                series.append((now, row["lag_entries"], row["lag_seconds"]))
                while series and series[0][0] < now - self.seconds:
                    series.popleft()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "status": self.latest,
                "error": self.error,
                "lag": {key: [list(point) for point in series] for key, series in self._series.items()},
                "at": time.time(),
            }

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.sample()
            stop.wait(self.interval)
