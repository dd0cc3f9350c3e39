"""The dashboard's sampler: the status report every few seconds, and over the last hour each consumer's lag, each
stream's records per second in (entries added to it) and each consumer's records per second out (entries it read)."""

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

Point = tuple[float, ...]


def _rows(report: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(key, stream, row) of each consumer and group of ``report``: key ``stream/name``, a group's ``(group)``."""
    rows = [(f"{c['stream']}/{c['name']}", c["stream"], c) for c in report["consumers"]]
    rows += [(f"{s['name']}/{g['name']} (group)", s["name"], g) for s in report["streams"] for g in s["groups"]]
    return rows


class History:
    """The last ``seconds`` (an hour) of samples, and the latest status report: per consumer and group
    (``stream/name``) its lag (time, entries, seconds) and its records per second out (time, rate); per stream its
    records per second in (time, rate). A rate covers the time since the sample before; entries in are counted after
    the stream's last id at that sample, and a consumer's out is its lag then plus those, less its lag now."""

    def __init__(self, settings: Settings, *, interval: float = 2.0, seconds: float = 3600.0) -> None:
        self.settings = settings
        self.interval = interval
        self.seconds = seconds
        self.latest: dict[str, Any] | None = None
        self.error: str | None = None
        self._series: dict[str, deque[Point]] = {}
        self._in: dict[str, deque[Point]] = {}
        self._out: dict[str, deque[Point]] = {}
        self._last: tuple[float, dict[str, str], dict[str, int]] | None = None  # time, last ids, lags
        self._lock = threading.Lock()

    def sample(self) -> None:
        """Read the status once and add a lag sample per consumer and group, and the rates since the last sample."""
        from ..status import collect_status

        since = self._last[1] if self._last else None
        try:
            report = collect_status(self.settings, since=since)
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
        now, rows = time.time(), _rows(report)
        with self._lock:
            self.latest, self.error = report, None
            for key, _, row in rows:
                self._add(self._series, key, (now, row["lag_entries"], row["lag_seconds"]))
            self._add_rates(now, report, rows)
            ids = {s["name"]: s["last_id"] for s in report["streams"] if s["last_id"]}
            self._last = (now, ids, {key: int(row["lag_entries"] or 0) for key, _, row in rows})

    def _add_rates(self, now: float, report: dict[str, Any], rows: list[tuple[str, str, dict[str, Any]]]) -> None:
        if self._last is None or now <= self._last[0]:
            return
        then, ids, lags = self._last
        appended = {s["name"]: int(s.get("appended") or 0) for s in report["streams"]}
        for name, count in appended.items():
            if name in ids:  # a stream new since the last sample has no rate yet
                self._add(self._in, name, (now, count / (now - then)))
        for key, stream, row in rows:
            if key in lags and stream in ids:
                read = lags[key] + appended.get(stream, 0) - int(row["lag_entries"] or 0)
                self._add(self._out, key, (now, max(0, read) / (now - then)))

    def _add(self, table: dict[str, deque[Point]], key: str, point: Point) -> None:
        series = table.setdefault(key, deque())
        series.append(point)
        while series and series[0][0] < point[0] - self.seconds:
            series.popleft()

    def snapshot(self) -> dict[str, Any]:
        def plain(table: dict[str, deque[Point]]) -> dict[str, list[list[float]]]:
            return {key: [list(point) for point in series] for key, series in table.items()}

        with self._lock:
            return {
                "status": self.latest,
                "error": self.error,
                "lag": plain(self._series),
                "rates": {"in": plain(self._in), "out": plain(self._out)},
                "window": self.seconds,
                "at": time.time(),
            }

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.sample()
            stop.wait(self.interval)
