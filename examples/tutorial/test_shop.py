"""The shop's tests, on throw-away Postgres and Redis servers from unilog's pytest plugin (``unilog_settings``)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import uvicorn
from shop.api import create_app
from shop.consumers import record_sale

import unilog
from unilog.harness.embedded import free_port


@pytest.fixture
def api(unilog_settings: unilog.Settings) -> Iterator[str]:
    """The shop's API, served by uvicorn in a thread, on the test's own database."""
    app = create_app(unilog_settings.database_url)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join()
    app.state.engine.dispose()


def place_order(api: str, product: str, quantity: int) -> int:
    body = json.dumps({"product": product, "quantity": quantity}).encode()
    request = urllib.request.Request(f"{api}/orders", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        assert response.status == 201
        return json.loads(response.read())["id"]


def sales(settings: unilog.Settings) -> dict[str, int]:
    with psycopg.connect(settings.conninfo) as conn:
        return dict(conn.execute("SELECT product, sold FROM sales").fetchall())


def consumer(settings: unilog.Settings, **faults: Any) -> unilog.Consumer:
    config = unilog.ConsumerConfig(name="sales")
    return unilog.Consumer(settings, config, record_sale, faults=unilog.Faults.scripted(**faults))


def test_an_order_reaches_the_sales_table(api: str, unilog_settings: unilog.Settings) -> None:
    place_order(api, "teapot", 2)
    place_order(api, "teapot", 1)
    place_order(api, "kettle", 1)

    assert unilog.Streamer(unilog_settings).drain() == 3  # staged in Postgres -> published to Redis
    with consumer(unilog_settings) as sales_consumer:
        assert sales_consumer.drain() == 3  # read from Redis -> applied to `sales`

    assert sales(unilog_settings) == {"teapot": 3, "kettle": 1}


def test_a_record_sent_twice_is_applied_once(api: str, unilog_settings: unilog.Settings) -> None:
    place_order(api, "teapot", 2)

    streamer = unilog.Streamer(unilog_settings, faults=unilog.Faults.scripted(streamer__double_send=[True]))
    with streamer:
        streamer.drain()  # the fault sends the batch to Redis twice, as a retry after a lost reply would
    with consumer(unilog_settings) as sales_consumer:
        sales_consumer.drain()

    assert sales(unilog_settings) == {"teapot": 2}  # not 4: the copy was recognised and skipped


def test_a_crash_before_the_commit_loses_nothing(api: str, unilog_settings: unilog.Settings) -> None:
    place_order(api, "teapot", 2)
    unilog.Streamer(unilog_settings).drain()

    crashing = consumer(unilog_settings, consumer__crash_before_commit=[True])
    with crashing, pytest.raises(unilog.InjectedCrash):
        crashing.drain()  # the handler ran, then the process "died" before committing
    assert sales(unilog_settings) == {}  # the handler's writes were rolled back with the transaction

    with consumer(unilog_settings) as sales_consumer:  # the restarted process
        assert sales_consumer.drain() == 1  # the same record, read again from the checkpoint

    assert sales(unilog_settings) == {"teapot": 2}  # applied exactly once
