"""Running the ``unilog`` command the way users do, against the test's servers: shared by the command-line tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from unilog import Settings

TESTS = Path(__file__).parent


def unilog(
    settings: Settings, *args: str, timeout: float = 60, cwd: Path = TESTS, **env: str
) -> subprocess.CompletedProcess[str]:
    """``python -m unilog --log-json ARGS`` in ``cwd`` (default ``tests/``, so ``handlers:...`` imports) with the
    test's servers and stream; keyword arguments replace environment variables (``database_url=...``,
    ``redis_url=...``)."""
    environ = {**os.environ, "DATABASE_URL": settings.database_url, "REDIS_URL": settings.redis_url}
    environ["UNILOG_STREAM"] = settings.stream
    environ.update({name.upper(): value for name, value in env.items()})
    argv = [sys.executable, "-m", "unilog", "--log-json", *args]
    return subprocess.run(argv, env=environ, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed command printed on stderr (asserts it is one line and no traceback)."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr
    return lines[0]
