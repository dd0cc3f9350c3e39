"""A planted password never appears in any output: logs, errors, status and its JSON, dead letters, metrics (of a
process and of the system), the dashboard. The URLs come from files (``DATABASE_URL_FILE``, ``REDIS_URL_FILE``)
as container secrets do."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
import redis

from unilog import Settings, emit
from unilog.harness.embedded import free_port

TESTS = Path(__file__).parent
PASSWORD = "planted-" + uuid.uuid4().hex


def with_password(url: str, user: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}:{PASSWORD}@{parts.netloc.rpartition('@')[2]}"))


@pytest.fixture
def secret_env(settings: Settings, pg: Any, rds: Any, tmp_path: Path) -> Iterator[dict[str, str]]:
    """An environment whose URLs, with the planted password, come from files only."""
    user = f"secret_{uuid.uuid4().hex[:6]}"
    try:
        pg.execute(f"CREATE ROLE {user} LOGIN SUPERUSER PASSWORD '{PASSWORD}'")
    except psycopg.errors.InsufficientPrivilege:
        pytest.skip("the test database's user may not create roles")
    try:
        rds.execute_command("ACL", "SETUSER", user, "on", f">{PASSWORD}", "~*", "+@all")
    except redis.ResponseError as exc:  # a Redis given by URL whose user may not manage ACLs
        pg.execute(f"DROP ROLE {user}")
        pytest.skip(f"the test's Redis user may not create ACL users: {exc}")
    (tmp_path / "db").write_text(with_password(settings.database_url, user) + "\n")
    (tmp_path / "redis").write_text(with_password(settings.redis_url, user))
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(DATABASE_URL_FILE=str(tmp_path / "db"), REDIS_URL_FILE=str(tmp_path / "redis"))
    env["UNILOG_STREAM"] = settings.stream
    yield env
    rds.execute_command("ACL", "DELUSER", user)
    pg.execute(f"DROP ROLE {user}")


def run(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "unilog", "--log-json", *args],
        env=env,
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return f"$ unilog {' '.join(args)} -> {result.returncode}\n{result.stdout}{result.stderr}"


def served(port: int, path: str = "/metrics", timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).read().decode()
        except OSError:
            assert time.monotonic() < deadline, f"nothing served on {port}{path}"
            time.sleep(0.1)


def background(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "unilog", "--log-json", *args],
        env=env,
        cwd=TESTS,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow(light=True)  # over 8 s: the default run stays near 12 minutes; .ci/run runs it
def test_a_planted_password_appears_in_no_output(settings: Settings, secret_env: dict[str, str]) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for n in range(5):
            emit(conn, action="create", object="ride", data={"n": n})
    outputs = [
        run(secret_env, "streamer", "--once"),
        run(secret_env, "consume", "handlers:cli_handler", "--name", "cli", "--once"),
        run(secret_env, "status"),
        run(secret_env, "status", "--json"),
        run(secret_env, "dlq", "list", "--json"),
    ]
    assert "streamed 5 records" in outputs[0] and "handled 5 records" in outputs[1], outputs[:2]
    wrong_db = {**secret_env, "DATABASE_URL": with_password("postgresql://127.0.0.1:1/none", "x")}
    wrong_redis = {**secret_env, "REDIS_URL": with_password("redis://127.0.0.1:1/0", "x")}
    outputs += [run(wrong_db, "streamer", "--once"), run(wrong_redis, "streamer", "--once")]
    assert "cannot connect to Postgres" in outputs[-2] and "cannot connect to Redis" in outputs[-1]
    assert "***" in outputs[-1], "the URL is shown, its password redacted"
    outputs.append(run({**secret_env, "DATABASE_URL_FILE": "/nonexistent/db-url"}, "status"))
    assert "DATABASE_URL_FILE" in outputs[-1] and "cannot be read" in outputs[-1]

    ports = {"streamer": free_port(), "metrics": free_port(), "dashboard": free_port()}
    procs = [
        background(secret_env, "streamer", "--metrics-port", str(ports["streamer"])),
        background(secret_env, "metrics", "--port", str(ports["metrics"])),
        background(secret_env, "dashboard", "--port", str(ports["dashboard"])),
    ]
    try:
        outputs += [served(ports["streamer"]), served(ports["metrics"])]
        outputs += [served(ports["dashboard"], "/"), served(ports["dashboard"], "/api/status")]
    finally:
        for proc in procs:
            proc.terminate()
        outputs += [proc.communicate(timeout=30)[0] for proc in procs]
    assert any("streamer started" in out for out in outputs), "the logs that describe the settings were read"
    leaks = [out for out in outputs if PASSWORD in out]
    assert leaks == []
