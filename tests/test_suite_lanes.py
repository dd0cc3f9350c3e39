"""The parallel suite's lanes hold: pytest-xdist's ``--dist loadgroup`` keeps an ``xdist_group`` on one worker, one
test at a time (tests/conftest.py puts every end-to-end run in one such lane). With pytest 9.2 and xdist 3.8 the groups
were silently ignored, and three chaos runs ran at once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

GROUPED = """
import os, time, pytest

def record(name):
    started = time.monotonic()
    time.sleep(1.0)
    with open(os.environ["LANES_LOG"], "a") as log:
        log.write(f"{name} {os.environ['PYTEST_XDIST_WORKER']}\\n")

@pytest.mark.xdist_group("lane")
def test_a(): record("a")

@pytest.mark.xdist_group("lane")
def test_b(): record("b")

@pytest.mark.xdist_group("lane")
def test_c(): record("c")

def test_d(): record("d")
"""


@pytest.mark.slow(seconds=15, light=True)  # a pytest run of its own: 11 s of the default run
def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    log = tmp_path / "lanes.log"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "3",
            "--dist",
            "loadgroup",
            "-p",
            "no:cacheprovider",
            "-p",
            "xdist.plugin",
            str(tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        # xdist alone: four processes importing every installed plugin (Hypothesis, asyncio, unilog's...) took
        # most of this test's 11 s
        env={**__import__("os").environ, "LANES_LOG": str(log), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    workers = dict(line.split() for line in log.read_text().splitlines())
    assert set(workers) == {"a", "b", "c", "d"}
    assert workers["a"] == workers["b"] == workers["c"], f"the group was split over workers: {workers}"


def test_the_end_to_end_runs_are_spread_over_two_lanes_by_their_times() -> None:
    """Longest first, each into the emptier lane: a 615 s chaos module and the rest end within a test of each other,
    where one lane held them all before (the whole suite's critical path)."""
    from conftest import HEAVY_LANES, _spread

    times = {"chaos": 615.0, "compose": 254.0, "spark": 230.0, "restarts": 93.0, "fleet": 73.0, "junk": 18.0}
    lanes = _spread(times, HEAVY_LANES)
    assert set(lanes.values()) == {"end-to-end-1", "end-to-end-2"}
    load = {lane: sum(t for unit, t in times.items() if lanes[unit] == lane) for lane in set(lanes.values())}
    assert sorted(load.values()) == [633.0, 650.0], load  # chaos and junk; the rest


@pytest.mark.slow(light=True)  # a collection of its own: 7-13 s of the default run for a check of the suite's set-up
def test_the_inner_loops_modules_exist_and_leave_the_slow_runs_out() -> None:
    """``pytest -m core`` (CONTRIBUTING.md's inner loop) names its modules in ``tests/conftest.py``'s ``CORE``: a
    module renamed or removed would drop out of it silently, and a slow end-to-end run in a core module would make
    the minute several. In the core modules, every test is either core or slow, never both."""
    from conftest import CORE

    here = Path(__file__).parent
    assert sorted(name for name in CORE if not (here / f"{name}.py").exists()) == []
    mixed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider", "-m",
         "(core and slow) or (not core and not slow)", *(f"tests/{name}.py" for name in sorted(CORE))],
        cwd=here.parent, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert mixed.returncode == 5, (
        "tests neither core nor slow, or both:\n" + mixed.stdout[-3000:] + mixed.stderr[-2000:]
    )
