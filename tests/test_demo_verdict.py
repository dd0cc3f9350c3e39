"""The demo's verdict tells "still catching up" from "applied something different" (issue 34).

Rocket Rides on the test's servers, its consumers run in this process: one stopped consumer must read "did not catch
up in N s" (exit code 15), never DISAGREE; a consumer that read everything and holds different totals is DISAGREE
(exit code 1); a slow consumer whose lag keeps falling is waited for past the stall window. Before traffic, the
warm-up waits for a consumer that starts late and names one that never does (issue 47 item 6)."""

from __future__ import annotations

import io
import random
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from unilog_demo.commands import DEMO_EXIT_CODES
from unilog_demo.consumer import handle
from unilog_demo.fleet import APP, stage_ride

import unilog
from unilog.cli import ExitCode
from unilog.harness import demo
from unilog.harness.pytest_plugin import running
from unilog.harness.supervisor import Fleet, ProcessSpec
from unilog.ops import admin

RIDES = 4


@pytest.fixture
def rides(settings: unilog.Settings) -> unilog.Settings:
    """Rocket Rides' tables and consumers declared, ``RIDES`` rides staged and streamed; nothing consumed yet."""
    APP.prepare(settings.database_url)
    own = unilog.Settings.from_dsn(settings.database_url, settings.redis_url, APP.stream)
    admin.declare(own, APP.stream, consumers=list(APP.consumers), groups=[APP.group])
    rng = random.Random(7)
    with psycopg.connect(own.conninfo) as conn:
        for i in range(RIDES):
            with conn.transaction():
                stage_ride(conn, f"cid-{i}", rng, APP.stream)
    unilog.Streamer(own).drain()
    return own


def _consume(settings: unilog.Settings, name: str, handler: Any = handle) -> None:
    if name == APP.group:
        unilog.GroupConsumer(settings, unilog.GroupConfig(group=name, worker="w"), handler).drain()
    else:
        unilog.Consumer(settings, unilog.ConsumerConfig(name=name), handler).drain()


def _verdict(settings: unilog.Settings, **wait: float) -> tuple[demo.Outcome, str]:
    out = io.StringIO()
    snap, waited = demo.settle(APP, settings, out, spark=False, **wait)
    outcome = demo.print_verdict(APP, snap, {}, waited, out)
    return outcome, out.getvalue().strip().splitlines()[-1]


def test_a_stopped_consumer_did_not_catch_up_it_does_not_disagree(rides: unilog.Settings) -> None:
    _consume(rides, APP.consumers[0])
    _consume(rides, APP.group)  # consumer1 never runs: nothing applied, every entry still to read
    outcome, line = _verdict(rides, stall=1.0, ceiling=30.0)
    assert outcome is demo.Outcome.BEHIND, line
    assert line.startswith("unilog demo verdict: did not catch up in ") and "DISAGREE" not in line, line
    assert f"still behind: {APP.consumers[1]} (lag {RIDES})" in line, line
    assert DEMO_EXIT_CODES[outcome.name] == ExitCode.NOT_CAUGHT_UP == 15


def test_a_consumer_that_read_everything_and_differs_disagrees(rides: unilog.Settings) -> None:
    for name in (*APP.consumers, APP.group):
        _consume(rides, name)
    with psycopg.connect(rides.conninfo, autocommit=True) as conn:
        conn.execute("UPDATE consumer_states SET ride_count = ride_count + 1 WHERE name = %s", (APP.consumers[1],))
    outcome, line = _verdict(rides, stall=1.0, ceiling=30.0)
    assert outcome is demo.Outcome.DISAGREE, line
    assert line.startswith("unilog demo verdict: DISAGREE") and f"differ: {APP.consumers[1]}" in line, line
    assert DEMO_EXIT_CODES[outcome.name] == ExitCode.FAILURE


def test_the_wait_goes_on_while_a_slow_consumers_lag_falls(rides: unilog.Settings) -> None:
    """A consumer that applies one ride a second takes four seconds in all, past the one-second stall window; the
    wait ends only when nothing progresses for that long, so it ends in AGREE."""
    _consume(rides, APP.consumers[0])
    _consume(rides, APP.group)

    def slow(conn: Any, records: Sequence[unilog.Record]) -> None:
        time.sleep(1.0)
        handle(conn, records)

    config = unilog.ConsumerConfig(name=APP.consumers[1], batch_size=1)
    with unilog.Consumer(rides, config, slow) as consumer, running(consumer.run):
        outcome, line = _verdict(rides, stall=2.5, ceiling=120.0)
    assert outcome is demo.Outcome.AGREE, line


def test_the_warm_up_names_a_consumer_that_never_applies_the_first_records(
    rides: unilog.Settings, tmp_path: Path
) -> None:
    """consumer1's process exits at once, again and again: the wait's lines say it was restarted, and the last one
    names it once the bound has passed."""
    _consume(rides, APP.consumers[0])
    _consume(rides, APP.group)
    fleet = Fleet(tmp_path)
    fleet.start(ProcessSpec(APP.consumers[1], [sys.executable, "-c", "raise SystemExit(1)"]))
    fleet.watch(interval=0.1)
    out = io.StringIO()
    try:
        late, waited = demo.warm_up(APP, rides, threading.Event(), out, spark=False, limit=3.0, every=1.0, fleet=fleet)
    finally:
        fleet.stop_all()
    assert late == [APP.consumers[1]] and waited >= 3.0, out.getvalue()
    lines = out.getvalue().strip().splitlines()
    assert f"unilog demo: waiting for {APP.consumers[1]} (restarted " in lines[-2], lines
    assert "times: see its log) to apply the first ride (" in lines[-2], lines
    assert lines[-1] == f"unilog demo: {APP.consumers[1]} did not apply the first ride (in 3 s); no traffic started"


def test_the_warm_up_waits_for_a_consumer_that_starts_late(rides: unilog.Settings) -> None:
    _consume(rides, APP.consumers[0])

    def start_late() -> None:
        _consume(rides, APP.consumers[1])
        _consume(rides, APP.group)

    late_start = threading.Timer(3.0, start_late)  # 3 s late, past `every`: a line names both
    late_start.start()
    out = io.StringIO()
    try:
        late, waited = demo.warm_up(APP, rides, threading.Event(), out, spark=False, limit=60.0, every=1.0)
    finally:
        late_start.join()
    assert late == [] and waited >= 3.0, out.getvalue()
    lines = out.getvalue().strip().splitlines()
    assert f"unilog demo: waiting for {APP.consumers[1]} and {APP.group} to apply the first ride (" in lines[0], lines
    assert lines[-1].startswith("unilog demo: every consumer applied the first ride in "), lines
