"""The soak's growth check (bench/growth.py) on synthetic series: no servers needed.

It must fail a steady climb, however noisy, and pass what a healthy fleet looks like: flat noise, an allocator's
warm-up that levels off, a stream filling to its retention, autovacuum's sawtooth, crash spikes in lag.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from bench.growth import Tolerance, judge, theil_sen
from bench.soak import judge_samples

RSS = Tolerance(2.0, 0.05)  # bench.soakfleet.tolerances' RSS: 2 MB or 5 %
HOUR = 3600
STEP = 5.0


def series(fn, seconds: float = HOUR, seed: int = 1) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    return [(t, fn(t, rng)) for t in (i * STEP for i in range(int(seconds / STEP)))]


def test_theil_sen_ignores_outliers() -> None:
    pts = [(float(t), 2.0 * t) for t in range(50)]
    pts[10] = (10.0, 1e6)
    pts[40] = (40.0, -1e6)
    assert theil_sen(pts) == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("what", "fn"),
    [
        ("a leak of 175 B/commit at 200 commits/s", lambda t, r: 55 + 175 * 200 * t / 2**20 + r.gauss(0, 0.1)),
        ("a slow leak: 8 MB an hour, noisy", lambda t, r: 56 + 8 * t / HOUR + r.gauss(0, 0.3)),
        ("a leak hidden under spikes", lambda t, r: 56 + 10 * t / HOUR + (30 if r.random() < 0.05 else 0)),
        ("a leak that only starts halfway", lambda t, r: 56 + max(0.0, t - HOUR / 2) * 12 / HOUR),
        ("a staircase: 4 MB more every 20 minutes", lambda t, r: 56 + 4 * (t // 1200)),
    ],
)
def test_a_steady_climb_fails(what: str, fn) -> None:
    growth = judge("RSS MB: streamer", series(fn), RSS)
    assert growth.unbounded, f"{what} passed: {growth.line()}"


@pytest.mark.parametrize(
    ("what", "fn"),
    [
        ("flat, noisy", lambda t, r: 56 + r.gauss(0, 0.3)),
        ("allocator warm-up that levels off", lambda t, r: 50 + 6 * (1 - math.exp(-t / 300)) + r.gauss(0, 0.05)),
        ("a rise that stops at 40 % of the run", lambda t, r: 50 + 10 * min(t, 0.4 * HOUR) / HOUR),
        ("4 kB page steps up and down", lambda t, r: 56 + 0.004 * r.randint(0, 50)),
        ("a sawtooth (autovacuum every minute)", lambda t, r: 30 + 12 * (t % 60)),
        ("crash spikes", lambda t, r: 56 + (40 if r.random() < 0.1 else 0) + r.gauss(0, 0.2)),
        ("all zeros", lambda t, r: 0.0),
        ("a slow creep under the bar: 1 MB an hour", lambda t, r: 56 + t / HOUR + r.gauss(0, 0.05)),
    ],
)
def test_bounded_series_pass(what: str, fn) -> None:
    growth = judge("RSS MB: streamer", series(fn), RSS)
    assert not growth.unbounded, f"{what} failed: {growth.line()}"


def test_dead_tuples_sawtooth_and_a_stream_at_its_retention_pass_with_the_soak_tolerances() -> None:
    """The tolerances the soak uses, through the same entry point as a run (series named ``kind: which``)."""
    rate = 200
    samples: list[dict[str, Any]] = [
        {
            "t": t,
            "cpu": {},
            "staging dead tuples": float((t % 60) * rate),  # vacuumed every minute
            "stream length: rides": float(min(t, 30.0) * rate),  # filled to its retention in 30 s, then trimmed
            "lag s: checkpoint": 0.05 + (8.0 if int(t) % 300 == 0 else 0.0),  # a proxy cut every 5 minutes
            "RSS MB: group": 56.0 + 3.0 * t / HOUR,  # 3 MB an hour: past the 2 MB bar per half? 1.5 MB: no
        }
        for t in (i * STEP for i in range(int(HOUR / STEP)))
    ]
    assert [g.series for g in judge_samples(samples, rate) if g.unbounded] == []
    for s in samples:
        s["RSS MB: group"] = 56.0 + 10.0 * s["t"] / HOUR
    assert [g.series for g in judge_samples(samples, rate) if g.unbounded] == ["RSS MB: group"]


def test_a_short_run_is_judged_too() -> None:
    """A 3-minute run's 36 samples, with a 1 kB-per-record leak at 200 records/s (the ``table-leak`` variant)."""
    leak = series(lambda t, r: 57 + 200 * 1024 * t / 2**20 + r.gauss(0, 0.2), seconds=180)
    assert judge("RSS MB: checkpoint", leak, RSS).unbounded
    flat = series(lambda t, r: 57 + r.gauss(0, 0.2), seconds=180)
    assert not judge("RSS MB: checkpoint", flat, RSS).unbounded


def test_too_few_samples_is_no_verdict() -> None:
    growth = judge("RSS MB: streamer", [(0.0, 1.0), (5.0, 100.0)], RSS)
    assert not growth.unbounded and math.isnan(growth.first_half)
