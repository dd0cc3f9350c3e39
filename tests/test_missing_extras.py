"""A command whose optional package is not installed (issue 34): one line naming the extra that installs it and exit
code 3, never a traceback, and nothing started. Each runs the command in a fresh interpreter where the package is
missing (``sys.modules[name] = None``: an import of it fails as if it were not installed)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli import TESTS, one_line

from unilog import Settings
from unilog.cli import ExitCode

RUN = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # as if not installed
from unilog.cli import main
sys.exit(main(sys.argv[2:]))
"""


def run_without(
    settings: Settings, missing: str, *argv: str, terminal: bool = False, cwd: Path = TESTS
) -> subprocess.CompletedProcess[str]:
    """``unilog ARGV`` with the modules ``missing`` (comma-separated) not importable; with ``terminal``, stderr is a
    terminal (a pseudo-terminal), as when a user runs it by hand."""
    env = {**os.environ, "DATABASE_URL": settings.database_url, "REDIS_URL": settings.redis_url}
    env["UNILOG_STREAM"] = settings.stream
    command = [sys.executable, "-c", RUN, missing, *argv]
    if not terminal:
        return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=follower, timeout=120)
    finally:
        os.close(follower)
    err = _read_all(leader)
    return subprocess.CompletedProcess(command, proc.returncode, proc.stdout.decode(), err.replace("\r\n", "\n"))


def _read_all(fd: int) -> str:
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:  # EIO: the terminal's other end closed
        pass
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def test_backfill_on_a_terminal_without_rich_stops_before_it_starts(settings: Settings, pg: Any) -> None:
    """It crashed with a traceback and left the backfill ``stopped``: it now refuses before creating it."""
    pg.execute("CREATE TABLE people (id int PRIMARY KEY, name text)")
    pg.execute("INSERT INTO people VALUES (1, 'a')")
    result = run_without(settings, "rich", "backfill", "people", "--key", "id", terminal=True)
    assert result.returncode == ExitCode.CONFIG, result.stderr
    line = one_line(result)
    assert "needs 'rich', which is not installed: pip install 'unilog-outbox[progress]'" in line, line
    assert "--log-json" in line, line
    assert pg.execute("SELECT count(*) FROM unilog_backfills").fetchone() == (0,), "nothing was started"
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone() == (0,)
    logged = run_without(settings, "rich", "--log-json", "backfill", "people", "--key", "id", terminal=True)
    assert logged.returncode == 0, logged.stderr  # progress as log lines needs no rich


@pytest.mark.parametrize("module", ["flask", "werkzeug", "werkzeug.serving"])
def test_dashboard_without_its_web_packages_names_the_dashboard_extra(settings: Settings, module: str) -> None:
    """Its framework, and the server it runs under (whichever that is: the line names the module)."""
    result = run_without(settings, module, "dashboard", "--port", "0")
    assert result.returncode == ExitCode.CONFIG, result.stderr
    line = one_line(result)
    assert "needs " in line and "pip install" in line and "unilog-outbox[dashboard]" in line, line


@pytest.mark.parametrize(
    "argv",
    [("reconcile", "--model", "handlers:cli_handler"), ("archive", "--path", "archive")],
    ids=["reconcile", "archive"],
)
def test_spark_commands_without_pyspark_name_the_spark_extra(
    settings: Settings, tmp_path: Path, argv: tuple[str, ...]
) -> None:
    result = run_without(settings, "pyspark", *argv)
    assert result.returncode == ExitCode.CONFIG, result.stderr
    line = one_line(result)
    assert f"unilog {argv[0]} needs 'pyspark', which is not installed: pip install 'unilog-outbox[spark]'" in line, line


def test_a_missing_module_no_extra_installs_is_still_a_traceback(settings: Settings) -> None:
    """A module of unilog itself (a broken install), in a command that has optional packages: the traceback is the
    report, not a misleading extra."""
    result = run_without(settings, "unilog.ops.dashboard", "dashboard", "--port", "0")
    assert result.returncode == 1 and "Traceback" in result.stderr, result.stderr
    assert "pip install" not in result.stderr, result.stderr


def test_commands_run_without_opentelemetry_and_django(settings: Settings) -> None:
    """Tracing and Django are optional for every command: a consumer, the streamer and status work without them."""
    for argv in (
        ("streamer", "--once"),
        ("consume", "handlers:cli_handler", "--name", "c", "--once"),
        ("status",),
    ):
        result = run_without(settings, "opentelemetry,django", *argv)
        assert result.returncode == 0, (argv, result.stderr)


def test_unilog_django_without_django_names_the_django_extra() -> None:
    code = "import sys\nsys.modules['django'] = None\nimport unilog.django\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "unilog.django needs Django, which is not installed: pip install 'unilog-outbox[django]'" in result.stderr
