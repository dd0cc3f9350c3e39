"""Logging: every batch logs its size and time; passwords never reach the logs."""

from __future__ import annotations

import io
import json
from typing import Any

import psycopg
import structlog
from structlog.testing import capture_logs

from unilog import Consumer, ConsumerConfig, Settings, Streamer, emit
from unilog.log import configure_logging


def test_batches_log_size_and_time(settings: Settings) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(3):
            emit(conn, action="a", object="o", data={"n": i})
        conn.commit()
    with capture_logs() as logs:
        with Streamer(settings) as s:
            s.drain()
        with Consumer(settings, ConsumerConfig(name="c"), lambda conn, records: None) as c:
            c.drain()
    streamed = [e for e in logs if e["event"] == "batch streamed"]
    consumed = [e for e in logs if e["event"] == "batch consumed"]
    assert [e["records"] for e in streamed] == [3] and streamed[0]["ms"] >= 0
    assert [e["records"] for e in consumed] == [3] and consumed[0]["ms"] >= 0


def test_json_logs_when_not_a_tty_and_no_passwords(settings: Settings) -> None:
    out = io.StringIO()
    configure_logging(stream=out)
    try:
        secret_url = settings.database_url.replace("postgres@", "postgres:s3cr3t@")  # trust auth ignores it
        secret = Settings(database_url=secret_url, redis_url=settings.redis_url, stream=settings.stream)
        import threading

        stop = threading.Event()
        stop.set()
        Streamer(secret).run(stop)
        lines = [json.loads(line) for line in out.getvalue().splitlines()]
        assert any(e["event"] == "streamer started" for e in lines)
        assert "s3cr3t" not in out.getvalue() and "***" in out.getvalue()
    finally:
        structlog.reset_defaults()


def test_console_logs_on_a_tty() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    configure_logging(stream=out)
    try:
        structlog.get_logger("t").info("hello", n=1)
    finally:
        structlog.reset_defaults()
    text: Any = out.getvalue()
    assert "hello" in text and not text.lstrip().startswith("{")
