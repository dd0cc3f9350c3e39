"""An open transaction elsewhere holds nothing back (issue 33): burst mode publishes what is committed beside a
session idle in transaction and exits; a transaction that staged records and stays open delays only those records,
and `unilog status` names it as such."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from unilog import Settings, emit
from unilog.cli import ExitCode
from unilog.ops.status import collect_status, format_status


@pytest.fixture
def blocker(settings: Settings) -> Iterator[tuple[psycopg.Connection[Any], int]]:
    """A session that took a transaction id and sits idle in transaction (it used to hold the horizon)."""
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


def test_burst_mode_publishes_beside_a_session_idle_in_transaction(settings: Settings, blocker: Any, rds: Any) -> None:
    """It used to wait for the session for --max-wait seconds, then exit 9 having published nothing."""
    stage(settings, 3)
    began = time.monotonic()
    result = streamer_once(settings, "--max-wait", "30")
    assert result.returncode == ExitCode.OK, result.stderr
    assert "streamed 3 records" in result.stdout
    assert time.monotonic() - began < 20, "not held until --max-wait"
    assert rds.xlen(settings.stream) == 3
    assert collect_status(settings)["staged"]["open_stager"] is None, "a session that staged nothing is not named"


def test_an_open_transaction_that_staged_delays_only_its_own_records_and_is_named(settings: Settings, rds: Any) -> None:
    stager = psycopg.connect(settings.conninfo, application_name="slow-import")
    emit(stager, action="create", object="ride", data={"mine": True})
    pid = stager.info.backend_pid
    try:
        stage(settings, 2)
        result = streamer_once(settings, "--max-wait", "30")
        assert result.returncode == ExitCode.OK and "streamed 2 records" in result.stdout, result.stderr
        report = collect_status(settings)["staged"]["open_stager"]
        assert report["pid"] == pid and report["application_name"] == "slow-import"
        line = format_status(collect_status(settings))
        assert f"pid {pid}" in line and "its own records wait for its commit" in line, line
        stager.commit()
        done = streamer_once(settings)
        assert done.returncode == 0 and "streamed 1 records" in done.stdout, done.stderr
        assert rds.xlen(settings.stream) == 3
    finally:
        stager.close()


def test_the_retired_horizon_option_is_accepted_and_says_so(settings: Settings) -> None:
    result = streamer_once(settings, "--horizon-warn-after", "5")
    assert result.returncode == ExitCode.OK, result.stderr
    assert "--horizon-warn-after has no effect" in result.stdout


def test_unilogs_own_sessions_are_not_named_as_open_stagers(settings: Settings) -> None:
    """A streamer's transaction holds the same lock on the staging table (it deletes what it published): status must
    not name unilog's own sessions as a producer holding records back."""
    own = psycopg.connect(settings.conninfo, application_name="unilog-streamer")
    own.execute("DELETE FROM staged_log_records WHERE id < 0")
    own.execute("SELECT pg_current_xact_id()")
    try:
        assert collect_status(settings)["staged"]["open_stager"] is None
    finally:
        own.close()
