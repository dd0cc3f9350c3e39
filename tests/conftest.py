"""Shared fixtures: the real servers come from unilog's own pytest plugin (unilog.testing)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from unilog import Settings

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))  # services/ (the demo app) is not an installed package

from handlers import APPLIED_DDL


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
