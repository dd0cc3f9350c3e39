"""Clear errors at the edges: a Redis key of another type where a stream should be is one line and exit code 3,
never a retry loop, a traceback or the publish script's internals, and it loses nothing."""

from __future__ import annotations

from typing import Any

import psycopg
from cli import one_line, unilog
from structlog.testing import capture_logs

from unilog import Consumer, ConsumerConfig, Settings, emit, emit_many
from unilog.cli import ExitCode


def test_a_string_at_the_streams_name_stops_the_streamer_in_one_line_and_keeps_the_records(
    settings: Settings, pg: Any, rds: Any
) -> None:
    rds.set(settings.stream, "another application's value")
    with psycopg.connect(settings.conninfo) as conn:
        emit(conn, action="create", object="ride", data={"n": 1})
    result = unilog(settings, "streamer", "--once")
    assert result.returncode == ExitCode.CONFIG, result.stderr
    line = one_line(result)
    assert f"the Redis key '{settings.stream}' holds a string, not a stream" in line, line
    assert "script" not in line.lower() and "lua" not in line.lower(), line
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone() == (1,), "nothing lost"
    rds.delete(settings.stream)
    done = unilog(settings, "streamer", "--once")
    assert done.returncode == 0 and "streamed 1 records" in done.stdout, done.stderr


def test_a_hash_at_the_streams_name_stops_a_consumer_and_a_group_worker_in_one_line(
    settings: Settings, rds: Any
) -> None:
    rds.hset(settings.stream, "field", "value")
    for mode in (["--name", "cli"], ["--group", "g"]):
        result = unilog(settings, "consume", "handlers:cli_handler", *mode, "--once")
        assert result.returncode == ExitCode.CONFIG, result.stderr
        assert "holds a hash, not a stream" in one_line(result)


def test_a_consumer_of_a_stream_that_does_not_exist_says_so_and_lists_those_that_do(
    settings: Settings, rds: Any
) -> None:
    rds.xadd("rides", {"data": "{}"})
    config = ConsumerConfig(name="c0", stream="ridez")  # the typo
    with capture_logs() as logs, Consumer(settings, config, lambda conn, records: None) as consumer:
        consumer.connect()
    warnings = [e for e in logs if e["event"].startswith("the stream does not exist yet")]
    assert len(warnings) == 1 and warnings[0]["stream"] == "ridez" and "rides" in warnings[0]["existing_streams"]
    with capture_logs() as logs, Consumer(settings, ConsumerConfig(name="c1", stream="rides"), print) as consumer:
        consumer.connect()
    assert not [e for e in logs if e["event"].startswith("the stream does not exist")]


def test_a_string_at_one_of_many_streams_names_it_and_stops_the_streamer_in_one_line(
    settings: Settings, pg: Any, rds: Any
) -> None:
    """Over many streams the batch goes in script calls of many streams each; one stream's key holding a string
    refused the whole call, quoted as the script's internals, and ``--once`` exited 1 for a retry that could never
    succeed. The stream is named as over one stream, and the streams appended before it are not appended twice."""
    names = [f"tenant-{k:03d}" for k in range(300)]
    rds.set(names[150], "another application's value")
    with psycopg.connect(settings.conninfo) as conn:
        for name in names:
            emit_many(conn, [{"action": "a", "object": "o", "data": {"n": n}, "stream": name} for n in range(3)])
    result = unilog(settings, "streamer", "--once")
    assert result.returncode == ExitCode.CONFIG, result.stderr
    line = one_line(result)
    assert f"the Redis key '{names[150]}' holds a string, not a stream" in line, line
    assert "script" not in line.lower() and "lua" not in line.lower(), line
    staged = "SELECT count(*) FROM staged_log_records WHERE stream = %s"
    assert pg.execute(staged, (names[150],)).fetchone() == (3,), "nothing lost"
    rds.delete(names[150])
    done = unilog(settings, "streamer", "--once")
    assert done.returncode == 0, done.stderr
    assert {name: rds.xlen(name) for name in names} == dict.fromkeys(names, 3), "each record once"
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone() == (0,)
