"""The demo's verdict does not depend on how fast a consumer warms up (issue 47 item 6).

A Spark consumer's first micro-batch took over a minute on a busy 2-core machine, and the demo, which started
traffic at once and then waited a fixed stall window for the consumers, gave up on it ("did not catch up in 60 s —
still behind: spark0") though every other consumer agreed. Here the whole demo runs (embedded servers, the fleet
as processes) with one consumer that starts its work ``DELAY`` seconds late, longer than the run's traffic and its
stall window together, as a stand-in for the JVM's warm-up (its command is the real consumer's behind a sleep): the
demo must wait for it before traffic starts and agree. One that never starts must still end in "did not catch up"
(exit code 15), naming it, after the warm-up's bound.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
from unilog_demo.commands import DEMO_EXIT_CODES
from unilog_demo.fleet import APP

from unilog.cli import ExitCode
from unilog.harness import demo
from unilog.harness.supervisor import ProcessSpec

SLOW = APP.consumers[1]
DELAY = 40.0  # past the API's start (12 s at load 9, 30 s at most), the traffic (3 s) and the stall window (3 s)
# sleep, then become the real consumer (same pid, so the fleet stops it as usual)
LATE_START = "import os, sys, time; time.sleep(float(sys.argv[1])); os.execv(sys.argv[2], sys.argv[2:])"


def _late(specs: Callable[..., list[ProcessSpec]], delay: float) -> Callable[..., list[ProcessSpec]]:
    """``fleet_specs`` with ``SLOW``'s command started ``delay`` seconds late."""

    def late_specs(*args: object, **kwargs: object) -> list[ProcessSpec]:
        return [
            replace(spec, argv=[sys.executable, "-c", LATE_START, str(delay), *spec.argv])
            if spec.name == SLOW
            else spec
            for spec in specs(*args, **kwargs)
        ]

    return late_specs


def _run(tmp_path: Path, **knobs: float) -> tuple[demo.Outcome, str, str]:
    out = io.StringIO()
    # in a thread: run_demo installs SIGINT/SIGTERM handlers only on the main thread, which is pytest's
    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(
            demo.run_demo, APP, duration=3.0, rate=20.0, seed=3, spark=False, log_dir=tmp_path, out=out, **knobs
        )
        outcome = run.result(timeout=600)
    text = out.getvalue()
    return outcome, text.strip().splitlines()[-1], text


@pytest.mark.slow(seconds=90)
def test_a_consumer_that_starts_late_is_waited_for_before_traffic_and_agrees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(demo, "fleet_specs", _late(demo.fleet_specs, DELAY))
    outcome, verdict, text = _run(tmp_path, stall=3.0)
    assert outcome is demo.Outcome.AGREE, text[-3000:]
    assert verdict.startswith("unilog demo verdict: AGREE"), verdict
    # the wait said whom it waited for, and traffic began only after it
    assert f"unilog demo: waiting for {SLOW} to apply the first ride (" in text, text[-3000:]
    ready = text.index("unilog demo: every consumer applied the first ride in ")
    assert ready < text.index("unilog demo: producers stopped"), text[-3000:]


@pytest.mark.slow(seconds=60)
def test_a_consumer_that_never_starts_ends_the_run_behind_and_named_before_traffic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(demo, "fleet_specs", _late(demo.fleet_specs, 3600.0))
    outcome, verdict, text = _run(tmp_path, warm_up_limit=10.0)
    assert outcome is demo.Outcome.BEHIND, text[-3000:]
    assert DEMO_EXIT_CODES[outcome.name] == ExitCode.NOT_CAUGHT_UP == 15
    assert f"unilog demo: {SLOW} did not apply the first ride (in 10 s); no traffic started" in text, text[-3000:]
    assert verdict.startswith("unilog demo verdict: did not catch up in "), verdict
    assert f"still behind: {SLOW} (lag " in verdict and "DISAGREE" not in verdict, verdict
    assert "producers stopped" not in text, text[-3000:]


def test_the_fleets_spark_consumer_starts_its_jvm_on_the_quick_jit_tier_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The demo's Spark process gets ``SPARK_SUBMIT_OPTS`` with C1 alone (its start costs half the CPU), the other
    processes nothing of it, and a user's own ``SPARK_SUBMIT_OPTS`` is left to stand."""
    from unilog.harness.app import SPARK_SHORT_JVM

    monkeypatch.delenv("SPARK_SUBMIT_OPTS", raising=False)
    specs = {spec.name: spec for spec in demo.fleet_specs(APP, 1, 1.0, False, None, True)}
    assert APP.spark_name in specs, sorted(specs)
    assert specs[APP.spark_name].env == SPARK_SHORT_JVM
    assert [name for name, spec in specs.items() if "SPARK_SUBMIT_OPTS" in spec.env] == [APP.spark_name]
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", "-Xmx2g")
    specs = {spec.name: spec for spec in demo.fleet_specs(APP, 1, 1.0, False, None, True)}
    assert "SPARK_SUBMIT_OPTS" not in specs[APP.spark_name].env
