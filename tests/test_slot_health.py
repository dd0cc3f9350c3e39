"""Issue 26, item A: the WAL capture slot's health (is a streamer streaming from it, how much WAL it retains, how far
its confirmations lag) in `unilog metrics`, `unilog status` and the dashboard's status, read from the real servers
while a streamer is down and writes go on, then after a streamer catches up; table mode has no slot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import redis
from cli import TESTS, unilog
from prometheus_client.parser import text_string_to_metric_families

from unilog import Settings, Streamer, StreamerConfig, emit
from unilog.harness.embedded import free_port
from unilog.ops.dashboard import History, create_app
from unilog.stream.modes import enable_wal

GAUGES = ("unilog_capture_slot_active", "unilog_capture_slot_retained_bytes", "unilog_capture_slot_confirmed_lag_bytes")
NEAR = 64 * 1024  # "caught up": the confirmations within this many bytes of the current WAL position


@pytest.fixture
def exporter(settings: Settings) -> Iterator[int]:
    """`unilog metrics` on a free port."""
    port = free_port()
    env = {**os.environ, "DATABASE_URL": settings.database_url, "REDIS_URL": settings.redis_url}
    proc = subprocess.Popen(
        [sys.executable, "-m", "unilog", "--log-json", "metrics", "--port", str(port)],
        env={**env, "UNILOG_STREAM": settings.stream},
        cwd=TESTS,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: served(port), 20, "the exporter")
        yield port
    finally:
        proc.terminate()
        proc.wait(30)


def served(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    except OSError:
        return False
    return True


def slot_gauges(port: int) -> dict[str, dict[str, float]]:
    """The capture slot gauges of one scrape: {name: {slot: value}} (a name with no samples maps to {})."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found: dict[str, dict[str, float]] = {name: {} for name in GAUGES}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in found:
                found[sample.name][sample.labels["slot"]] = sample.value
    assert set(found) == set(GAUGES)
    return found


def active(port: int, slot: str, value: int) -> Callable[[], dict[str, dict[str, float]] | None]:
    """A check for :func:`wait_for`: the scrape once it shows ``unilog_capture_slot_active{slot} == value``."""

    def check() -> dict[str, dict[str, float]] | None:
        gauges = slot_gauges(port)
        return gauges if gauges["unilog_capture_slot_active"] == {slot: value} else None

    return check


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return found


def emit_n(settings: Settings, n: int, start: int = 0) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(start, start + n):
            emit(conn, action="create", object="ride", data={"n": i})
            conn.commit()


def status_json(settings: Settings) -> dict[str, Any]:
    result = unilog(settings, "status", "--json")
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def dashboard_capture(settings: Settings) -> dict[str, Any]:
    """The capture section of the dashboard's `/api/status` (the page itself needs a browser: tests/test_dashboard.py)."""
    history = History(settings)
    client = create_app(settings, history, read_only=True).test_client()
    page = client.get("/").get_data(as_text=True)
    assert 'id="capture"' in page and "drawCapture(data.status)" in page
    history.sample()
    return dict(client.get("/api/status").get_json()["status"]["capture"])


def test_slot_health_while_the_streamer_is_down_and_after_it_catches_up(
    settings: Settings, pg: Any, rds: redis.Redis, exporter: int
) -> None:
    if pg.execute("SHOW wal_level").fetchone()[0] != "logical":
        pytest.skip("wal_level is not logical")
    slot = enable_wal(settings).slot
    emit_n(settings, 3)
    with Streamer(settings, StreamerConfig(restart_after_crash=False)) as s:
        assert s.drain(timeout=10) == 3
        live = wait_for(active(exporter, slot, 1), 10, "the slot reported active")
    assert set(live["unilog_capture_slot_retained_bytes"]) == {slot}
    down = wait_for(active(exporter, slot, 0), 10, "the slot reported inactive (its walsender gone)")
    # writes go on with no streamer: records staged, and another table's inserts (WAL the slot must keep too)
    emit_n(settings, 50, start=3)
    pg.execute("CREATE TABLE ballast (x text)")
    pg.execute("INSERT INTO ballast SELECT repeat('x', 500) FROM generate_series(1, 4000)")
    behind = slot_gauges(exporter)
    assert behind["unilog_capture_slot_active"] == {slot: 0}
    for name in ("unilog_capture_slot_retained_bytes", "unilog_capture_slot_confirmed_lag_bytes"):
        assert behind[name][slot] > down[name][slot] + 1_000_000, (name, down[name], behind[name])
    report = status_json(settings)["capture"]
    assert report["mode"] == "wal" and report["slot"] == slot and report["active"] is False
    assert report["confirmed_lag_bytes"] > 1_000_000 and report["retained_bytes"] >= report["confirmed_lag_bytes"]
    assert "NO ACTIVE STREAMER" in unilog(settings, "status").stdout
    assert dashboard_capture(settings)["active"] is False
    with Streamer(settings, StreamerConfig(restart_after_crash=False)) as s:
        assert s.drain(timeout=30) == 50

        def caught_up() -> dict[str, dict[str, float]] | None:
            s.run_once()  # an idle pass confirms the server's position to the slot
            g = slot_gauges(exporter)
            return g if g["unilog_capture_slot_confirmed_lag_bytes"][slot] < NEAR else None

        after = wait_for(caught_up, 30, "the confirmations to catch up")
        assert after["unilog_capture_slot_active"] == {slot: 1}
        assert "streamer pid" in unilog(settings, "status").stdout
        report = status_json(settings)["capture"]
        assert report["active"] is True and report["active_pid"] is not None
        assert dashboard_capture(settings)["active"] is True
    assert rds.xlen(settings.stream) == 53


def test_table_mode_has_no_slot_gauges_and_status_says_no_slot(settings: Settings, exporter: int) -> None:
    assert slot_gauges(exporter) == {name: {} for name in GAUGES}, "no samples in table mode"
    level = status_json(settings)["capture"]["wal_level"]
    assert status_json(settings)["capture"] == {"mode": "table", "slot": None, "wal_level": level}
    (line,) = [x for x in unilog(settings, "status").stdout.splitlines() if x.startswith("capture:")]
    assert line.startswith("capture: table mode (commit order per row;") and "`unilog capture wal`" in line, line
    assert ("this server has wal_level=logical" in line) == (level == "logical"), line
    assert dashboard_capture(settings) == {"mode": "table", "slot": None, "wal_level": level}


def test_migrate_says_in_one_line_which_mode_the_database_is_in_and_how_to_switch(settings: Settings, pg: Any) -> None:
    result = unilog(settings, "migrate")
    assert result.returncode == 0, result.stderr
    (line,) = [x for x in result.stdout.splitlines() if "capture:" in x]
    assert line.startswith("unilog: capture: table mode (commit order per row;") and "unilog capture wal" in line
    if pg.execute("SHOW wal_level").fetchone()[0] != "logical":
        return
    enable_wal(settings)
    line = next(x for x in unilog(settings, "migrate").stdout.splitlines() if "capture:" in x)
    assert line.startswith("unilog: capture: WAL mode (commit order)") and "`unilog capture table`" in line, line
