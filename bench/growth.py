"""Whether a sampled series grows without bound, judged so that bounded noise does not fire.

A soak's series are noisy in ways that are not leaks: RSS rises while the allocator warms up and then stays, a Redis
stream grows to its retention and then stays, autovacuum makes the staging table's dead tuples a sawtooth, a
crash-and-restart makes lag spike. :func:`judge` therefore:

* drops the warm-up (the first :data:`WARMUP` of the run's time);
* splits the rest in two halves by time and compares their **medians** (robust to spikes and to a sawtooth);
* asks that the series still climbs in the second half: the **Theil-Sen slope** (the median of pairwise slopes,
  robust to outliers) over the second half, times that half's span, or twice the rise between the medians of the
  second half's two quarters (a staircase's Theil-Sen slope can be 0);
* sets the bar at the largest of an absolute tolerance (the series' unit: a few MB of RSS, a minute of rows of dead
  tuples), a relative one (a share of the first half's median) and 3x the noise (the median absolute deviation of
  the first half's samples around their own Theil-Sen line, scaled to a standard deviation).

A series grows without bound when the second half's median is above the first half's by more than the bar **and**
its second half still climbs by more than half the bar. A rise that levelled off (warm-up, a stream reaching its
retention) passes; a steady climb of more than the bar per half of the run fails.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

WARMUP = 0.1  # share of the run's time left out: imports, caches, the allocator's first arenas, the first vacuum
MAX_PAIRS_POINTS = 240  # Theil-Sen over at most this many (evenly thinned) points: O(n^2) pairs


@dataclass(frozen=True)
class Tolerance:
    """How much a series may rise between the halves of a run without counting as growth: ``absolute`` in the
    series' unit, ``relative`` as a share of the first half's median."""

    absolute: float
    relative: float = 0.1


@dataclass(frozen=True)
class Growth:
    """The verdict on one series. Levels are medians; ``slope_per_hour`` is the Theil-Sen slope of the second
    half, in the series' unit per hour; ``bar`` is what the rise had to exceed."""

    series: str
    samples: int
    first: float  # the first sample after warm-up
    last: float
    first_half: float
    second_half: float
    slope_per_hour: float
    noise: float
    bar: float
    unbounded: bool

    @property
    def rise(self) -> float:
        return self.second_half - self.first_half

    def line(self) -> str:
        verdict = "GROWS" if self.unbounded else "bounded"
        return (
            f"{verdict:7}  {self.series}: median {_fmt(self.first_half)} -> {_fmt(self.second_half)} "
            f"(rise {_fmt(self.rise)}, bar {_fmt(self.bar)}), second-half slope {_fmt(self.slope_per_hour)}/h, "
            f"noise {_fmt(self.noise)}, first {_fmt(self.first)} last {_fmt(self.last)}"
        )


def theil_sen(points: Sequence[tuple[float, float]]) -> float:
    """The median of the slopes between every pair of points (distinct times); 0.0 with fewer than two."""
    pts = _thin(points, MAX_PAIRS_POINTS)
    slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(pts) for (x2, y2) in pts[i + 1 :] if x2 != x1]
    return statistics.median(slopes) if slopes else 0.0


def _thin(points: Sequence[tuple[float, float]], most: int) -> list[tuple[float, float]]:
    if len(points) <= most:
        return list(points)
    step = len(points) / most
    return [points[int(i * step)] for i in range(most)]


def noise(points: Sequence[tuple[float, float]]) -> float:
    """The spread of ``points`` around their own Theil-Sen line: 1.4826 x the median absolute deviation of the
    residuals (a standard deviation, for normal noise); a sawtooth's amplitude shows here, a trend does not."""
    if len(points) < 3:
        return 0.0
    slope = theil_sen(points)
    residuals = [y - slope * x for x, y in points]
    center = statistics.median(residuals)
    return 1.4826 * statistics.median(abs(r - center) for r in residuals)


def judge(series: str, points: Sequence[tuple[float, float | None]], tolerance: Tolerance) -> Growth:
    """The verdict on ``points`` (seconds since the start, value; None and NaN values are left out): see the module."""
    pts = sorted((t, v) for t, v in points if v is not None and math.isfinite(v))
    if len(pts) < 8:
        return Growth(series, len(pts), *(float("nan"),) * 7, unbounded=False)
    start, end = pts[0][0], pts[-1][0]
    warm = [(t, v) for t, v in pts if t >= start + WARMUP * (end - start)]
    middle = (warm[0][0] + warm[-1][0]) / 2
    first = [(t, v) for t, v in warm if t < middle]
    second = [(t, v) for t, v in warm if t >= middle]
    if len(first) < 3 or len(second) < 3:
        return Growth(series, len(pts), *(float("nan"),) * 7, unbounded=False)
    m1 = statistics.median(v for _, v in first)
    m2 = statistics.median(v for _, v in second)
    spread = noise(first)
    bar = max(tolerance.absolute, tolerance.relative * abs(m1), 3 * spread)
    slope = theil_sen(second)  # per second
    climb = max(slope * (second[-1][0] - second[0][0]), 2 * _quarters_rise(second))
    unbounded = m2 - m1 > bar and climb > bar / 2
    return Growth(series, len(pts), warm[0][1], pts[-1][1], m1, m2, slope * 3600, spread, bar, unbounded)


def _quarters_rise(half: Sequence[tuple[float, float]]) -> float:
    """The rise between the medians of a half's two quarters: a staircase (a table's size growing by whole extents
    now and then) can have a Theil-Sen slope of 0 while it climbs, when most pairs of samples share a step."""
    middle = (half[0][0] + half[-1][0]) / 2
    early = [v for t, v in half if t < middle]
    late = [v for t, v in half if t >= middle]
    return statistics.median(late) - statistics.median(early) if early and late else 0.0


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "nan"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"
