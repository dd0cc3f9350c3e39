"""The tutorial's code runs (docs/tutorial.md): its own tests, examples/tutorial/test_shop.py, are collected here and
run against the suite's throw-away servers, and its commands run as the page writes them, through the installed
``unilog`` console script from the tutorial's folder (a user's shell: no PYTHONPATH), as issue 47 asks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg
import pytest
from test_console_script import console_script

import unilog
from unilog.harness.embedded.process import free_port

TUTORIAL = Path(__file__).resolve().parent.parent / "examples" / "tutorial"
sys.path.insert(0, str(TUTORIAL))

# the tutorial's tests and their fixture, collected as this module's own
from test_shop import (  # noqa: E402
    api,  # noqa: F401 (a fixture)
    place_order,
    sales,
    test_a_crash_before_the_commit_loses_nothing,  # noqa: F401
    test_a_record_sent_twice_is_applied_once,  # noqa: F401
    test_an_order_reaches_the_sales_table,  # noqa: F401
)


def unilog_command(settings: unilog.Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(DATABASE_URL=settings.database_url, REDIS_URL=settings.redis_url, UNILOG_STREAM=settings.stream)
    argv = [console_script(), *args]
    return subprocess.run(argv, cwd=TUTORIAL, env=env, capture_output=True, text=True, timeout=120)


def test_the_pages_commands_run_the_shop(
    api: str,  # noqa: F811 (the fixture imported above)
    unilog_settings: unilog.Settings,
) -> None:
    """The page's steps: `unilog migrate`, `unilog schema register shop.records`, `unilog status`, `unilog streamer
    --once`, then `unilog consume shop.consumers:record_sale --name sales --once` from the tutorial's folder."""
    migrate = unilog_command(unilog_settings, "migrate")
    assert migrate.returncode == 0 and "unilog: database migrated" in migrate.stdout, migrate.stderr
    register = unilog_command(unilog_settings, "schema", "register", "shop.records")
    assert register.returncode == 0, register.stderr
    said = "unilog: registered OrderCreated@1 on unilog: new, nothing to compare with (no earlier version registered)"
    assert register.stdout.strip() == said.replace(" on unilog:", f" on {unilog_settings.stream}:")
    place_order(api, "teapot", 2)
    with psycopg.connect(unilog_settings.conninfo) as conn:
        assert conn.execute("SELECT count(*) FROM staged_log_records").fetchone() == (1,)
    status = unilog_command(unilog_settings, "status")
    assert status.returncode == 0 and status.stdout.startswith("staged records: 1 "), status.stdout + status.stderr
    streamer = unilog_command(unilog_settings, "streamer", "--once")
    assert streamer.returncode == 0, streamer.stderr
    consume = unilog_command(unilog_settings, "consume", "shop.consumers:record_sale", "--name", "sales", "--once")
    assert consume.returncode == 0, consume.stderr
    assert sales(unilog_settings) == {"teapot": 2}


def _page_block(after: str) -> str:
    """The page's first fenced block after the text ``after``."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "tutorial.md").read_text()
    rest = page[page.index(after) :]
    start = rest.index("```")
    body = rest[rest.index("\n", start) + 1 :]
    return body[: body.index("```")]


@pytest.mark.slow(seconds=20, light=True)  # three processes and a nested pytest: the whole suite's, not the inner loop
def test_the_pages_servers_api_and_pytest_run_as_written(tmp_path: Path) -> None:
    """The page's other steps, each as a user runs it in a shell (no PYTHONPATH, from the shop's folder): `python
    servers.py` prints an export line whose servers answer, `uvicorn --factory shop.api:create_app` takes an order
    that is staged, and `pytest` in the shop's folder passes its three tests."""
    shop = tmp_path / "shop-app"
    shutil.copytree(TUTORIAL, shop, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    (shop / "servers.py").write_text(_page_block("saved as `servers.py`"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    servers = subprocess.Popen(
        [sys.executable, "servers.py"], cwd=shop, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert servers.stdout is not None and servers.stdin is not None
        line = ""
        while not line.startswith("export ") and servers.poll() is None:  # after the servers' own log lines
            line = servers.stdout.readline().strip()
        assert line.startswith("export DATABASE_URL=") and " REDIS_URL=" in line, line
        urls = dict(item.split("=", 1) for item in line.removeprefix("export ").split())
        env.update(urls)
        bin_dir = Path(sys.executable).parent
        migrate = subprocess.run([console_script(), "migrate"], cwd=shop, env=env, capture_output=True, text=True)
        assert migrate.returncode == 0, migrate.stderr
        _api_takes_an_order(shop, env, bin_dir)
        servers.stdin.write("\n")  # "Enter stops them"
        servers.stdin.flush()
        assert servers.wait(60) == 0
    finally:
        if servers.poll() is None:
            servers.kill()
    tests = subprocess.run(
        [str(bin_dir / "pytest"), "-p", "no:cacheprovider"], cwd=shop, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert tests.returncode == 0 and "3 passed" in tests.stdout, tests.stdout + tests.stderr


def _api_takes_an_order(shop: Path, env: dict[str, str], bin_dir: Path) -> None:
    """`uvicorn --factory shop.api:create_app` (on a free port), then the page's order: staged with its record."""
    port = free_port()
    argv = [str(bin_dir / "uvicorn"), "--factory", "shop.api:create_app", "--port", str(port)]
    server = subprocess.Popen(argv, cwd=shop, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        body = json.dumps({"product": "teapot", "quantity": 2}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/orders", data=body, headers={"Content-Type": "application/json"}
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    assert response.status in (200, 201), response.status
                    break
            except urllib.error.URLError:
                assert server.poll() is None and time.monotonic() < deadline, (
                    server.stderr.read() if server.stderr else ""
                )
                time.sleep(0.2)
        with psycopg.connect(env["DATABASE_URL"]) as conn:
            assert conn.execute("SELECT count(*) FROM staged_log_records").fetchone() == (1,)
    finally:
        server.terminate()
        server.wait(30)
