"""How ``unilog consume`` starts a consumer (issue 34): options that contradict each other are refused in one line
before anything starts; a new consumer or group on a stream that has entries says, in one line, how many it will
replay; ``--from start|end|ID`` places a new one, and is refused for one that exists. Run as users run the command,
on the test's servers."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from cli import one_line, unilog

from unilog import Settings, Streamer, emit
from unilog.cli import ExitCode

HANDLER = "handlers:cli_handler"


def _publish(settings: Settings, count: int, first: int = 0) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for n in range(first, first + count):
            emit(conn, action="create", object="ride", data={"n": n})
    with Streamer(settings) as streamer:
        streamer.drain()


def _announced(result: Any) -> list[dict[str, Any]]:
    """The new-consumer log lines of a run (JSON lines on stdout)."""
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return [e for e in lines if e["event"].startswith("new consumer")]


def _applied(pg: Any, consumer: str = "cli") -> list[int]:
    return [row[0] for row in pg.execute("SELECT n FROM applied WHERE consumer = %s ORDER BY n", (consumer,))]


@pytest.mark.parametrize(
    "options",
    [
        ("--name", "c", "--partitioned", "--group", "g"),
        ("--partitioned", "--group", "g"),
        ("--name", "c", "--group", "g"),
        ("--name", "c", "--worker", "w"),
        ("--name", "c", "--workers", "2"),
        ("--name", "c", "--partitioned", "--from", "end"),
        ("--name", "c", "--from", "yesterday"),
    ],
    ids=[
        "partitioned-group",
        "partitioned-group-unnamed",
        "name-group",
        "worker",
        "workers",
        "from-partitioned",
        "bad-from",
    ],
)
def test_contradictory_options_are_refused_before_anything_starts(
    settings: Settings, pg: Any, rds: Any, options: tuple[str, ...]
) -> None:
    _publish(settings, 2)
    result = unilog(settings, "consume", HANDLER, *options, "--once")
    assert result.returncode == ExitCode.USAGE, result.stderr
    line = one_line(result)
    assert line.startswith("unilog: error: --"), line
    assert pg.execute("SELECT count(*) FROM unilog_checkpoints").fetchone() == (0,)
    assert rds.xinfo_groups(settings.stream) == [] and _applied(pg) == []


def test_a_new_consumer_says_how_many_entries_it_will_replay(settings: Settings, pg: Any) -> None:
    _publish(settings, 3)
    first = unilog(settings, "consume", HANDLER, "--name", "cli", "--once")
    assert first.returncode == 0, first.stderr
    (line,) = _announced(first)
    assert line["event"] == "new consumer replays 3 retained entries" and line["level"] == "warning", line
    assert (line["consumer"], line["stream"], line["entries"], line["start"]) == ("cli", settings.stream, 3, "start")
    assert line["hint"] == "--from end starts after the last entry instead"
    _publish(settings, 1, first=3)
    again = unilog(settings, "consume", HANDLER, "--name", "cli", "--once")
    assert again.returncode == 0 and _announced(again) == [], again.stdout
    assert _applied(pg) == [0, 1, 2, 3]


def test_from_end_starts_a_new_consumer_after_the_last_entry(settings: Settings, pg: Any) -> None:
    _publish(settings, 3)
    result = unilog(settings, "consume", HANDLER, "--name", "cli", "--from", "end", "--once")
    assert result.returncode == 0, result.stderr
    assert [e["event"] for e in _announced(result)] == ["new consumer starts after the last entry"], result.stdout
    _publish(settings, 2, first=3)
    assert unilog(settings, "consume", HANDLER, "--name", "cli", "--once").returncode == 0
    assert _applied(pg) == [3, 4]


def test_from_an_id_starts_after_that_entry(settings: Settings, pg: Any, rds: Any) -> None:
    _publish(settings, 4)
    second = rds.xrange(settings.stream)[1][0]
    result = unilog(settings, "consume", HANDLER, "--name", "cli", "--from", second, "--once")
    assert result.returncode == 0, result.stderr
    (line,) = _announced(result)
    assert (line["entries"], line["start"]) == (2, second) and "hint" not in line, line
    assert _applied(pg) == [2, 3]


def test_from_an_id_past_the_end_is_refused(settings: Settings, pg: Any, rds: Any) -> None:
    _publish(settings, 1)
    ((last, _),) = rds.xrange(settings.stream)
    past = f"{int(last.split('-')[0]) + 1000}-0"
    result = unilog(settings, "consume", HANDLER, "--name", "cli", "--from", past, "--once")
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert "is after the last entry" in one_line(result)
    assert pg.execute("SELECT count(*) FROM unilog_checkpoints").fetchone() == (0,)


def test_from_is_refused_for_a_consumer_that_has_a_checkpoint(settings: Settings, pg: Any) -> None:
    _publish(settings, 2)
    assert unilog(settings, "consume", HANDLER, "--name", "cli", "--once").returncode == 0
    _publish(settings, 1, first=2)
    result = unilog(settings, "consume", HANDLER, "--name", "cli", "--from", "end", "--once")
    assert result.returncode == ExitCode.USAGE, result.stderr
    line = one_line(result)
    assert "consumer 'cli' already has a checkpoint" in line and "unilog consumer reset cli" in line, line
    assert _applied(pg) == [0, 1], "nothing was consumed by the refused run"


def test_a_new_group_says_so_and_from_end_starts_it_at_the_end(settings: Settings, pg: Any, rds: Any) -> None:
    _publish(settings, 3)
    told = unilog(settings, "consume", "handlers:group_handler", "--group", "g1", "--once")
    assert told.returncode == 0, told.stderr
    (line,) = _announced(told)
    assert (line["group"], line["entries"]) == ("g1", 3), line
    ended = unilog(settings, "consume", "handlers:group_handler", "--group", "g2", "--from", "end", "--once")
    assert ended.returncode == 0, ended.stderr
    assert [(e["event"], e["group"]) for e in _announced(ended)] == [("new consumer starts after the last entry", "g2")]
    assert {g["name"]: g["last-delivered-id"] for g in rds.xinfo_groups(settings.stream)}["g2"] == (
        rds.xrevrange(settings.stream, count=1)[0][0]
    )
    again = unilog(settings, "consume", "handlers:group_handler", "--group", "g2", "--from", "start", "--once")
    assert again.returncode == ExitCode.USAGE, again.stderr
    assert "group 'g2' already exists" in one_line(again)
    assert len(_applied(pg, "group")) == 3, "g1 applied the three; g2 none"
