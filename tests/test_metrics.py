"""Metrics read over HTTP from running processes (`--metrics-port`) and from the system exporter (`unilog metrics`),
checked against the state in Postgres and Redis."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from unilog import Settings, emit, emit_many
from unilog.harness.embedded import free_port
from unilog.wire import dlq_key

TESTS = Path(__file__).parent


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample served on ``port``, keyed by (name, sorted labels)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict[Any, float], name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def spawn(settings: Settings) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    env = {**os.environ, "DATABASE_URL": settings.database_url, "REDIS_URL": settings.redis_url}
    env["UNILOG_STREAM"] = settings.stream

    def start(*args: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "unilog", "--log-json", *args],
            env=env,
            cwd=TESTS,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=30)


def produce(settings: Settings, n: int) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(n):
            emit(conn, action="create", object="ride", data={"n": i})
            if i % 10 == 9:
                conn.commit()


def serving(port: int) -> Callable[[], bool]:
    def up() -> bool:
        try:
            scrape(port)
        except OSError:
            return False
        return True

    return up


def test_process_metrics_agree_with_postgres_and_redis(
    settings: Settings, pg: Any, rds: Any, spawn: Callable[..., Any]
) -> None:
    streamer_port, consumer_port = free_port(), free_port()
    spawn("streamer", "--poll-interval", "0.2", "--metrics-port", str(streamer_port))
    # a crash before one commit in ten: restarts are counted, and no record is counted twice
    spawn(
        "consume",
        "handlers:cli_handler",
        "--name",
        "cli",
        "--block-ms",
        "100",
        "--batch-size",
        "7",
        "--faults",
        "consumer.crash_before_commit=0.1",
        "--fault-seed",
        "3",
        "--metrics-port",
        str(consumer_port),
    )
    wait_for(serving(streamer_port), 20, "the streamer's metrics")
    wait_for(serving(consumer_port), 20, "the consumer's metrics")
    produce(settings, 60)
    applied = "SELECT count(*) FROM applied WHERE consumer = 'cli'"
    wait_for(lambda: pg.execute(applied).fetchone()[0] == 60, 60, "the consumer to apply every record")
    stream = settings.stream
    wait_for(
        lambda: (
            value(
                scrape(consumer_port), "unilog_records_consumed_total", stream=stream, consumer="cli", kind="checkpoint"
            )
            == 60
        ),
        10,
        "the consumed counter",
    )
    published = scrape(streamer_port)
    assert value(published, "unilog_records_published_total", stream=stream) == 60 == rds.xlen(stream)
    assert value(published, "unilog_stream_lock_held", stream=stream) == 1
    assert value(published, "unilog_batch_records_count", process="streamer", stream=stream) >= 1
    assert value(published, "unilog_publish_latency_seconds_count", stream=stream) >= 1
    consumed = scrape(consumer_port)
    faults = value(consumed, "unilog_faults_injected_total", point="consumer.crash_before_commit")
    assert faults is not None and faults >= 1, "seeded: some crashes happen"
    assert value(consumed, "unilog_restarts_total", process="consumer") == faults
    assert value(consumed, "unilog_apply_latency_seconds_count", stream=stream, consumer="cli", kind="checkpoint")
    assert pg.execute(applied).fetchone()[0] == 60, "each once"


def test_the_system_exporter_reports_lag_backlog_open_stagers_dead_letters_and_publishers(
    settings: Settings, pg: Any, rds: Any, spawn: Callable[..., Any]
) -> None:
    stream = settings.stream
    port = free_port()
    spawn("metrics", "--port", str(port))
    wait_for(serving(port), 20, "the exporter")
    produce(settings, 30)
    with psycopg.connect(settings.conninfo) as conn:  # a consumer that applies 10, then stops
        conn.execute("INSERT INTO unilog_checkpoints (name, stream) VALUES ('late', %s)", (stream,))
        conn.commit()
    subprocess.run(
        [sys.executable, "-m", "unilog", "streamer", "--once"],
        env={
            **os.environ,
            "DATABASE_URL": settings.database_url,
            "REDIS_URL": settings.redis_url,
            "UNILOG_STREAM": stream,
        },
        check=True,
        capture_output=True,
    )
    tenth = rds.xrange(stream)[9][0]
    pg.execute("UPDATE unilog_checkpoints SET last_id = %s WHERE name = 'late'", (tenth,))
    rds.xadd(dlq_key(stream), {"data": "{}", "dlq_original_id": "1-0", "dlq_group": "", "dlq_consumer": "late"})
    blocker = psycopg.connect(settings.conninfo)
    emit(blocker, action="create", object="ride", data={"open": True})  # staged, open: its own record waits
    try:
        produce(settings, 5)  # staged beside the open transaction
        time.sleep(1.1)
        samples = scrape(port)
    finally:
        blocker.rollback()
        blocker.close()
    assert value(samples, "unilog_system_up") == 1
    assert value(samples, "unilog_stream_length", stream=stream) == 30 == rds.xlen(stream)
    assert value(samples, "unilog_staged_records", stream=stream) == 5
    assert value(samples, "unilog_staged_oldest_age_seconds", stream=stream) >= 1
    assert value(samples, "unilog_open_staging_transaction_seconds") >= 1
    assert value(samples, "unilog_consumer_lag_entries", stream=stream, consumer="late", kind="checkpoint") == 20
    assert value(samples, "unilog_consumer_lag_seconds", stream=stream, consumer="late", kind="checkpoint") >= 0
    assert value(samples, "unilog_dead_letters", stream=stream) == 1
    assert value(samples, "unilog_stream_publishers", stream=stream) == 0, "no streamer runs now"
    spawn("streamer", "--poll-interval", "0.2")
    wait_for(lambda: value(scrape(port), "unilog_stream_publishers", stream=stream) == 1, 20, "a publisher")
    wait_for(lambda: value(scrape(port), "unilog_staged_records", stream=stream) == 0, 20, "the backlog to drain")


def test_a_streamer_over_many_streams_keeps_its_series_per_stream_bounded(
    settings: Settings, pg: Any, spawn: Callable[..., Any]
) -> None:
    """Past ``STREAM_SERIES`` streams a streamer's series per stream are shared (``stream="*"``): the counts stay
    whole (every record counted once) and the lock gauge counts the streams past the bound it holds."""
    from unilog.metrics import SEVERAL, STREAM_SERIES

    names = [f"tenant-{i:03}" for i in range(STREAM_SERIES + 30)]
    records = [{"action": "a", "object": "o", "data": {"i": i}, "stream": n} for i in range(2) for n in names]
    with psycopg.connect(settings.conninfo) as conn:
        emit_many(conn, records)
    port = free_port()
    spawn("streamer", "--poll-interval", "0.2", "--metrics-port", str(port))
    wait_for(serving(port), 20, "the streamer's metrics")
    staged = "SELECT count(*) FROM staged_log_records"
    wait_for(lambda: pg.execute(staged).fetchone()[0] == 0, 60, "the streamer to publish every record")

    def series(name: str) -> dict[str, float]:
        return {dict(labels)["stream"]: v for (n, labels), v in scrape(port).items() if n == name}

    wait_for(lambda: sum(series("unilog_records_published_total").values()) == len(records), 10, "the counts")
    published = series("unilog_records_published_total")
    assert len(published) == STREAM_SERIES + 1, sorted(published)
    assert published[SEVERAL] == 2 * 30
    assert all(published[n] == 2 for n in published if n != SEVERAL)
    locks = series("unilog_stream_lock_held")
    assert len(locks) == STREAM_SERIES + 1 and locks[SEVERAL] == 30, locks
    assert sum(v for n, v in locks.items() if n != SEVERAL) == STREAM_SERIES
