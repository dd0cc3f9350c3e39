"""The pytest plugin never writes a server it did not start unless told to in so many words (issue 34).

Each case runs pytest in a subprocess, as a user's project would, on a small test file that writes to the plugin's
Redis and Postgres. "The user's" servers are a Redis this test starts and the session's Postgres, holding data the
run must leave alone."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from unilog.harness.embedded import EmbeddedRedis
from unilog.harness.pytest_plugin import PostgresHandle

USER_TEST = """
import os

import psycopg
import redis


def test_writes(unilog_settings, unilog_postgres, unilog_redis):
    client = redis.Redis.from_url(unilog_settings.redis_url)
    client.set("written-by-the-test", "1")
    client.close()
    with psycopg.connect(unilog_settings.database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE written_by_the_test (x int)")
    print("SERVERS", unilog_postgres.admin_url, unilog_redis.url)
"""


@pytest.fixture
def user_redis() -> Iterator[redis.Redis]:
    """A Redis that is "the user's": it holds a key in database 0 and one in database 2."""
    server = EmbeddedRedis().start()
    other = redis.Redis(port=server.port, db=2)
    other.set("also-precious", "mine")
    other.close()
    client = redis.Redis(port=server.port, decode_responses=True)
    client.set("precious", "mine")
    try:
        yield client
    finally:
        client.close()
        server.stop(cleanup=True)


@pytest.fixture
def user_database(unilog_postgres: PostgresHandle) -> Iterator[str]:
    """A database that is "the user's", with a table and a row, on the session's Postgres."""
    name = f"users_own_{os.getpid()}"
    with psycopg.connect(unilog_postgres.admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    url = unilog_postgres.url_for(name)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE precious (x int)")
        conn.execute("INSERT INTO precious VALUES (42)")
    try:
        yield url
    finally:
        with psycopg.connect(unilog_postgres.admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _run_user_suite(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_user.py").write_text(USER_TEST)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("UNILOG_", "DATABASE_URL", "REDIS_URL"))}
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "test_user.py"]
    return subprocess.run(
        argv, cwd=tmp_path, env={**clean, **env}, capture_output=True, text=True, timeout=300, check=False
    )


def _user_data_intact(client: redis.Redis, database_url: str) -> None:
    assert client.get("precious") == "mine", "the plugin wrote the user's Redis database"
    other = redis.Redis(port=client.connection_pool.connection_kwargs["port"], db=2, decode_responses=True)
    try:
        assert other.get("also-precious") == "mine"
    finally:
        other.close()
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT x FROM precious").fetchall() == [(42,)]
        assert conn.execute("SELECT to_regclass('written_by_the_test')").fetchone() == (None,)


def _databases(admin_url: str) -> set[str]:
    with psycopg.connect(admin_url) as conn:
        return {row[0] for row in conn.execute("SELECT datname FROM pg_database")}


def test_app_urls_are_never_written_the_plugin_runs_servers_of_its_own(
    tmp_path: Path, user_redis: redis.Redis, user_database: str
) -> None:
    """``REDIS_URL``/``DATABASE_URL`` as the quick start exports them: the tests pass on throw-away servers, the
    header says so in one line per variable, and the user's key and table are still there."""
    redis_url = f"redis://127.0.0.1:{user_redis.connection_pool.connection_kwargs['port']}/0"
    result = _run_user_suite(tmp_path, REDIS_URL=redis_url, DATABASE_URL=user_database)
    assert result.returncode == 0, result.stdout + result.stderr
    _user_data_intact(user_redis, user_database)
    notes = [line for line in result.stdout.splitlines() if line.startswith("unilog: ")]
    assert len(notes) == 2, result.stdout
    assert "REDIS_URL is set but not used" in notes[1] and "UNILOG_TEST_REDIS_URL" in notes[1], notes
    assert "DATABASE_URL is set but not used" in notes[0] and "UNILOG_TEST_DATABASE_URL" in notes[0], notes
    servers = next(line for line in result.stdout.splitlines() if line.startswith("SERVERS")).split()
    assert servers[1] != user_database and servers[2] != redis_url


def test_opt_in_writes_only_the_named_redis_database_and_the_databases_it_creates(
    tmp_path: Path, user_redis: redis.Redis, user_database: str, unilog_postgres: PostgresHandle
) -> None:
    """``UNILOG_TEST_REDIS_URL`` naming an empty database 5 of the user's server, ``UNILOG_TEST_DATABASE_URL`` the
    user's database: the tests run there; afterwards database 5 is empty again, databases 0 and 2 are untouched,
    and every database the run created is gone."""
    port = user_redis.connection_pool.connection_kwargs["port"]
    before = _databases(unilog_postgres.admin_url)
    result = _run_user_suite(
        tmp_path, UNILOG_TEST_REDIS_URL=f"redis://127.0.0.1:{port}/5", UNILOG_TEST_DATABASE_URL=user_database
    )
    assert result.returncode == 0, result.stdout + result.stderr
    servers = next(line for line in result.stdout.splitlines() if line.startswith("SERVERS")).split()
    assert servers[1:] == [user_database, f"redis://127.0.0.1:{port}/5"]
    _user_data_intact(user_redis, user_database)
    own = redis.Redis(port=port, db=5)
    try:
        assert own.dbsize() == 0
    finally:
        own.close()
    assert _databases(unilog_postgres.admin_url) - before == set()


def test_opt_in_to_a_database_that_holds_keys_is_refused_in_one_line(
    tmp_path: Path, user_redis: redis.Redis, user_database: str
) -> None:
    port = user_redis.connection_pool.connection_kwargs["port"]
    result = _run_user_suite(
        tmp_path, UNILOG_TEST_REDIS_URL=f"redis://127.0.0.1:{port}/0", UNILOG_TEST_DATABASE_URL=user_database
    )
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if "UNILOG_TEST_REDIS_URL names Redis database 0" in line]
    assert len(lines) == 1 and "holds 1 key;" in lines[0], output
    _user_data_intact(user_redis, user_database)
