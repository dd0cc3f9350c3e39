"""Both demo APIs on real servers (Flask under gunicorn, FastAPI under uvicorn) with their database behind the fault
proxy: while Postgres cannot be reached, ``POST /rides`` and ``GET /health`` answer 503 with ``Retry-After`` and a
JSON error (never a 500 page), and once it is back the next request creates a ride, without a restart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from unilog_demo.migrate import prepare

from unilog import Settings
from unilog.harness.embedded import free_port
from unilog.harness.proxy import FaultProxy

SERVERS = {
    "flask": ["-m", "gunicorn", "--workers", "1", "--threads", "2", "unilog_demo.api:app", "--bind"],
    "fastapi": ["-m", "uvicorn", "unilog_demo.api_fastapi:app", "--host", "127.0.0.1", "--port"],
}


def call(url: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, str], Any]:
    """Status, headers (names in lower case) and the JSON body (None if not JSON) of a GET, or a POST of ``body``."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, parsed


@pytest.fixture(params=sorted(SERVERS))
def api(request: pytest.FixtureRequest, settings: Settings, tmp_path: Path) -> Iterator[tuple[str, FaultProxy]]:
    """The API on a free port, its DATABASE_URL through a fault proxy in front of the test's Postgres."""
    prepare(settings.database_url)
    upstream = urlsplit(settings.database_url)
    with FaultProxy(upstream.hostname or "127.0.0.1", upstream.port or 5432) as proxy:
        port = free_port()
        argv = [sys.executable, *SERVERS[request.param]]
        argv.append(f"127.0.0.1:{port}" if request.param == "flask" else str(port))
        env = {**os.environ, "DATABASE_URL": proxy.url_for(settings.database_url)}
        with open(tmp_path / "server.log", "w") as log:
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if call(url + "/health")[0] == 200:
                        break
                except OSError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
                time.sleep(0.2)
            yield url, proxy
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def test_the_api_answers_503_with_retry_after_while_its_database_is_down(api: tuple[str, FaultProxy]) -> None:
    url, proxy = api
    assert call(url + "/rides", {"distance": 1.5})[0] == 201

    proxy.reset()  # Postgres is gone: every connection, open or new, is reset
    for path, body in (("/rides", {"distance": 2.5}), ("/health", None)):
        status, headers, answer = call(url + path, body)
        assert status == 503, (path, status, answer)
        assert int(headers.get("retry-after", "0")) > 0, (path, headers)
        assert answer and "database" in answer["error"]["message"], (path, answer)

    proxy.pass_through()  # back: the pool's pre-ping replaces the dead connections
    status, _, answer = call(url + "/rides", {"distance": 3.5})
    assert status == 201, answer
    assert call(url + "/health")[0] == 200
