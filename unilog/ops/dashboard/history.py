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
from ..scale import worst

log = structlog.get_logger(__name__)

Point = tuple[float, ...]


def _rows(report: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(key, stream, row) of each consumer and group of ``report``: key ``stream/name``, a group's ``(group)``."""
    rows = [(f"{c['stream']}/{c['name']}", c["stream"], c) for c in report["consumers"]]
    rows += [(f"{s['name']}/{g['name']} (group)", s["name"], g) for s in report["streams"] for g in s["groups"]]
    return rows


ALL = "(all streams)"  # the series of the totals: entries in and out over every stream, the longest wait


class History:
    """The last ``seconds`` (an hour) of samples, and the latest status report cut to the ``top`` streams most behind
    (:func:`unilog.ops.scale.worst`, with totals over all): per consumer and group (``stream/name``) of those its lag
    (time, entries, seconds) and its records per second out (time, rate); per stream of those its records per second
    in (time, rate); and the same for :data:`ALL` streams (lag: entries summed, the longest wait). A rate covers the
    time since the sample before; entries in are counted after the stream's last id at that sample, and a consumer's
    out is its lag then plus those, less its lag now.

    Memory is bounded whatever the number of streams and however they come and go: at most ``top`` streams' series
    are added to at each sample, and a series with no point in the window is dropped."""

    def __init__(self, settings: Settings, *, interval: float = 2.0, seconds: float = 3600.0, top: int = 20) -> None:
        self.settings = settings
        self.interval = interval
        self.seconds = seconds
        self.top = top
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
        now, rows, shown = time.time(), _rows(report), worst(report, self.top)
        kept = {key for key, _, _ in _rows(shown)}
        with self._lock:
            self.latest, self.error = shown, None
            for key, _, row in rows:
                if key in kept:
                    self._add(self._series, key, (now, row["lag_entries"], row["lag_seconds"]))
            totals = shown["totals"]
            self._add(self._series, ALL, (now, totals["lag_entries"], totals["max_lag_seconds"]))
            self._add_rates(now, report, rows, {s["name"] for s in shown["streams"]}, kept)
            ids = {s["name"]: s["last_id"] for s in report["streams"] if s["last_id"]}
            self._last = (now, ids, {key: int(row["lag_entries"] or 0) for key, _, row in rows})
            self._prune(now)

    def _add_rates(
        self,
        now: float,
        report: dict[str, Any],
        rows: list[tuple[str, str, dict[str, Any]]],
        streams: set[str],
        kept: set[str],
    ) -> None:
        if self._last is None or now <= self._last[0]:
            return
        then, ids, lags = self._last
        appended = {s["name"]: int(s.get("appended") or 0) for s in report["streams"]}
        known = {name: count for name, count in appended.items() if name in ids}  # a new stream has no rate yet
        for name, count in known.items():
            if name in streams:
                self._add(self._in, name, (now, count / (now - then)))
        self._add(self._in, ALL, (now, sum(known.values()) / (now - then)))
        total = 0
        for key, stream, row in rows:
            if key in lags and stream in ids:
                read = max(0, lags[key] + appended.get(stream, 0) - int(row["lag_entries"] or 0))
                total += read
                if key in kept:
                    self._add(self._out, key, (now, read / (now - then)))
        self._add(self._out, ALL, (now, total / (now - then)))

    def _prune(self, now: float) -> None:
        """Drop the series with no point left in the window (a consumer deleted, a stream no longer among the
        worst), so streams that come and go do not grow the process."""
        for table in (self._series, self._in, self._out):
            for key in [k for k, series in table.items() if not series or series[-1][0] < now - self.seconds]:
                del table[key]

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
