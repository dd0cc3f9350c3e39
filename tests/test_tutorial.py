"""The tutorial's code runs (docs/tutorial.md): its own tests, examples/tutorial/test_shop.py, are collected here and
run against the suite's throw-away servers, and its commands run as the page writes them, through the installed
``unilog`` console script from the tutorial's folder (a user's shell: no PYTHONPATH), as issue 47 asks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
from test_console_script import console_script

import unilog

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
