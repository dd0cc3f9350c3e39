"""Issue 46, item 3: one checkpoint consumer over several streams (``MultiConsumer``, ``AsyncMultiConsumer``,
``unilog consume --streams/--stream-prefix``). One handler call gets records of several streams, each naming its
stream; a checkpoint row per stream (``<name>:<stream>``), all committed in the handler's transaction; per-stream
order; crashes before the commit apply nothing twice; a prefix picks up streams created later; poison records and
malformed entries are settled per stream; and 1,000 streams go through a kill -9 of the consumer and the streamer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cli import one_line, unilog
from handlers import MULTI_DDL, multi_applied

from unilog import (
    AsyncMultiConsumer,
    Consumer,
    ConsumerConfig,
    Faults,
    InjectedCrash,
    MultiConsumer,
    Record,
    Settings,
    Streamer,
    StreamRewound,
    emit_many,
)
from unilog.cli import ExitCode
from unilog.consume.lanes import checkpoint_name, fair_cut, per_stream_count, split_checkpoint_name
from unilog.engine import RedisStreams, connect
from unilog.errors import ConfigurationError
from unilog.harness.pytest_plugin import running
from unilog.ops.dlq import list_letters, replay

TESTS = Path(__file__).parent


def stage(settings: Settings, streams: Sequence[str], per_stream: int, start: int = 0) -> None:
    """``per_stream`` records on each of ``streams`` (data ``i`` from ``start``), round-robin over the streams."""
    records = [
        {"action": "a", "object": "o", "data": {"i": i}, "stream": s}
        for i in range(start, start + per_stream)
        for s in streams
    ]
    with psycopg.connect(settings.conninfo) as conn:
        for lo in range(0, len(records), 1000):
            emit_many(conn, records[lo : lo + 1000])
            conn.commit()


def publish(settings: Settings) -> None:
    with Streamer(settings) as streamer:
        streamer.drain()


def rows(pg: Any) -> list[tuple[str, int, int, str]]:
    return pg.execute("SELECT stream, seq, i, batch FROM multi_applied ORDER BY id").fetchall()


def assert_once_in_order(pg: Any, expected: dict[str, int]) -> None:
    """Every stream of ``expected`` applied exactly its ``expected[stream]`` records, each once, in stream order."""
    seen: dict[str, list[int]] = defaultdict(list)
    for stream, _seq, i, _batch in rows(pg):
        seen[stream].append(i)
    assert set(seen) == set(expected)
    for stream, n in expected.items():
        assert seen[stream] == list(range(n)), stream


@pytest.fixture
def ddl(settings: Settings, pg: Any) -> Settings:
    pg.execute(MULTI_DDL)
    return settings


def test_one_batch_spans_streams_and_a_crash_before_its_commit_applies_nothing_twice(ddl: Settings, pg: Any) -> None:
    streams = ["orders", "payments", "refunds"]
    stage(ddl, streams, 5)
    publish(ddl)
    faults = Faults.scripted(consumer__crash_before_commit=[True])
    config = ConsumerConfig(name="c", streams=tuple(streams), batch_size=30)
    with MultiConsumer(ddl, config, multi_applied, faults=faults) as consumer:
        with pytest.raises(InjectedCrash):
            consumer.run_once()
        assert rows(pg) == [], "the crashed batch's effects were rolled back"
        consumer.close()
        assert consumer.drain() == 15
        assert consumer.drain() == 0
    assert_once_in_order(pg, dict.fromkeys(streams, 5))
    batches: dict[str, set[str]] = defaultdict(set)
    for stream, _seq, _i, batch in rows(pg):
        batches[batch].add(stream)
    assert max(len(s) for s in batches.values()) >= 2, "one handler call saw several streams"
    saved = dict(pg.execute("SELECT name, stream FROM unilog_checkpoints ORDER BY name").fetchall())
    assert saved == {f"c:{s}": s for s in streams}, "a checkpoint row per stream, named <name>:<stream>"
    tops = {
        s: pg.execute("SELECT last_id FROM unilog_checkpoints WHERE stream = %s", (s,)).fetchone()[0] for s in streams
    }
    assert all(top != "0-0" for top in tops.values())


def test_a_consumer_moved_from_one_stream_to_several_refuses_until_its_checkpoint_is_carried_over(
    ddl: Settings, pg: Any
) -> None:
    """A consumer that ran over one stream keeps its checkpoint in the row named after it; over several streams it
    keeps ``<name>:<stream>``. Started over several, it refuses in one line that names the command carrying the
    checkpoint over (a new row would start at the stream's beginning and apply again what the consumer applied),
    and creates no row; once carried over, it applies only what is new."""
    stage(ddl, ["orders"], 3)
    publish(ddl)
    with Consumer(ddl, ConsumerConfig(name="billing", stream="orders"), multi_applied) as consumer:
        assert consumer.drain() == 3
    stage(ddl, ["orders", "payments"], 2, start=3)
    publish(ddl)
    config = ConsumerConfig(name="billing", streams=("orders", "payments"))
    with MultiConsumer(ddl, config, multi_applied) as consumer, pytest.raises(ConfigurationError) as refused:
        consumer.drain()
    last_id = pg.execute("SELECT last_id FROM unilog_checkpoints WHERE name = 'billing'").fetchone()[0]
    command = f"unilog consumer reset billing:orders --stream orders --to {last_id}"
    assert command in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
    argv = ["consume", "handlers:multi_applied", "--name", "billing", "--streams", "orders,payments", "--once"]
    refused_cli = unilog(ddl, *argv)
    assert refused_cli.returncode == ExitCode.CONFIG and command in one_line(refused_cli), refused_cli.stderr
    assert pg.execute("SELECT count(*) FROM unilog_checkpoints WHERE name LIKE 'billing:%'").fetchone()[0] == 0
    assert len(rows(pg)) == 3, "nothing applied again"
    result = unilog(ddl, *command.split()[1:])
    assert result.returncode == 0, result.stderr
    with MultiConsumer(ddl, config, multi_applied) as consumer:
        assert consumer.drain() == 4
    applied: dict[str, list[int]] = defaultdict(list)
    for stream, _seq, i, _batch in rows(pg):
        applied[stream].append(i)
    assert applied == {"orders": [0, 1, 2, 3, 4], "payments": [3, 4]}


@pytest.mark.asyncio
async def test_the_async_face_and_a_prefix_picks_up_a_stream_created_later(ddl: Settings, pg: Any) -> None:
    stage(ddl, ["t.a", "t.b", "other"], 3)
    publish(ddl)

    async def handler(conn: psycopg.AsyncConnection[Any], records: Sequence[Record]) -> None:
        async with conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO multi_applied (stream, seq, i, batch) VALUES (%s, %s, %s, 'x')",
                [(r.stream, r.seq, r.data["i"]) for r in records],
            )

    config = ConsumerConfig(name="p", stream_prefix="t.", discover_interval=0.2, block_ms=50)
    async with AsyncMultiConsumer(ddl, config, handler) as consumer:
        assert await consumer.drain() == 6
        stage(ddl, ["t.c"], 4)  # a stream created after the consumer started
        publish(ddl)
        deadline = time.monotonic() + 20
        while len(rows(pg)) < 10 and time.monotonic() < deadline:
            await consumer.run_once()
    assert_once_in_order(pg, {"t.a": 3, "t.b": 3, "t.c": 4})


def test_a_poison_record_and_a_malformed_entry_are_settled_per_stream(ddl: Settings, pg: Any, rds: Any) -> None:
    stage(ddl, ["s1", "s2"], 4)
    publish(ddl)
    rds.xadd("s2", {"data": "not json"})  # another writer's entry: dead-lettered, the rest applied
    stage(ddl, ["s2"], 1, start=4)
    publish(ddl)

    def handler(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
        multi_applied(conn, records)
        if any(r.stream == "s1" and r.data["i"] == 2 for r in records):
            raise ValueError("cannot apply s1's 2")

    config = ConsumerConfig(name="d", streams=("s1", "s2"), max_attempts=2, on_poison="dead-letter", max_backoff=0.01)
    with MultiConsumer(ddl, config, handler) as consumer:
        for _ in range(10):
            try:
                consumer.run_once(block_ms=-1)
            except ValueError:
                consumer.after_handler_failure(ValueError())
        assert consumer.drain() == 0
    applied = defaultdict(list)
    for stream, _seq, i, _batch in rows(pg):
        applied[stream].append(i)
    assert applied["s1"] == [0, 1, 3], "s1's poison record dead-lettered, the records around it applied once"
    assert applied["s2"] == [0, 1, 2, 3, 4], "s2 untouched by s1's poison; its malformed entry skipped"
    assert [f["dlq_consumer"] for _, f in rds.xrange("unilog:dlq:{s1}")] == ["d:s1"]
    assert [f["dlq_consumer"] for _, f in rds.xrange("unilog:dlq:{s2}")] == ["d:s2"]
    # the poison record's replay is addressed to its stream's row, which holds it: applied once, after the fix
    api = RedisStreams(connect(ddl.redis_url))
    try:
        (letter,) = list_letters(api, "s1", consumer="d:s1")
        replay(api, "s1", letter)
    finally:
        api.close()
    with MultiConsumer(ddl, config, multi_applied) as consumer:
        assert consumer.drain() == 1
        assert consumer.drain() == 0
    assert [i for stream, _seq, i, _batch in rows(pg) if stream == "s1"] == [0, 1, 3, 2], "the replay, once"


def test_a_cut_batch_keeps_a_prefix_of_each_stream_and_turns_between_streams() -> None:
    read = {s: [(f"{i}-0".encode(), {}) for i in range(1, 5)] for s in ("a", "b", "c")}
    assert fair_cut(read, 12) == read
    for turn in range(6):
        cut = fair_cut(read, 6, turn)
        assert sum(len(entries) for entries in cut.values()) == 6
        assert all(entries == read[s][: len(entries)] for s, entries in cut.items()), "a prefix of each stream"
    assert {next(iter(fair_cut(read, 6, turn))) for turn in range(3)} == {"a", "b", "c"}, "every stream goes first"
    assert per_stream_count(1000, 1) == 1000 and per_stream_count(1000, 1000) == 10 and per_stream_count(5, 1000) == 5
    assert split_checkpoint_name(checkpoint_name("c", "tenant:1")) == ("c", "tenant:1")
    assert split_checkpoint_name("c") is None


def test_a_stream_that_lost_its_entries_stops_the_consumer_naming_it(ddl: Settings, pg: Any, rds: Any) -> None:
    stage(ddl, ["r1", "r2"], 2)
    publish(ddl)
    config = ConsumerConfig(name="r", streams=("r1", "r2"))
    with MultiConsumer(ddl, config, multi_applied) as consumer:
        assert consumer.drain() == 4
        rds.delete("r2")  # Redis lost the stream (a restart without persistence)
        time.sleep(1.05)  # rewinds are looked for once a second (up to 250 streams)
        with pytest.raises(StreamRewound, match="'r2'"):
            consumer.run_once(block_ms=-1)


def test_two_copies_of_one_consumer_take_turns_and_apply_each_record_once(ddl: Settings, pg: Any) -> None:
    """Two processes' worth of one consumer (same name, same streams) at once: they lock overlapping sets of rows in
    one order, so they wait for each other (no deadlock), and a copy whose rows moved underneath re-reads."""
    streams = [f"two-{k}" for k in range(30)]
    stage(ddl, streams, 10)
    publish(ddl)
    config = ConsumerConfig(name="twin", streams=tuple(streams), batch_size=50, block_ms=50)
    copies = [MultiConsumer(ddl, config, multi_applied) for _ in range(2)]
    try:
        with running(copies[0].run), running(copies[1].run):
            deadline = time.monotonic() + 60
            while len(rows(pg)) < 300 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)  # a double apply would show here
    finally:
        for copy in copies:
            copy.close()
    assert_once_in_order(pg, dict.fromkeys(streams, 10))
    assert sum(copy.handled_total for copy in copies) == 300, "the copies' commits add up to each record once"


def test_the_single_stream_consumer_refuses_a_config_of_several(settings: Settings) -> None:
    with pytest.raises(ConfigurationError, match="MultiConsumer"):
        Consumer(settings, ConsumerConfig(name="c", streams=("a", "b")), multi_applied)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--streams", ""], "empty stream name"),
        (["--streams", "a,,b"], "empty stream name"),
        (["--streams", "a,a"], "named twice"),
        (["--streams", "a,b c"], "invalid stream name"),
        (["--stream-prefix", "t*"], "stream_prefix"),
        (["--stream", "a", "--streams", "b,c"], "not both"),
        (["--group", "g", "--stream", "a", "--stream-prefix", "t"], "stream_prefix (several), not both"),
        (["--group", "g", "--streams", "a,b", "--from", "end"], "--from applies to a consumer of one stream"),
        (["--name", "c", "--partitioned", "--stream-prefix", "t"], "--stream-prefix: not a setting of a partitioned"),
        (["--name", "c", "--streams", "a,b", "--from", "end"], "--from applies to a consumer of one stream"),
    ],
)
def test_the_command_line_refuses_bad_stream_lists_in_one_line(settings: Settings, args: list[str], says: str) -> None:
    """Each refusal is one line and a named exit code: a bad setting CONFIG, options that contradict USAGE."""
    if not args[0].startswith(("--group", "--name")):
        args = ["--name", "c", *args]
    result = unilog(settings, "consume", "handlers:multi_applied", *args, "--once")
    usage = "--from" in args
    assert result.returncode == (ExitCode.USAGE if usage else ExitCode.CONFIG), result.stderr
    assert says in one_line(result)


def test_the_command_line_consumes_several_streams(ddl: Settings, pg: Any) -> None:
    stage(ddl, ["x1", "x2", "y1"], 3)
    publish(ddl)
    result = unilog(ddl, "consume", "handlers:multi_applied", "--name", "cli", "--streams", "x1,y1", "--once")
    assert result.returncode == 0, result.stderr
    assert "handled 6 records" in result.stdout
    result = unilog(ddl, "consume", "handlers:multi_applied", "--name", "cli2", "--stream-prefix", "x", "--once")
    assert result.returncode == 0, result.stderr
    counts = dict(pg.execute("SELECT stream, count(*) FROM multi_applied GROUP BY stream").fetchall())
    assert counts == {"x1": 6, "x2": 3, "y1": 3}, "x1 by both consumers, x2 by the prefix's, y1 by the list's"
    # a stream's row is an ordinary checkpoint: reset alone, by its name, it is applied again, and only it
    result = unilog(ddl, "consumer", "reset", "cli:x1", "--to", "beginning")
    assert result.returncode == 0, result.stderr
    result = unilog(ddl, "consume", "handlers:multi_applied", "--name", "cli", "--streams", "x1,y1", "--once")
    assert "handled 3 records" in result.stdout, result.stdout + result.stderr
    result = unilog(ddl, "consume", "handlers:async_multi_applied", "--name", "acli", "--stream-prefix", "y", "--once")
    assert result.returncode == 0 and "handled 3 records" in result.stdout, result.stderr
    assert pg.execute("SELECT count(*) FROM multi_applied WHERE batch = 'async'").fetchone()[0] == 3
    status = unilog(ddl, "status", "--json")  # each row shows as a consumer of its stream, registered there
    assert status.returncode == 0, status.stderr
    assert '"cli:x1"' in status.stdout and '"cli2:x2"' in status.stdout, status.stdout[:3000]


# -- the done-when test: 1,000 streams, one consumer process, kill -9 of the consumer and of the streamer ----------

TENANTS = [f"tenant-{n:04d}" for n in range(1000)]


def spawn(settings: Settings, *argv: str) -> subprocess.Popen[bytes]:
    """``unilog ARGV`` through the installed console script, in ``tests/`` (so ``handlers:...`` imports); a
    consumer's batches take 0.1 s more each (``SLOW_HANDLER``), so a kill lands while it has work left."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNILOG_")}
    env.update(DATABASE_URL=settings.database_url, REDIS_URL=settings.redis_url, SLOW_HANDLER="0.1")
    script = Path(sys.executable).with_name("unilog")
    return subprocess.Popen(
        [str(script), "--log-json", *argv], env=env, cwd=TESTS, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def kill9(process: subprocess.Popen[bytes]) -> None:
    assert process.poll() is None, process.stderr.read().decode()[-2000:] if process.stderr else ""
    os.kill(process.pid, signal.SIGKILL)
    process.wait(10)


def published(rds: Any) -> int:
    pipe = rds.pipeline(transaction=False)
    for name in TENANTS:
        pipe.xlen(name)
    return sum(pipe.execute())


def wait_until(check: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def applied_count(pg: Any) -> int:
    return pg.execute("SELECT count(*) FROM multi_applied").fetchone()[0]


def test_one_consumer_applies_1000_streams_exactly_once_in_order_through_kill_9(
    ddl: Settings, pg: Any, rds: Any
) -> None:
    """Staged in three waves (2, 2 and 1 records per stream), one consumer process over ``--stream-prefix
    tenant-``: the consumer is killed (SIGKILL) mid-run, then the streamer mid-drain, both restarted; every record
    of every stream is applied once, in its stream's order."""
    consume = ["consume", "handlers:multi_applied", "--name", "k", "--stream-prefix", "tenant-"]
    consume += ["--discover-interval", "0.5", "--block-ms", "200", "--batch-size", "500"]
    stage(ddl, TENANTS, 2)
    streamer, consumer = spawn(ddl, "streamer", "--batch-size", "100"), spawn(ddl, *consume)
    try:
        wait_until(lambda: applied_count(pg) >= 500, "the first records applied")
        kill9(consumer)
        assert applied_count(pg) < 2000, "the consumer was killed with records of the first wave left to apply"
        stage(ddl, TENANTS, 2, start=2)
        wait_until(lambda: published(rds) >= 2200, "the second wave partly published")
        kill9(streamer)
        streamer, consumer = spawn(ddl, "streamer", "--batch-size", "100"), spawn(ddl, *consume)
        stage(ddl, TENANTS, 1, start=4)
        wait_until(lambda: applied_count(pg) >= 3000, "the restarted consumer applying")
        kill9(consumer)  # again, while the third wave flows
        consumer = spawn(ddl, *consume)
        wait_until(lambda: applied_count(pg) >= 5000, "every record applied", timeout=90)
        time.sleep(1)  # a double apply would show here
    finally:
        for process in (streamer, consumer):
            if process.poll() is None:
                process.terminate()
                process.wait(20)
    assert applied_count(pg) == 5000
    assert_once_in_order(pg, dict.fromkeys(TENANTS, 5))
    saved = pg.execute("SELECT count(*) FROM unilog_checkpoints WHERE name LIKE 'k:tenant-%'").fetchone()[0]
    assert saved == 1000
