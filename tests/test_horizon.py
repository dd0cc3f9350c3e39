"""A stalled visibility horizon is visible and bounded: an idle-in-transaction session holding committed records
back is named in warnings, in `unilog status`, and in burst mode's one-line exit once `--max-wait` passes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from structlog.testing import capture_logs

from unilog import Settings, Streamer, StreamerConfig, emit
from unilog.cli import ExitCode
from unilog.harness.pytest_plugin import running
from unilog.status import collect_status


@pytest.fixture
def blocker(settings: Settings) -> Iterator[tuple[psycopg.Connection[Any], int]]:
    """A session that took a transaction id and sits idle in transaction: it holds the horizon."""
    conn = psycopg.connect(settings.conninfo, application_name="nightly-report")
    conn.execute("SELECT pg_current_xact_id() /* nightly report */")
    pid = conn.info.backend_pid
    yield conn, pid
    conn.close()


def stage(settings: Settings, n: int) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(n):
            emit(conn, action="create", object="ride", data={"i": i})


def streamer_once(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": settings.database_url, "REDIS_URL": settings.redis_url}
    env["UNILOG_STREAM"] = settings.stream
    argv = [sys.executable, "-m", "unilog", "--log-json", "streamer", "--once", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def test_burst_mode_gives_up_after_max_wait_naming_the_session(settings: Settings, blocker: Any) -> None:
    conn, pid = blocker
    stage(settings, 3)
    began = time.monotonic()
    result = streamer_once(settings, "--max-wait", "2")
    assert result.returncode == ExitCode.HORIZON_HELD, result.stderr
    assert time.monotonic() - began < 60, "bounded by --max-wait, not by the blocker"
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    line = lines[0]
    for part in ("3 committed records", f"pid {pid}", "'nightly-report'", "idle in transaction", "nightly report"):
        assert part in line, line
    report = collect_status(settings)["staged"]["oldest_transaction"]
    assert report["pid"] == pid and "nightly report" in report["query"], "unilog status shows it too"
    conn.rollback()  # the cure: end the transaction
    done = streamer_once(settings, "--max-wait", "2")
    assert done.returncode == 0 and "streamed 3 records" in done.stdout, done.stderr


def test_the_long_running_streamer_warns_naming_the_session_then_publishes(
    settings: Settings, blocker: Any, rds: Any
) -> None:
    conn, pid = blocker
    config = StreamerConfig(horizon_warn_after=0.3, horizon_warn_interval=0.5, poll_interval=0.2)
    with Streamer(settings, config) as streamer, capture_logs() as logs, running(streamer.run):
        stage(settings, 2)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(e["event"].startswith("records held") for e in logs):
            time.sleep(0.1)
        conn.rollback()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and rds.xlen(settings.stream) < 2:
            time.sleep(0.05)
    warnings = [e for e in logs if e["event"] == "records held behind an open transaction"]
    assert warnings, [e["event"] for e in logs]
    assert warnings[0]["records"] == 2 and f"pid {pid}" in warnings[0]["holder"]
    assert "nightly-report" in warnings[0]["holder"] and warnings[0]["log_level"] == "warning"
    assert rds.xlen(settings.stream) == 2, "published once the transaction ended"
