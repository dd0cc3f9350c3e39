"""Health probes (issue 28): every process that serves metrics answers ``/healthz`` (its loops turned lately) and
``/readyz`` (its last passes reached Postgres and Redis) on the same port, as a container orchestrator asks."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

from unilog import Consumer, ConsumerConfig, Record, Settings, Streamer, StreamerConfig, emit, metrics
from unilog.harness.proxy import FaultProxy
from unilog.harness.pytest_plugin import running
from unilog.health import HEALTH


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def until(check: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


@pytest.fixture
def port() -> Any:
    port = free_port()
    metrics.serve(port)
    yield port
    HEALTH.max_silence = 60.0


def test_a_running_streamer_is_alive_and_ready_and_metrics_are_still_served(settings: Settings, port: int) -> None:
    streamer = Streamer(settings, StreamerConfig(poll_interval=0.2), name="probed")
    with running(streamer.run):
        assert until(lambda: "streamer streamer=probed" in HEALTH.names())
        assert probe(port, "/readyz") == (200, {"status": "ok", "loops": {}})
        assert probe(port, "/healthz") == (200, {"status": "ok", "loops": {}})
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert b"unilog_info" in response.read()
    streamer.close()


def test_a_streamer_that_cannot_reach_redis_is_alive_but_not_ready(settings: Settings, port: int) -> None:
    redis_port = int(settings.redis_url.rsplit(":", 1)[1].split("/")[0])
    with FaultProxy("127.0.0.1", redis_port) as proxy:
        via = settings.with_(redis_url=proxy.url_for(settings.redis_url))
        streamer = Streamer(via, StreamerConfig(poll_interval=0.1, redis_timeout=0.5, max_backoff=0.2), name="blind")
        with running(streamer.run):
            assert until(lambda: "streamer streamer=blind" in HEALTH.names())
            assert probe(port, "/readyz")[0] == 200
            proxy.reset()  # Redis goes away
            with psycopg.connect(settings.conninfo) as conn:
                emit(conn, action="create", object="ride", data={"n": 1})
            found = until(lambda: (r := probe(port, "/readyz"))[0] == 503 and r, timeout=15)
            assert found, "still ready while every pass fails to reach Redis"
            assert "streamer streamer=blind" in found[1]["loops"], found
            assert probe(port, "/healthz")[0] == 200, "backing off is turning: it is alive"
            proxy.pass_through()
            assert until(lambda: probe(port, "/readyz")[0] == 200, timeout=15), "ready again once Redis answers"
        streamer.close()


def test_a_consumer_stuck_in_its_handler_is_not_alive(settings: Settings, port: int) -> None:
    HEALTH.max_silence = 0.5
    release = threading.Event()

    def stuck(_conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
        release.wait(20)

    with psycopg.connect(settings.conninfo) as conn:
        emit(conn, action="create", object="ride", data={"n": 1})
    Streamer(settings).drain()
    consumer = Consumer(settings, ConsumerConfig(name="stuck", block_ms=100), stuck)
    try:
        with running(consumer.run):
            status, body = until(lambda: (r := probe(port, "/healthz"))[0] == 503 and r, timeout=15) or (None, {})
            assert status == 503 and "consumer consumer=stuck" in body["loops"], body
            release.set()
            assert until(lambda: probe(port, "/healthz")[0] == 200), "alive again once the batch finished"
    finally:
        release.set()
        consumer.close()


def test_loops_that_ended_do_not_count(settings: Settings, port: int) -> None:
    streamer = Streamer(settings, StreamerConfig(poll_interval=0.2), name="gone")
    with running(streamer.run):
        assert until(lambda: "streamer streamer=gone" in HEALTH.names())
    streamer.close()
    assert probe(port, "/healthz") == (200, {"status": "ok", "loops": {}})
    assert "streamer streamer=gone" not in probe(port, "/readyz")[1]["loops"]
