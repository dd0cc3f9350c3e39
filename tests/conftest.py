"""Shared fixtures: the real servers come from unilog's own pytest plugin (unilog.harness.pytest_plugin)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis
from handlers import APPLIED_DDL  # tests/ is on sys.path: pytest puts a rootdir-less test folder there

from unilog import Settings


def pytest_configure(config: pytest.Config) -> None:
    """unilog's own suite runs on the servers ``DATABASE_URL`` / ``REDIS_URL`` name, when set (CONTRIBUTING.md: they
    must be throw-away), as the project's CI contract says. The plugin itself never takes those variables (an app's
    own servers): here they are handed to it as its test servers in so many words, and it still creates only
    databases of its own and refuses a Redis database that holds keys."""
    for app, test in (("DATABASE_URL", "UNILOG_TEST_DATABASE_URL"), ("REDIS_URL", "UNILOG_TEST_REDIS_URL")):
        if os.environ.get(app) and not os.environ.get(test):
            os.environ[test] = os.environ[app]


@pytest.fixture
def settings(unilog_settings: Settings) -> Settings:
    with psycopg.connect(unilog_settings.conninfo, autocommit=True) as conn:
        conn.execute(APPLIED_DDL)
    return unilog_settings


@pytest.fixture
def pg(settings: Settings) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test database, for set-up and assertions."""
    with psycopg.connect(settings.conninfo, autocommit=True) as conn:
        yield conn


@pytest.fixture
def wal(settings: Settings, pg: Any) -> Iterator[Settings]:
    """The test's database in WAL capture mode (producers' ``emit`` writes logical messages); skipped, saying why,
    on a server given by URL without wal_level=logical."""
    from unilog.stream.modes import enable_wal  # here: most tests never switch modes

    level = pg.execute("SHOW wal_level").fetchone()[0]
    if level != "logical":
        pytest.skip(f"the Postgres given by DATABASE_URL has wal_level={level}; WAL capture needs logical")
    enable_wal(settings)
    yield settings


@pytest.fixture
def rds(settings: Settings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def spans() -> Iterator[Any]:
    """An OpenTelemetry SDK with an in-memory exporter for this test only (the rest of the suite runs on the bare
    API, which records nothing); the test gets the exporter."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.util._once import Once

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        # OpenTelemetry sets its global provider once per process; its own test helpers reset it the same way
        trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
        trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
