"""Adopting an existing reference-style outbox table, and `unilog migrate`'s failures as one line each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis

from unilog import Settings, Streamer
from unilog.cli import ExitCode
from unilog.harness.pytest_plugin import PostgresHandle

REFERENCE_DDL = """
    CREATE TABLE staged_log_records (
        id     BIGSERIAL PRIMARY KEY,
        action TEXT      NOT NULL,
        data   JSONB     NOT NULL,
        object TEXT      NOT NULL
    )
"""
INSERT = "INSERT INTO staged_log_records (action, object, data) VALUES ('create', 'ride', %s)"


@pytest.fixture
def blank_url(unilog_postgres: PostgresHandle, request: pytest.FixtureRequest) -> Iterator[str]:
    """A database without unilog's schema."""
    name = f"adopt_{os.getpid()}_{abs(hash(request.node.name)) % 10**8}"
    with psycopg.connect(unilog_postgres.admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    yield unilog_postgres.url_for(name)
    with psycopg.connect(unilog_postgres.admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def migrate(url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return subprocess.run(
        [sys.executable, "-m", "unilog", "migrate", "--database-url", url],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr
    return lines[0]


def test_adopting_a_reference_table_publishes_every_pending_and_concurrent_row_once_in_order(
    blank_url: str, unilog_redis_url: str
) -> None:
    with psycopg.connect(blank_url, autocommit=True) as conn:
        conn.execute(REFERENCE_DDL)
        for n in range(1, 301):
            conn.execute(INSERT, (json.dumps({"n": n}),))
    committed: list[int] = list(range(1, 301))
    stop = threading.Event()

    def old_producer() -> None:  # the reference design's producer keeps inserting through the adoption
        with psycopg.connect(blank_url, autocommit=True) as conn:
            n = 300
            while not stop.is_set():
                n += 1
                conn.execute(INSERT, (json.dumps({"n": n}),))
                committed.append(n)

    producer = threading.Thread(target=old_producer)
    producer.start()
    try:
        first, again = migrate(blank_url), migrate(blank_url)
    finally:
        stop.set()
        producer.join()
    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr  # idempotent
    assert len(committed) > 300, "the old producer kept inserting"
    settings = Settings.from_dsn(blank_url, unilog_redis_url)
    with Streamer(settings) as streamer:
        assert streamer.drain(timeout=60) == len(committed)
    client = redis.Redis.from_url(unilog_redis_url)
    entries: Any = client.xrange(settings.stream)
    published = [json.loads(fields[b"data"])["n"] for _id, fields in entries]
    assert published == committed, "every row once: the adopted ones first, then in commit order"
    assert [int(fields[b"seq"]) for _id, fields in entries] == list(range(1, len(committed) + 1))
    with psycopg.connect(blank_url) as conn:
        assert conn.execute("SELECT count(*) FROM staged_log_records").fetchone() == (0,)


@pytest.mark.parametrize(
    ("ddl", "column", "fix"),
    [
        (
            "id BIGSERIAL PRIMARY KEY, action TEXT NOT NULL, data TEXT NOT NULL, object TEXT NOT NULL",
            "data is text",
            "ALTER COLUMN data TYPE jsonb",
        ),
        ("id BIGSERIAL PRIMARY KEY, action TEXT NOT NULL, data JSONB NOT NULL", "object is missing", "add it"),
        (
            "id BIGSERIAL PRIMARY KEY, action TEXT, data JSONB NOT NULL, object TEXT NOT NULL",
            "action allows NULL",
            "SET NOT NULL",
        ),
        (
            "id BIGINT NOT NULL, action TEXT NOT NULL, data JSONB NOT NULL, object TEXT NOT NULL",
            "id has no default",
            "identity column",
        ),
    ],
)
def test_an_incompatible_table_is_refused_in_one_line_and_left_as_it_was(
    blank_url: str, ddl: str, column: str, fix: str
) -> None:
    with psycopg.connect(blank_url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE staged_log_records ({ddl})")
        conn.execute(
            "INSERT INTO staged_log_records (id, action, object, data) VALUES (1, 'a', 'o', '{}')"
            if "object" in ddl
            else "INSERT INTO staged_log_records (id, action, data) VALUES (1, 'a', '{}')"
        )
    result = migrate(blank_url)
    assert result.returncode == ExitCode.SCHEMA
    line = one_line(result)
    assert f"column {column}" in line and fix in line, line
    with psycopg.connect(blank_url) as conn:
        assert conn.execute("SELECT count(*) FROM staged_log_records").fetchone() == (1,)
        assert conn.execute("SELECT to_regclass('unilog_producer')").fetchone() == (None,), "nothing half-done"


def test_a_role_without_privileges_gets_one_line(blank_url: str, unilog_postgres: PostgresHandle) -> None:
    if unilog_postgres.server is None:
        pytest.skip("needs the embedded server's superuser to create a role")
    with psycopg.connect(unilog_postgres.admin_url, autocommit=True) as admin:
        admin.execute("DROP ROLE IF EXISTS unilog_limited")
        admin.execute("CREATE ROLE unilog_limited LOGIN")
    limited = blank_url.replace("postgresql://postgres@", "postgresql://unilog_limited@")
    try:
        result = migrate(limited)
        assert result.returncode == ExitCode.SCHEMA
        line = one_line(result)
        assert "permission denied" in line and "needs CREATE" in line, line
    finally:
        with psycopg.connect(unilog_postgres.admin_url, autocommit=True) as admin:
            admin.execute("DROP OWNED BY unilog_limited")
            admin.execute("DROP ROLE unilog_limited")


@pytest.mark.parametrize(
    "ddl",
    [
        "id BIGSERIAL PRIMARY KEY, action TEXT NOT NULL, data JSONB NOT NULL, object TEXT NOT NULL",
        "id BIGINT GENERATED ALWAYS AS IDENTITY (CACHE 50) PRIMARY KEY, action TEXT NOT NULL, data JSONB NOT NULL, "
        "object TEXT NOT NULL",
    ],
)
def test_an_adopted_id_sequence_hands_out_ids_in_time_order(blank_url: str, ddl: str) -> None:
    """Table mode orders records of transactions that conflict on a row by id (issue 33): an adopted sequence that
    caches values per session would hand a later emit a lower id, so `unilog migrate` sets its cache to 1."""
    with psycopg.connect(blank_url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE staged_log_records ({ddl})")
        conn.execute("ALTER SEQUENCE staged_log_records_id_seq CACHE 20")
    result = migrate(blank_url)
    assert result.returncode == 0, result.stderr
    with psycopg.connect(blank_url, autocommit=True) as conn:
        cache = conn.execute("SELECT cache_size FROM pg_sequences WHERE sequencename = 'staged_log_records_id_seq'")
        assert cache.fetchone() == (1,)
        first, second = psycopg.connect(blank_url, autocommit=True), psycopg.connect(blank_url, autocommit=True)
        with first, second:
            ids = [c.execute(INSERT + " RETURNING id", ('{"n": 1}',)).fetchone()[0] for c in (first, second, first)]
        assert ids == sorted(ids), f"ids handed out across sessions in time order: {ids}"
