"""The asyncio group worker on real servers: two workers in one event loop share a stream, each record applied
once across double-sends, a crash before the acknowledgement (redelivered, skipped by identity), a crash before the
commit, a poison record (dead-lettered after max_deliveries), and from the command line."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from handlers import async_record_applied

from unilog import AsyncGroupConsumer, Faults, InjectedCrash, Record, Settings, Streamer, emit
from unilog.consume.group import GroupConfig

TESTS = Path(__file__).parent


def produce(settings: Settings, n: int, start: int = 0) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(start, start + n):
            emit(conn, action="create", object="ride", data={"n": i})


def applied(pg: Any) -> list[int]:
    return sorted(r[0] for r in pg.execute("SELECT n FROM applied WHERE consumer = 'g'"))


async def handler(conn: psycopg.AsyncConnection[Any], records: Sequence[Record]) -> None:
    for record in records:
        if record.data["n"] == 13:
            raise ValueError("13 is poison")
        await async_record_applied("g", conn, [record])


def worker(settings: Settings, name: str, faults: Faults | None = None, **kw: Any) -> AsyncGroupConsumer:
    config = GroupConfig(
        group="g", worker=name, batch_size=4, block_ms=50, claim_idle_ms=100, claim_interval=0.1, max_deliveries=2, **kw
    )
    return AsyncGroupConsumer(settings, config, handler, faults=faults or Faults())


@pytest.mark.asyncio
async def test_two_workers_apply_every_record_once_and_dead_letter_the_poison(
    settings: Settings, pg: Any, rds: Any
) -> None:
    produce(settings, 20)
    with Streamer(settings, faults=Faults.scripted(streamer__double_send=[True])) as streamer:
        streamer.drain()
    assert rds.xlen("test-stream") == 40, "every record sent twice"
    a, b = worker(settings, "a"), worker(settings, "b")
    async with a, b:
        # both connected before they race for 40 entries: a connect that stalls (a loaded machine, a collection of
        # the garbage a dropped client left) let the other worker take every entry before the first read
        await asyncio.gather(a.connect(), b.connect())
        await asyncio.gather(a.drain(), b.drain())
        await asyncio.sleep(0.2)  # the poison record's second attempt is due after claim_idle_ms
        await asyncio.gather(a.drain(), b.drain())
    assert applied(pg) == [n for n in range(20) if n != 13], "each once, the poison record never"
    assert a.handled_total > 0 and b.handled_total > 0, "the work was shared"
    letters = rds.xrange("unilog:dlq:{test-stream}")
    # one per copy of the double-sent poison record (as for the threaded worker); replaying both applies it once
    assert [f["dlq_error"] for _, f in letters] == ["ValueError('13 is poison')"] * 2
    assert {f["data"] for _, f in letters} == {'{"n": 13}'}
    assert rds.xpending("test-stream", "g")["pending"] == 0


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "point", ["group.crash_before_ack", "consumer.crash_before_commit", "consumer.crash_mid_batch"]
)
async def test_a_crash_at_each_point_applies_nothing_twice(settings: Settings, pg: Any, point: str) -> None:
    produce(settings, 8)
    Streamer(settings).drain()
    faults = Faults.scripted(**{point.replace(".", "__"): [True]})
    w = worker(settings, "a", faults)
    async with w:
        with pytest.raises(InjectedCrash):
            await w.drain()
        committed = len(applied(pg))
        assert committed == (4 if point == "group.crash_before_ack" else 0), "committed only if the crash was after"
        await w.close()  # a restart: its own pending entries come first, and are skipped if applied
        await w.drain()
    assert applied(pg) == list(range(8))
    assert faults.counts[point] == 1


def test_the_command_line_runs_an_async_group_worker(settings: Settings, pg: Any) -> None:
    produce(settings, 12)
    Streamer(settings).drain()
    env = {
        **os.environ,
        "DATABASE_URL": settings.database_url,
        "REDIS_URL": settings.redis_url,
        "UNILOG_STREAM": "test-stream",
    }
    argv = [sys.executable, "-m", "unilog", "consume", "handlers:async_group_handler", "--group", "g", "--once"]
    result = subprocess.run(argv, cwd=TESTS, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "consumer g handled 12 records" in result.stdout
    assert sorted(r[0] for r in pg.execute("SELECT n FROM applied WHERE consumer = 'group'")) == list(range(12))
