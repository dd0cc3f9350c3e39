"""The `unilog` command as a user runs it: real processes, real servers, exit codes and one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from unilog import Settings, emit
from unilog.cli import ExitCode
from unilog.harness.embedded import free_port

TESTS = Path(__file__).parent


def unilog(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "UNILOG_STREAM")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "unilog", "--log-json", *args],
        env=full_env,
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def env_for(settings: Settings, **extra: str) -> dict[str, str]:
    return {
        "DATABASE_URL": settings.database_url,
        "REDIS_URL": settings.redis_url,
        "UNILOG_STREAM": "cli-stream",
        **extra,
    }


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_missing_database_url(settings: Settings) -> None:
    result = unilog("streamer", "--once", env={"REDIS_URL": settings.redis_url})
    assert result.returncode == ExitCode.CONFIG
    assert "DATABASE_URL is not set" in one_line_error(result)


def test_malformed_urls(settings: Settings) -> None:
    result = unilog(
        "streamer", "--once", env={"DATABASE_URL": "mysql://u:secret@h/db", "REDIS_URL": settings.redis_url}
    )
    assert result.returncode == ExitCode.CONFIG
    line = one_line_error(result)
    assert "not a Postgres URL" in line and "secret" not in line
    result = unilog("consume", "handlers:cli_handler", "--name", "x", env=env_for(settings, REDIS_URL="http://x"))
    assert result.returncode == ExitCode.CONFIG
    assert "not a Redis URL" in one_line_error(result)


def test_unreachable_servers_name_the_server_without_password(settings: Settings) -> None:
    port = free_port()
    url = f"postgresql://app:hunter2@127.0.0.1:{port}/app"
    result = unilog("streamer", "--once", env=env_for(settings, DATABASE_URL=url))
    assert result.returncode == ExitCode.UNREACHABLE
    line = one_line_error(result)
    assert f"127.0.0.1:{port}" in line and "hunter2" not in line and "***" in line
    result = unilog("streamer", "--once", env=env_for(settings, REDIS_URL=f"redis://:pw@127.0.0.1:{port}/0"))
    assert result.returncode == ExitCode.UNREACHABLE
    assert "cannot connect to Redis" in one_line_error(result)
    # a Redis Cluster none of whose nodes answers (redis-py raises no RedisError there: it was a traceback)
    result = unilog("streamer", "--once", env=env_for(settings, REDIS_URL=f"redis+cluster://127.0.0.1:{port}/0"))
    assert result.returncode == ExitCode.UNREACHABLE, result.stderr
    assert "cannot reach the Redis Cluster" in one_line_error(result)


def test_unmigrated_database_says_run_migrate(settings: Settings, unilog_postgres: Any) -> None:
    with psycopg.connect(unilog_postgres.admin_url, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS unmigrated")
        admin.execute("CREATE DATABASE unmigrated")
    url = unilog_postgres.url_for("unmigrated")
    result = unilog("streamer", "--once", env=env_for(settings, DATABASE_URL=url))
    assert result.returncode == ExitCode.SCHEMA
    assert "unilog migrate" in one_line_error(result)
    migrated = unilog("migrate", "--producer-id", "app-1", env=env_for(settings, DATABASE_URL=url))
    assert migrated.returncode == 0, migrated.stderr
    assert unilog("migrate", env=env_for(settings, DATABASE_URL=url)).returncode == 0, "migrate is idempotent"
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT producer_id FROM unilog_producer").fetchone() == ("app-1",)
    assert unilog("streamer", "--once", env=env_for(settings, DATABASE_URL=url)).returncode == 0


def test_bad_handler_reference(settings: Settings) -> None:
    result = unilog("consume", "handlers:nope", "--name", "x", env=env_for(settings))
    assert result.returncode == ExitCode.HANDLER
    assert "has no 'nope'" in one_line_error(result)
    result = unilog("consume", "no_such_module:f", "--name", "x", env=env_for(settings))
    assert result.returncode == ExitCode.HANDLER


def test_streamer_and_consumer_once(settings: Settings, pg: Any) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(2500):
            emit(conn, action="create", object="ride", data={"n": i})
        conn.commit()
    result = unilog("streamer", "--once", "--batch-size", "1000", env=env_for(settings))
    assert result.returncode == 0, result.stderr
    assert "streamed 2500 records" in result.stdout
    batches = [json.loads(line) for line in result.stdout.splitlines() if '"batch streamed"' in line]
    assert [b["records"] for b in batches] == [1000, 1000, 500] and all("ms" in b for b in batches)
    assert all(b["stream"] == "cli-stream" for b in batches)
    result = unilog("consume", "handlers:cli_handler", "--name", "cli", "--once", env=env_for(settings))
    assert result.returncode == 0, result.stderr
    assert "handled 2500 records" in result.stdout
    assert pg.execute("SELECT count(*), count(DISTINCT n) FROM applied WHERE consumer = 'cli'").fetchone() == (
        2500,
        2500,
    )


def test_sigterm_finishes_the_batch_and_exits_zero(settings: Settings, pg: Any, rds: Any) -> None:
    pg.execute(
        "INSERT INTO staged_log_records (action, object, data) "
        "SELECT 'create', 'ride', jsonb_build_object('n', g) FROM generate_series(1, 200000) g"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(env_for(settings))
    proc = subprocess.Popen(
        [sys.executable, "-m", "unilog", "--log-json", "streamer", "--batch-size", "500"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while rds.xlen("cli-stream") < 5000 and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert '"streamer stopped"' in out
    remaining = pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0]
    assert 0 < remaining < 200000, "stopped mid-backlog"
    # every record is either still staged or in the stream, exactly once: nothing lost, no half batch
    assert rds.xlen("cli-stream") + remaining == 200000
    assert rds.xlen("cli-stream") % 500 == 0


def test_status_reports_backlog_and_lag(settings: Settings) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(10):
            emit(conn, action="create", object="ride", data={"n": i})
        conn.commit()
    assert unilog("streamer", "--once", env=env_for(settings)).returncode == 0
    assert unilog("consume", "handlers:cli_handler", "--name", "cli", "--once", env=env_for(settings)).returncode == 0
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(3):
            emit(conn, action="create", object="ride", data={"n": i})
        conn.commit()
    assert unilog("streamer", "--once", env=env_for(settings)).returncode == 0
    with psycopg.connect(settings.conninfo) as conn:
        emit(conn, action="create", object="ride", data={"n": 99})
        conn.commit()
    holder = psycopg.connect(settings.conninfo, application_name="long-report")
    emit(holder, action="create", object="ride", data={"n": 100})  # an open transaction that staged: its record waits
    result = unilog("status", "--json", env=env_for(settings))
    holder.close()
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["staged"]["open_stager"]["application_name"] == "long-report"
    assert report["staged"]["records"] == 1 and report["staged"]["oldest_age_seconds"] >= 0
    assert report["streams"][0]["name"] == "cli-stream" and report["streams"][0]["length"] == 13
    assert report["consumers"][0]["name"] == "cli" and report["consumers"][0]["lag_entries"] == 3
    table = unilog("status", env=env_for(settings)).stdout
    assert "cli-stream" in table and "lag (entries)" in table


# -- commands from other packages (entry points in `unilog.commands`) ------------------------------------------------


def test_the_demo_package_adds_demo_and_chaos_to_the_command() -> None:
    result = unilog("--help")
    assert result.returncode == 0, result.stderr
    assert "demo" in result.stdout and "chaos" in result.stdout and "(unavailable" not in result.stdout
    assert "Rocket Rides" in unilog("demo", "--help").stdout


def broken_plugin(tmp_path: Path) -> dict[str, str]:
    """A distribution whose `unilog.commands` entry point cannot be imported, on PYTHONPATH."""
    info = tmp_path / "brokenplugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenplugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[unilog.commands]\nbroken = brokenplugin_missing.commands:add\n")
    return {"PYTHONPATH": str(tmp_path)}


def test_a_broken_plugin_breaks_only_its_own_command(tmp_path: Path) -> None:
    env = broken_plugin(tmp_path)
    assert unilog("streamer", "--help", env=env).returncode == 0, "the other commands keep working"
    listing = unilog("--help", env=env)
    assert listing.returncode == 0 and "broken" in listing.stdout and "unavailable" in listing.stdout
    result = unilog("broken", "--whatever", env=env)
    assert result.returncode == ExitCode.CONFIG
    line = one_line_error(result)
    assert "'broken' command cannot be loaded" in line and "brokenplugin_missing" in line and "brokenplugin" in line
