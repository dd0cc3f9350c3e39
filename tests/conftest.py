"""Shared fixtures: the real servers come from unilog's own pytest plugin (unilog.harness.pytest_plugin)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis
from handlers import APPLIED_DDL  # tests/ is on sys.path: pytest puts a rootdir-less test folder there

from unilog import Settings


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
def rds(settings: Settings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    yield client
    client.close()
