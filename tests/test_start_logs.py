"""Start-up log lines name the stream the process actually uses (issue 34): a consumer, a group worker or a
backfill given another stream than the default one says that stream, not the default; a streamer says which
streams it publishes, and the default stream under its own name."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from typing import Any

from structlog.testing import capture_logs

from unilog import (
    AsyncConsumer,
    Consumer,
    ConsumerConfig,
    GroupConfig,
    GroupConsumer,
    Settings,
    Streamer,
    StreamerConfig,
)
from unilog.produce.backfill import Backfill, BackfillConfig, start

OTHER = "customers"


def _stopped() -> threading.Event:
    stop = threading.Event()
    stop.set()  # connect, log the start, and leave the loop at once
    return stop


def _started(logs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (line,) = [e for e in logs if e["event"] == f"{kind} started"]
    return line


def test_consumer_and_group_start_lines_name_the_stream_they_read(settings: Settings) -> None:
    assert settings.stream != OTHER
    with capture_logs() as logs:
        with Consumer(settings, ConsumerConfig(name="c", stream=OTHER), lambda conn, records: None) as consumer:
            consumer.run(_stopped())
        with GroupConsumer(settings, GroupConfig(group="g", stream=OTHER), lambda conn, records: None) as group:
            group.run(_stopped())
    assert _started(logs, "consumer")["stream"] == OTHER
    assert _started(logs, "group worker")["stream"] == OTHER
    assert _started(logs, "consumer")["default_stream"] == settings.stream


def test_the_async_consumer_start_line_names_the_stream_it_reads(settings: Settings) -> None:
    async def handler(conn: Any, records: Any) -> None:
        pass

    async def run() -> None:
        stop = asyncio.Event()
        stop.set()
        async with AsyncConsumer(settings, ConsumerConfig(name="a", stream=OTHER), handler) as consumer:
            await consumer.run(stop)

    with capture_logs() as logs:
        asyncio.run(run())
    assert _started(logs, "consumer")["stream"] == OTHER


def test_a_backfill_start_line_names_the_stream_it_stages_to(settings: Settings, pg: Any) -> None:
    pg.execute("CREATE TABLE people (id int PRIMARY KEY, name text)")
    pg.execute("INSERT INTO people VALUES (1, 'a')")
    cursor = start(settings, BackfillConfig(table="people", key="id", stream=OTHER))
    with capture_logs() as logs, Backfill(settings, cursor["name"]) as backfill:
        backfill.run(_stopped())
    assert _started(logs, "backfill")["stream"] == OTHER


def test_a_streamer_start_line_names_the_streams_it_publishes(settings: Settings) -> None:
    with capture_logs() as logs:
        with Streamer(settings, StreamerConfig(streams=(OTHER,))) as streamer:
            streamer.run(_stopped())
        with Streamer(replace(settings)) as every:
            every.run(_stopped())
    first, second = [e for e in logs if e["event"] == "streamer started"]
    assert first["streams"] == [OTHER] and "stream" not in first
    assert second["streams"] == "every stream with staged records" and second["default_stream"] == settings.stream
