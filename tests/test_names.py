"""Names that cross a trust boundary (stream, consumer and group names, from code, the command line or a URL) are
validated before they reach a Redis key or SQL: names built to address another stream's keys or to inject SQL are
refused in one line, and touch nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from unilog import ConsumerConfig, GroupConfig, InvalidStreamName, Settings, emit
from unilog.cli import ExitCode
from unilog.errors import InvalidName

TESTS = Path(__file__).parent
HOSTILE_STREAMS = ["*", "a b", "s\n", "x'; DROP TABLE staged_log_records; --", "s\r\nFLUSHALL", "../etc", "", "é"]
# a group or consumer name with ':' could make one stream's key another's: unilog:attempts:<a>:<b:c> is
# unilog:attempts:<a:b>:<c>
HOSTILE_NAMES = ["b:c", "x'; DROP TABLE unilog_checkpoints; --", "*", "a b", "", "name\n"]


@pytest.mark.parametrize("stream", HOSTILE_STREAMS)
def test_emit_refuses_a_hostile_stream_name_and_writes_nothing(settings: Settings, pg: Any, stream: str) -> None:
    with psycopg.connect(settings.conninfo) as conn, pytest.raises(InvalidStreamName):
        emit(conn, action="a", object="o", data={}, stream=stream)
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone() == (0,)


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_consumer_and_group_names_cannot_address_other_keys(name: str) -> None:
    with pytest.raises(InvalidName):
        ConsumerConfig(name=name)
    with pytest.raises(InvalidName):
        GroupConfig(group=name)


def test_the_command_line_refuses_them_in_one_line(settings: Settings, pg: Any, rds: Any) -> None:
    env = {**os.environ, "DATABASE_URL": settings.database_url, "REDIS_URL": settings.redis_url}
    keys_before = sorted(rds.keys("*"))
    for args in (
        ["consume", "handlers:cli_handler", "--name", "b:c", "--once"],
        ["consume", "handlers:cli_handler", "--group", "x'; DROP TABLE unilog_checkpoints; --", "--once"],
        ["consume", "handlers:cli_handler", "--name", "ok", "--stream", "*", "--once"],
        ["acl", "--streams", "orders,*"],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "unilog", *args], env=env, cwd=TESTS, capture_output=True, text=True, timeout=60
        )
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == ExitCode.CONFIG and len(lines) == 1 and "invalid" in lines[0], (args, lines)
        assert sorted(rds.keys("*")) == keys_before, (args, sorted(rds.keys("*")))
    assert pg.execute("SELECT to_regclass('unilog_checkpoints') IS NOT NULL").fetchone() == (True,)
    assert sorted(rds.keys("*")) == keys_before, ("no key was created or touched", sorted(rds.keys("*")), keys_before)
