"""``unilog consumer delete`` and ``unilog group delete`` (issue 34): a stale consumer or group goes for good, with
everything unilog keeps for it (checkpoint and held records, or applied identities and watermarks; its registration
or Redis group and attempt counts; its dead letters), and nothing of anyone else's; refused in one line while a
process of it is running. Run as users run the command, on the test's servers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from cli import TESTS, one_line, unilog

from unilog import Settings, Streamer, emit
from unilog.cli import ExitCode
from unilog.wire import attempts_key, dlq_key, registry_key


def _publish(settings: Settings, poison: int | None = None, count: int = 6) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for n in range(count):
            emit(conn, action="create", object="ride", data={"n": n, "poison": n == poison})
    with Streamer(settings) as streamer:
        streamer.drain()


def _letters(rds: Any, stream: str) -> list[tuple[str, str]]:
    """(group, consumer) of each dead letter of ``stream``."""
    return [(f.get("dlq_group", ""), f.get("dlq_consumer", "")) for _, f in rds.xrange(dlq_key(stream))]


def _count(pg: Any, query: str, *params: Any) -> int:
    return int(pg.execute(query, params).fetchone()[0])


@contextmanager
def _running(settings: Settings, pg: Any, *argv: str, session: str) -> Iterator[subprocess.Popen[str]]:
    """``unilog consume ARGV`` running until the block ends, once its Postgres session ``session`` is connected."""
    env = {**os.environ, "DATABASE_URL": settings.database_url, "REDIS_URL": settings.redis_url}
    env["UNILOG_STREAM"] = settings.stream
    command = [sys.executable, "-m", "unilog", "--log-json", "consume", *argv, "--block-ms", "100"]
    proc = subprocess.Popen(command, env=env, cwd=TESTS, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
        deadline = time.monotonic() + 60
        while _count(pg, query, session) == 0:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, f"no session {session} within a minute"
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_consumer_delete_removes_everything_unilog_keeps_for_it(settings: Settings, pg: Any, rds: Any) -> None:
    s = settings.stream
    _publish(settings, poison=2)
    for name in ("cli", "other"):
        ran = unilog(
            settings, "consume", "handlers:poison_handler", "--name", name, "--once", "--on-poison", "dead-letter"
        )
        assert ran.returncode == 0, ran.stderr
    assert sorted(_letters(rds, s)) == [("", "cli"), ("", "other")]
    assert _count(pg, "SELECT count(*) FROM unilog_held_letters WHERE consumer = 'cli'") == 1

    result = unilog(settings, "consumer", "delete", "cli")
    assert result.returncode == 0, result.stderr
    assert f"unilog: consumer cli deleted from {s} (it was at " in result.stdout, result.stdout
    assert "1 held records, its registration, 1 dead letters" in result.stdout, result.stdout
    assert _count(pg, "SELECT count(*) FROM unilog_checkpoints WHERE name = 'cli'") == 0
    assert _count(pg, "SELECT count(*) FROM unilog_held_letters WHERE consumer = 'cli'") == 0
    assert "cli" not in rds.hgetall(registry_key(s))
    assert _letters(rds, s) == [("", "other")], "the other consumer's letter stays"
    assert _count(pg, "SELECT count(*) FROM unilog_checkpoints WHERE name = 'other'") == 1
    assert "other" in rds.hgetall(registry_key(s))

    again = unilog(settings, "consumer", "delete", "cli")
    assert again.returncode == ExitCode.CONFIG, again.stderr
    assert f"no consumer 'cli' on '{s}'" in one_line(again)


def test_consumer_delete_is_refused_while_it_runs(settings: Settings, pg: Any, rds: Any) -> None:
    _publish(settings)
    with _running(settings, pg, "handlers:cli_handler", "--name", "cli", session="unilog-consumer-cli"):
        result = unilog(settings, "consumer", "delete", "cli")
        assert result.returncode == ExitCode.CONSUMER_RUNNING, result.stderr
        line = one_line(result)
        assert "consumer 'cli' is running (pid " in line and "stop it first" in line, line
        assert _count(pg, "SELECT count(*) FROM unilog_checkpoints WHERE name = 'cli'") == 1
    assert unilog(settings, "consumer", "delete", "cli").returncode == 0


def test_group_delete_removes_the_group_its_applied_records_and_letters(settings: Settings, pg: Any, rds: Any) -> None:
    s = settings.stream
    _publish(settings, poison=2)
    worker = ["--worker", "w1", "--claim-idle-ms", "1", "--max-deliveries", "1", "--once"]
    for group in ("g", "g-b"):
        ran = unilog(settings, "consume", "handlers:poison_handler", "--group", group, *worker)
        assert ran.returncode == 0, ran.stderr
    assert sorted(_letters(rds, s)) == [("g", "w1"), ("g-b", "w1")]
    rds.hincrby(attempts_key(s, "g"), "1-0", 1)  # an attempt count left behind
    applied = "SELECT count(*) FROM unilog_processed WHERE group_name = %s"
    marks = "SELECT count(*) FROM unilog_group_watermarks WHERE group_name = %s"
    assert _count(pg, applied, "g") + _count(pg, marks, "g") > 0

    result = unilog(settings, "group", "delete", "g")
    assert result.returncode == 0, result.stderr
    assert f"unilog: group g deleted from {s} (it was at " in result.stdout, result.stdout
    assert "the Redis group, 1 dead letters" in result.stdout, result.stdout
    assert [g["name"] for g in rds.xinfo_groups(s)] == ["g-b"]
    assert not rds.exists(attempts_key(s, "g"))
    assert _count(pg, applied, "g") + _count(pg, marks, "g") == 0
    assert _count(pg, applied, "g-b") + _count(pg, marks, "g-b") > 0, "the other group's records stay"
    assert _letters(rds, s) == [("g-b", "w1")]

    missing = unilog(settings, "group", "delete", "g")
    assert missing.returncode == ExitCode.CONFIG and f"no group 'g' on '{s}'" in one_line(missing)


def test_group_delete_is_refused_while_a_worker_runs(settings: Settings, pg: Any, rds: Any) -> None:
    _publish(settings)
    for group in ("g", "g-b"):
        assert unilog(settings, "consume", "handlers:group_handler", "--group", group, "--once").returncode == 0
    with _running(
        settings, pg, "handlers:group_handler", "--group", "g-b", "--worker", "w", session="unilog-group-g-b-w"
    ):
        other = unilog(settings, "group", "delete", "g")  # g-b's worker is not one of g's
        assert other.returncode == 0, other.stderr
        result = unilog(settings, "group", "delete", "g-b")
        assert result.returncode == ExitCode.CONSUMER_RUNNING, result.stderr
        assert "group 'g-b' is running (pid " in one_line(result)
        assert [g["name"] for g in rds.xinfo_groups(settings.stream)] == ["g-b"]
