"""Entries that are not unilog records (another service's XADD, damaged data) never crash a consumer: by default
they go to the dead letters with the reason and consumption goes on past them; with `stop`, the consumer stops with
one line naming the entry. Entries with JSON data but no unilog position are applied, in stream order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from handlers import record_applied

from unilog import (
    Consumer,
    ConsumerConfig,
    Faults,
    GroupConfig,
    GroupConsumer,
    InjectedCrash,
    MalformedEntry,
    Record,
    Settings,
    Streamer,
    emit,
)
from unilog.cli import ExitCode
from unilog.engine import RedisStreams, connect
from unilog.ops.dlq import list_letters

TESTS = Path(__file__).parent


def produce(settings: Settings, ns: Sequence[int]) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for n in ns:
            emit(conn, action="create", object="ride", data={"n": n})
    with Streamer(settings) as streamer:
        streamer.drain()


def foreign(rds: Any, stream: str, **fields: str) -> str:
    """Another service appends to the stream directly."""
    return rds.xadd(stream, fields)


def stream_with_junk(settings: Settings, rds: Any) -> dict[str, str]:
    """Good records 0..2, a non-JSON entry, a damaged position, a foreign JSON entry, then good records 3..4."""
    produce(settings, [0, 1, 2])
    junk = {
        "not json": foreign(rds, settings.stream, data="{oops", action="create", object="ride"),
        "bad position": foreign(rds, settings.stream, data="{}", producer="x", epoch="1", seq="many"),
        "foreign": foreign(rds, settings.stream, data=json.dumps({"n": 100}), action="sold", object="ticket"),
    }
    produce(settings, [3, 4])
    return junk


def applied(pg: Any, name: str) -> list[Any]:
    return [r[0] for r in pg.execute("SELECT n FROM applied WHERE consumer = %s ORDER BY entry_id", (name,))]


def handler_for(name: str) -> Any:
    def handle(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
        for r in records:
            _ = r.data  # decoding: where a non-JSON entry is found
        record_applied(name, conn, records)

    return handle


def test_checkpoint_consumers_dead_letter_malformed_entries_and_agree(settings: Settings, pg: Any, rds: Any) -> None:
    junk = stream_with_junk(settings, rds)
    for name in ("c0", "c1"):
        with Consumer(settings, ConsumerConfig(name=name), handler_for(name)) as consumer:
            consumer.drain()
            assert consumer.malformed_total == 2
        assert applied(pg, name) == [0, 1, 2, 100, 3, 4], "the good ones once, the foreign JSON one in stream order"
    api = RedisStreams(connect(settings.redis_url))
    letters = list_letters(api, settings.stream)
    api.close()
    by_consumer = {(d.consumer, d.original_id): d.error for d in letters}
    for name in ("c0", "c1"):
        assert "data is not JSON" in by_consumer[(name, junk["not json"])]
        assert "bad position fields" in by_consumer[(name, junk["bad position"])]
    assert len(letters) == 4, "each consumer dead-letters each malformed entry once"
    last = rds.xrevrange(settings.stream, count=1)[0][0]
    row = pg.execute("SELECT last_id FROM unilog_checkpoints WHERE name = 'c0'").fetchone()
    assert row[0] == last, "the checkpoint went past them"


def test_a_crash_before_commit_replays_the_batch_and_still_applies_each_record_once(
    settings: Settings, pg: Any, rds: Any
) -> None:
    junk = stream_with_junk(settings, rds)
    faults = Faults.scripted(consumer__crash_before_commit=[True])  # after the dead-lettering, before the commit
    crashes = 0
    with Consumer(settings, ConsumerConfig(name="c0"), handler_for("c0"), faults=faults) as consumer:
        for _ in range(4):
            try:
                consumer.run_once(block_ms=-1)
            except InjectedCrash:
                crashes += 1
                consumer.close()
    assert crashes == 1
    assert applied(pg, "c0") == [0, 1, 2, 100, 3, 4], "nothing lost, nothing applied twice"
    api = RedisStreams(connect(settings.redis_url))
    originals = [d.original_id for d in list_letters(api, settings.stream)]
    api.close()
    assert sorted(set(originals)) == sorted([junk["not json"], junk["bad position"]])
    assert len(originals) == 4, "dead-lettered before the commit: a crash may copy one twice, never lose it"


def test_stop_policy_names_the_entry(settings: Settings, rds: Any) -> None:
    junk = stream_with_junk(settings, rds)
    config = ConsumerConfig(name="c0", on_malformed="stop")
    with Consumer(settings, config, handler_for("c0")) as consumer, pytest.raises(MalformedEntry) as caught:
        consumer.drain()
    # the damaged position is found while the batch is read, before any handler decodes the non-JSON one
    assert caught.value.entry_id == junk["bad position"] and "bad position fields" in str(caught.value)


def test_the_command_stops_with_exit_code_10_and_one_line(settings: Settings, rds: Any) -> None:
    junk = stream_with_junk(settings, rds)
    env = {**os.environ, "DATABASE_URL": settings.database_url, "REDIS_URL": settings.redis_url}
    env["UNILOG_STREAM"] = settings.stream
    argv = [sys.executable, "-m", "unilog", "--log-json", "consume", "handlers:cli_handler", "--name", "cli"]
    result = subprocess.run(
        [*argv, "--once", "--on-malformed", "stop"], env=env, cwd=TESTS, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == ExitCode.MALFORMED, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert (len(lines) == 1 and junk["bad position"] in lines[0]) or junk["not json"] in lines[0], result.stderr


def test_group_workers_dead_letter_malformed_entries_at_once(settings: Settings, pg: Any, rds: Any) -> None:
    junk = stream_with_junk(settings, rds)
    config = GroupConfig(group="g", max_deliveries=5)
    with GroupConsumer(settings, config, handler_for("g")) as worker:
        worker.drain()
        assert worker.dead_total == 2
    assert sorted(applied(pg, "g")) == [0, 1, 2, 3, 4, 100]
    api = RedisStreams(connect(settings.redis_url))
    letters = {d.original_id: d for d in list_letters(api, settings.stream, "g")}
    api.close()
    assert set(letters) == {junk["not json"], junk["bad position"]}
    assert all(d.attempts == 1 and d.error.startswith("malformed:") for d in letters.values()), "no retries first"
    assert rds.xpending(settings.stream, "g")["pending"] == 0


def test_the_spark_source_reads_junk_entries_without_crashing() -> None:
    pytest.importorskip("pyarrow")
    from unilog.spark.columns import record_batch

    chunk = [
        [b"1-0", [b"data", b'{"n": 1}', b"producer", b"p", b"epoch", b"1", b"seq", b"1", b"action", b"create"]],
        [b"2-0", [b"data", b"{oops", b"producer", b"x", b"epoch", b"1", b"seq", b"many"]],
        [b"3-0", [b"data", b"\xff\xfe", b"action", b"\xff"]],
    ]
    batch = record_batch("s", chunk).to_pydict()
    assert batch["seq"] == [1, None, None] and batch["epoch"] == [1, 1, None]
    assert batch["data"][0] == '{"n": 1}' and batch["data"][1] == "{oops" and batch["action"][2] == "\ufffd"
