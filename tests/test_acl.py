"""Least-privilege Redis users (`unilog acl`): the streamer, a checkpoint consumer, a group worker and an operator
each run under the ACL user `unilog acl` prints for their streams, on a real server; outside it, one line names the
refused command or key, and nothing is lost."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from acl_users import acl_users
from cli import one_line, unilog

from unilog import Settings, emit
from unilog.cli import ExitCode

PASSWORD = "acl-" + uuid.uuid4().hex[:8]


def as_user(settings: Settings, redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return unilog(settings, *args, redis_url=redis_url)


@pytest.fixture
def users(settings: Settings, rds: Any) -> Iterator[dict[str, str]]:
    """The users `unilog acl` prints for the test's stream, created on the test's Redis; their URLs by kind."""
    with acl_users(settings, rds, [settings.stream], PASSWORD) as urls:
        yield urls


def test_each_process_runs_under_its_acl_user_and_is_refused_outside_it(
    settings: Settings, pg: Any, rds: Any, users: dict[str, str]
) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for n in range(10):
            emit(conn, action="create", object="ride", data={"n": n})
    refused = as_user(settings, users["consumer"], "streamer", "--once")
    assert refused.returncode == ExitCode.CONFIG, refused.stderr
    line = one_line(refused)
    assert "NOPERM" in line and "evalsha" in line.lower() and PASSWORD not in line, line
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone() == (10,), "nothing lost"
    streamed = as_user(settings, users["streamer"], "streamer", "--once")
    assert streamed.returncode == 0 and "streamed 10 records" in streamed.stdout, streamed.stderr

    consume = ["consume", "handlers:cli_handler", "--name", "cli", "--once"]
    assert as_user(settings, users["consumer"], *consume).returncode == 0
    group = ["consume", "handlers:group_handler", "--group", "g", "--once"]
    no_group = as_user(settings, users["consumer"], *group)
    assert no_group.returncode == ExitCode.CONFIG and "NOPERM" in one_line(no_group), no_group.stderr
    assert as_user(settings, users["group"], *group).returncode == 0
    elsewhere = as_user(settings, users["group"], *group, "--stream", "another-stream")
    assert elsewhere.returncode == ExitCode.CONFIG and "NOPERM" in one_line(elsewhere), elsewhere.stderr
    counts = dict(pg.execute("SELECT consumer, count(*) FROM applied GROUP BY consumer").fetchall())
    assert counts == {"cli": 10, "group": 10}, "each record once"

    for args in (["status", "--json"], ["dlq", "list"], ["consumer", "register", "late"]):
        done = as_user(settings, users["operator"], *args)
        assert done.returncode == 0, (args, done.stderr)
    refused_admin = as_user(settings, users["consumer"], "consumer", "register", "late")
    assert refused_admin.returncode == 0 or "NOPERM" in one_line(refused_admin)
