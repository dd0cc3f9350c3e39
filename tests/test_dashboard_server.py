"""``unilog dashboard`` is served by a production WSGI server (waitress), not Werkzeug's development server: the
real command on the test's servers answers the page and ``/api/status`` with waitress's ``Server`` header, serves
requests side by side, and exits 0 on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from unilog import Settings
from unilog.harness.embedded import free_port


@pytest.fixture
def dashboard(settings: Settings, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": settings.database_url,
        "REDIS_URL": settings.redis_url,
        "UNILOG_STREAM": settings.stream,
    }
    log = tmp_path / "dashboard.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "unilog", "dashboard", "--port", str(port), "--read-only"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + "/api/status", timeout=2).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
    try:
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_the_dashboard_runs_on_waitress(dashboard: tuple[str, subprocess.Popen[bytes]]) -> None:
    url, proc = dashboard

    def get(path: str) -> tuple[int, str]:
        with urllib.request.urlopen(url + path, timeout=10) as response:
            response.read()
            return response.status, response.headers.get("Server", "")

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(get, ["/", "/api/status"] * 8))
    assert all(status == 200 for status, _ in answers), answers
    servers = {server for _, server in answers}
    assert servers == {"waitress"}, f"served by {servers}, not waitress"

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
