"""Issue 46: a backlog spread over thousands of streams drains without a lock and a log line per stream, a pass
stays within its deadline, a deadline that fires is one line (and a named exit code in ``--once``), and the running
streamer makes progress past a stream that is stuck."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg
import pytest
import redis

from unilog import Settings, Streamer, StreamerConfig, emit_many
from unilog.cli.common import ExitCode
from unilog.store.locks import STREAM_BUCKETS, stream_bucket

STREAMS = 3000


def _stage(settings: Settings, names: list[str], per_stream: int = 1) -> int:
    """``per_stream`` records on each of ``names``, staged with ``emit_many`` in transactions of 1,000, spread
    round-robin (each stream's records carry ascending ``i``)."""
    records = [
        {"action": "a", "object": "o", "data": {"i": i}, "stream": name, "key": f"{name}-{i}"}
        for i in range(per_stream)
        for name in names
    ]
    with psycopg.connect(settings.conninfo) as conn:
        for lo in range(0, len(records), 1000):
            emit_many(conn, records[lo : lo + 1000])
            conn.commit()
    return len(records)


def _once(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNILOG_")}
    env.update(DATABASE_URL=settings.database_url, REDIS_URL=settings.redis_url)
    argv = [sys.executable, "-m", "unilog", "--log-json", "streamer", "--once", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)


def _assert_each_once_in_order(rds: redis.Redis, names: list[str], per_stream: int) -> None:
    pipe = rds.pipeline(transaction=False)
    for name in names:
        pipe.xrange(name)
    for name, entries in zip(names, pipe.execute(), strict=True):
        seqs = [int(f["seq"]) for _, f in entries]
        values = [json.loads(f["data"])["i"] for _, f in entries]
        assert seqs == list(range(1, per_stream + 1)), name
        assert values == list(range(per_stream)), name


@pytest.mark.parametrize("mode", ["table", "wal"])
def test_thousands_of_streams_drain_in_once_without_a_lock_per_stream(
    settings: Settings, pg: Any, rds: Any, mode: str, request: pytest.FixtureRequest
) -> None:
    if mode == "wal":
        request.getfixturevalue("wal")
    names = [f"s-{k:05d}" for k in range(STREAMS)]
    total = _stage(settings, names, per_stream=2)
    done = _once(settings)
    lines = done.stdout.splitlines() + done.stderr.splitlines()
    assert done.returncode == ExitCode.OK, lines[-5:]
    assert f"streamed {total} records" in done.stdout
    assert not any("Traceback" in line or "deadline" in line for line in lines)
    # ownership is by bucket: at most one line per round of buckets taken, never one per stream
    ownership = [line for line in lines if "lock acquired" in line or "buckets acquired" in line]
    assert len(ownership) <= STREAM_BUCKETS, len(ownership)
    if mode == "wal":  # one batch per batch_size records, whatever the number of streams in it
        batches = [line for line in lines if '"batch streamed"' in line]
        assert len(batches) <= total // StreamerConfig.batch_size + 2, len(batches)
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0] == 0
    _assert_each_once_in_order(rds, names, 2)


def _lock_rows_of(settings: Settings, stream: str) -> psycopg.Connection[Any]:
    """A session holding the staged rows of ``stream`` (``FOR UPDATE``): the streamer's delete of them waits."""
    holder = psycopg.connect(settings.conninfo)
    holder.execute("SELECT id FROM staged_log_records WHERE stream = %s FOR UPDATE", (stream,)).fetchall()
    return holder


def test_a_deadline_in_once_is_one_line_and_the_unreachable_code(settings: Settings, pg: Any, rds: Any) -> None:
    _stage(settings, ["a-stuck", "b-fine"], per_stream=3)
    holder = _lock_rows_of(settings, "a-stuck")
    try:
        done = _once(settings, "--pg-timeout", "1")
    finally:
        holder.close()
    lines = done.stdout.splitlines() + done.stderr.splitlines()
    assert done.returncode == ExitCode.UNREACHABLE, lines[-5:]
    assert not any("Traceback" in line for line in lines), done.stderr
    said = [line for line in lines if "deadline" in line]
    assert len(said) == 1, said
    assert said[0].startswith("unilog: error: ") and "delete_claimed" in said[0], said


def test_the_running_streamer_gets_past_a_stuck_stream(settings: Settings, pg: Any, rds: Any) -> None:
    """One stream's delete keeps hitting the deadline: the other streams are published meanwhile (a pass does not
    start again at the stuck one), and once it is freed, everything is there once. (The streams of the stuck one's
    bucket wait with it: the broken session's backend, blocked on the row lock, holds the bucket until it ends.)"""
    everything = [f"s-{k:04d}" for k in range(300)]
    names = [n for n in everything if stream_bucket(n) != stream_bucket("a-stuck")]
    _stage(settings, ["a-stuck", *everything])
    holder = _lock_rows_of(settings, "a-stuck")
    config = StreamerConfig(pg_timeout=1.0, max_backoff=0.2, poll_interval=0.1)
    stop = threading.Event()
    with Streamer(settings, config, name="runner") as streamer:
        runner = threading.Thread(target=streamer.run, args=(stop,))
        runner.start()
        try:
            deadline = time.monotonic() + 90
            while sum(rds.xlen(n) for n in names) < len(names):
                assert time.monotonic() < deadline, f"{sum(rds.xlen(n) for n in names)} of {len(names)} published"
                time.sleep(0.2)
        finally:
            holder.close()
            time.sleep(0.5)
            stop.set()
            runner.join(timeout=60)
    with Streamer(settings, StreamerConfig(pg_timeout=10.0)) as streamer:
        streamer.drain(timeout=60)
    _assert_each_once_in_order(rds, ["a-stuck", *everything], 1)


def test_two_streamers_share_the_buckets_one_publisher_per_stream(settings: Settings, pg: Any, rds: Any) -> None:
    """Two streamers started together on a backlog over many streams: each stream is owned by at most one of them
    at any moment (they own disjoint buckets), and every record arrives once, in order."""
    names = [f"s-{k:04d}" for k in range(600)]
    _stage(settings, names, per_stream=2)
    first, second = Streamer(settings, name="first"), Streamer(settings, name="second")
    overlaps: list[set[str]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            a, b = set(first.publisher.buckets), set(second.publisher.buckets)
            if a & b:
                overlaps.append({str(x) for x in a & b})
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        threads = [threading.Thread(target=s.drain, kwargs={"timeout": 120}) for s in (first, second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
    finally:
        stop.set()
        watcher.join()
        first.close()
        second.close()
    assert not overlaps, overlaps[:3]
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0] == 0
    _assert_each_once_in_order(rds, names, 2)
