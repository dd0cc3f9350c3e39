"""Issue 46, item 3, for groups: one group worker over several streams (``GroupConfig(streams=...)`` or
``stream_prefix``, both faces, ``unilog consume --group G --streams/--stream-prefix``). A batch and one handler call
hold records of several streams, each naming its stream; identities, acknowledgements, claims, attempt counts and
dead letters stay per stream; a crash between the commit and the acknowledgements applies nothing twice, whether
the worker's own pending entries or another worker's claims bring the records back."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from cli import unilog
from handlers import MULTI_DDL, async_multi_applied, multi_applied
from test_multi_streams import publish, rows, stage

from unilog import AsyncGroupConsumer, Faults, GroupConfig, GroupConsumer, InjectedCrash, Record, Settings


@pytest.fixture
def ddl(settings: Settings, pg: Any) -> Settings:
    pg.execute(MULTI_DDL)
    return settings


def applied(pg: Any) -> dict[str, list[int]]:
    """Each stream's applied records (their ``i``), sorted: a group keeps no order, but each record once."""
    seen: dict[str, list[int]] = defaultdict(list)
    for stream, _seq, i, _batch in rows(pg):
        seen[stream].append(i)
    return {stream: sorted(found) for stream, found in seen.items()}


def pending(rds: Any, streams: Sequence[str], group: str) -> dict[str, int]:
    return {s: rds.xpending(s, group)["pending"] for s in streams}


def test_a_group_over_several_streams_applies_each_record_once_through_a_crash_before_its_acks(
    ddl: Settings, pg: Any, rds: Any
) -> None:
    streams = ["orders", "payments", "refunds"]
    stage(ddl, streams, 5)
    publish(ddl)
    faults = Faults.scripted(group__crash_before_ack=[True, True])
    config = GroupConfig(group="g", streams=tuple(streams), batch_size=30, worker="a")
    with GroupConsumer(ddl, config, multi_applied, faults=faults) as worker:
        worker.connect()
        with pytest.raises(InjectedCrash):
            worker.run_once(block_ms=-1)
        assert len(rows(pg)) == 15, "the batch committed; its acknowledgements never went"
        assert pending(rds, streams, "g") == dict.fromkeys(streams, 5)
        batches: dict[str, set[str]] = defaultdict(set)
        for stream, _seq, _i, batch in rows(pg):
            batches[batch].add(stream)
        assert [len(s) for s in batches.values()] == [3], "one handler call saw every stream"
        worker.close()  # as a restart: its own pending entries come first, each found applied
        worker.connect()
        with pytest.raises(InjectedCrash):
            worker.run_once(block_ms=-1)
        assert len(rows(pg)) == 15, "its own pending entries redelivered, every one skipped by identity"
        assert pending(rds, streams, "g") == dict.fromkeys(streams, 5), "and again left unacknowledged (crashed)"
    # another worker claims what "a" left pending on every stream, and applies none of it again
    claimer = GroupConfig(group="g", streams=tuple(streams), worker="b", claim_idle_ms=0, claim_interval=0)
    with GroupConsumer(ddl, claimer, multi_applied) as worker:
        worker.connect()
        result = worker.run_once(block_ms=-1)
        assert (result.claimed, result.handled, result.skipped) == (15, 0, 15)
    assert pending(rds, streams, "g") == dict.fromkeys(streams, 0)
    assert applied(pg) == {s: list(range(5)) for s in streams}


