"""The Django example (``examples/django_rides``) runs its own tests with Django's test runner against the suite's
real servers: unilog's tables through Django's migrations, ``unilog.django.emit`` in atomic blocks and savepoints,
and a consumer writing through the ORM in unilog's transaction across an injected crash and a double-send."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from unilog.harness.pytest_plugin import PostgresHandle, RedisHandle

pytest.importorskip("django")

EXAMPLE = Path(__file__).parent.parent / "examples" / "django_rides"


def test_the_django_examples_own_tests_pass(unilog_postgres: PostgresHandle, unilog_redis: RedisHandle) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNILOG_", "DATABASE_URL", "REDIS_URL"))}
    env.update(DATABASE_URL=unilog_postgres.url_for(f"django_rides_{os.getpid()}"), REDIS_URL=unilog_redis.url)
    argv = [sys.executable, "manage.py", "test", "rides", "--noinput", "-v", "2"]
    result = subprocess.run(argv, cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "Ran 9 tests" in result.stderr and "OK" in result.stderr, result.stderr[-2000:]
    assert "Applying unilog.0001_unilog_schema" in result.stdout, "unilog's tables by Django's migrate"
    assert "Applying unilog.0002_unilog_0007" in result.stdout, "a project migrated before 0006 catches up"
    assert "Applying unilog.0003_unilog_0008" in result.stdout, "and before the backfills' cursors"
    assert "Applying unilog.0004_unilog_0009" in result.stdout, "and before records as messages"
    assert "Applying unilog.0005_unilog_0010" in result.stdout, "and before the cheaper unilog_stage"