def test_a_poison_record_is_dead_lettered_on_its_own_stream_and_the_others_go_on(
    ddl: Settings, pg: Any, rds: Any
) -> None:
    stage(ddl, ["s1", "s2"], 4)
    publish(ddl)
    rds.xadd("s2", {"data": "not json"})  # another writer's entry: dead-lettered at once, on s2

    def handler(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
        multi_applied(conn, records)
        if any(r.stream == "s1" and r.data["i"] == 2 for r in records):
            raise ValueError("cannot apply s1's 2")

    config = GroupConfig(
        group="d", streams=("s1", "s2"), max_deliveries=2, claim_idle_ms=0, claim_interval=0, max_backoff=0.01
    )
    with GroupConsumer(ddl, config, handler) as worker:
        worker.connect()
        for _ in range(6):
            worker.run_once(block_ms=-1)
        assert worker.dead_total == 2
    assert applied(pg) == {"s1": [0, 1, 3], "s2": [0, 1, 2, 3]}
    letters = {s: [f["dlq_error"] for _, f in rds.xrange(f"unilog:dlq:{{{s}}}")] for s in ("s1", "s2")}
    assert len(letters["s1"]) == 1 and "cannot apply s1's 2" in letters["s1"][0], letters
    assert len(letters["s2"]) == 1 and letters["s2"][0].startswith("malformed"), letters
    assert pending(rds, ["s1", "s2"], "d") == {"s1": 0, "s2": 0}


@pytest.mark.asyncio
async def test_the_async_face_over_a_prefix_picks_up_a_stream_created_later(ddl: Settings, pg: Any) -> None:
    stage(ddl, ["t.a", "t.b", "other"], 3)
    publish(ddl)

    config = GroupConfig(group="p", stream_prefix="t.", discover_interval=0.2, block_ms=50)
    async with AsyncGroupConsumer(ddl, config, async_multi_applied) as worker:
        assert await worker.drain() == 6
        stage(ddl, ["t.c"], 4)  # a stream created after the worker started: its group starts at its beginning
        publish(ddl)
        deadline = time.monotonic() + 20
        while len(rows(pg)) < 10 and time.monotonic() < deadline:
            await worker.run_once()
    assert applied(pg) == {"t.a": [0, 1, 2], "t.b": [0, 1, 2], "t.c": [0, 1, 2, 3]}


def test_the_command_line_runs_a_group_over_several_streams(ddl: Settings, pg: Any, rds: Any) -> None:
    stage(ddl, ["x1", "x2", "y1"], 3)
    publish(ddl)
    result = unilog(ddl, "consume", "handlers:multi_applied", "--group", "cg", "--streams", "x1,y1", "--once")
    assert result.returncode == 0, result.stderr
    assert "handled 6 records" in result.stdout
    argv = ["consume", "handlers:async_multi_applied", "--group", "ag", "--stream-prefix", "x", "--once"]
    result = unilog(ddl, *argv)
    assert result.returncode == 0 and "handled 6 records" in result.stdout, result.stderr
    counts = dict(pg.execute("SELECT stream, count(*) FROM multi_applied GROUP BY stream").fetchall())
    assert counts == {"x1": 6, "x2": 3, "y1": 3}, "x1 by both groups, x2 by the prefix's, y1 by the list's"
    assert {g["name"] for g in rds.xinfo_groups("x1")} == {"cg", "ag"}


def test_a_read_over_more_streams_than_a_batch_is_applied_in_batches_and_a_later_one_crashing_loses_nothing(
    ddl: Settings, pg: Any, rds: Any
) -> None:
    """A read asks each stream for max(1, batch_size / streams) entries, and what it delivers is the worker's: over
    more streams than ``batch_size`` it is more than a batch, applied ``batch_size`` a transaction. A crash in the
    second leaves its entries pending on the worker, read again first after it reconnects: each applied once."""
    streams = [f"c{k}" for k in range(5)]
    stage(ddl, streams, 2)
    publish(ddl)
    faults = Faults.scripted(consumer__crash_before_commit=[False, True])
    config = GroupConfig(group="k", streams=tuple(streams), batch_size=2, worker="a")
    with GroupConsumer(ddl, config, multi_applied, faults=faults) as worker:
        worker.connect()
        with pytest.raises(InjectedCrash):
            worker.run_once(block_ms=-1)  # 5 entries delivered (one a stream): 2 applied, the next 2 crashed
        assert len(rows(pg)) == 2
        assert sum(pending(rds, streams, "k").values()) == 3, "the crashed batch's and the third's, all pending"
        worker.close()
        assert worker.drain() == 8
    batches: dict[str, int] = defaultdict(int)
    for _stream, _seq, _i, batch in rows(pg):
        batches[batch] += 1
    assert max(batches.values()) <= 2, "never more than batch_size records a transaction"
    assert applied(pg) == {s: [0, 1] for s in streams}
    assert pending(rds, streams, "k") == dict.fromkeys(streams, 0)


def test_a_prefix_that_matches_no_stream_yet_waits_instead_of_spinning(ddl: Settings) -> None:
    config = GroupConfig(group="idle", stream_prefix="nothing-yet.", block_ms=200)
    with GroupConsumer(ddl, config, multi_applied) as worker:
        worker.connect()
        started = time.monotonic()
        assert worker.run_once().read == 0
        assert time.monotonic() - started >= 0.19, "an idle pass waits its block_ms"


def test_prune_over_several_streams_advances_each_watermark_and_leaves_a_locked_stream_for_later(
    ddl: Settings, pg: Any
) -> None:
    streams = ["p1", "p2", "p3"]
    stage(ddl, streams, 4)
    publish(ddl)
    config = GroupConfig(group="pr", streams=tuple(streams), prune_interval=3600)
    holder = psycopg.connect(ddl.conninfo)  # another worker pruning p2: its transaction-level prune lock
    try:
        holder.execute("SELECT pg_advisory_xact_lock(hashtextextended('unilog.group:pr:p2', 0))")
        with GroupConsumer(ddl, config, multi_applied) as worker:
            assert worker.drain() == 12
            assert worker.prune() == 8, "p1's and p3's identities pruned; p2's left to the worker holding its lock"
            marks = dict(
                pg.execute("SELECT stream, seq FROM unilog_group_watermarks WHERE group_name = 'pr'").fetchall()
            )
            assert marks == {"p1": 4, "p3": 4}
            holder.rollback()
            assert worker.prune() == 4, "p2 stayed to prune, and is pruned once free"
        left = pg.execute("SELECT count(*) FROM unilog_processed WHERE group_name = 'pr'").fetchone()[0]
        assert left == 0
    finally:
        holder.close()


def test_a_prefix_past_max_streams_reads_max_streams_of_them(ddl: Settings, pg: Any) -> None:
    stage(ddl, ["m.a", "m.b", "m.c"], 2)
    publish(ddl)
    config = GroupConfig(group="mx", stream_prefix="m.", max_streams=2)
    with GroupConsumer(ddl, config, multi_applied) as worker:
        assert worker.drain() == 4, "two streams of the three, each whole"
        assert len(worker.streams) == 2
    assert sorted(len(found) for found in applied(pg).values()) == [2, 2]
