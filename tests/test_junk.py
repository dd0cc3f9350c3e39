"""Bad input, generated (hypothesis): junk at the public surfaces gives a clear `UnilogError` or a named exit code,
never a traceback, and never loses or duplicates a committed record.

* `emit` with generated arguments either stages exactly what was given (bytes as base64, as documented) or raises an
  `InvalidRecord` before writing, leaving the transaction usable;
* generated junk entries in the stream, between good records, never stop a consumer, and every good record is
  applied exactly once;
* generated environment values and arguments for the command end in a named exit code and at most one line.
"""

from __future__ import annotations

import base64
import json
import math
import os
import subprocess
import sys
from decimal import Decimal
from typing import Any

import psycopg
import pytest
import redis
from handlers import APPLIED_DDL, record_applied
from hypothesis import HealthCheck, given, note
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from unilog import Consumer, ConsumerConfig, InvalidRecord, Settings, Streamer, emit
from unilog.cli import ExitCode
from unilog.harness.pytest_plugin import PostgresHandle, RedisHandle, create_database, drop_database

EXAMPLES = int(os.environ.get("UNILOG_HYPOTHESIS_EXAMPLES") or 25)


def junk_settings(examples: int) -> Any:
    return hypothesis_settings(
        max_examples=examples,
        deadline=None,
        database=None,  # keep .hypothesis/ out of the repository
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20))
junk_leaf = st.one_of(json_leaf, st.binary(max_size=8), st.sets(st.integers(), max_size=2), st.just(object()))
payloads = st.recursive(
    junk_leaf,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3),
    max_leaves=8,
)
names = st.one_of(st.text(max_size=12), st.just("create"), st.just(""), st.just(" "))
streams = st.one_of(st.none(), st.text(max_size=12), st.just("orders.v1"))


@junk_settings(EXAMPLES * 4)
@given(action=names, obj=names, data=payloads, key=st.one_of(st.none(), names), stream=streams)
def test_emit_stages_exactly_what_it_was_given_or_refuses_before_writing(
    settings: Settings, action: str, obj: str, data: Any, key: str | None, stream: str | None
) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        try:
            staged_id = emit(conn, action=action, object=obj, data=data, key=key, stream=stream)
        except InvalidRecord as exc:
            note(f"refused: {exc}")
            assert str(exc) and "\n" not in str(exc)
            assert conn.execute("SELECT count(*) FROM staged_log_records").fetchone() == (0,), "nothing written"
        else:
            row = conn.execute("SELECT action, object, data, key FROM staged_log_records WHERE id = %s", (staged_id,))
            got = row.fetchone()
            assert got is not None and got[:2] == (action, obj) and got[3] == key
            # jsonb keeps a number as the exact decimal of its JSON text: 4.775560544019782e+16 (a float) comes back
            # as the integer 47755605440197820, the same number; compare numbers as decimals
            stored = json.loads(json.dumps(got[2]), parse_float=Decimal)
            expected = json.dumps(data, default=_as_documented)
            assert stored == json.loads(expected, parse_float=Decimal), "the payload round-trips exactly"
            assert not _has_non_finite(data)
        conn.rollback()


def _as_documented(value: Any) -> str:
    """docs/guides/producers.md: bytes are stored as standard base64 with padding."""
    assert isinstance(value, bytes), f"emit accepted a {type(value).__name__}"
    return base64.b64encode(value).decode("ascii")


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_non_finite(v) for v in value)
    return False


junk_fields = (
    st.dictionaries(
        st.sampled_from([b"data", b"action", b"object", b"producer", b"epoch", b"seq", b"key", b"created", b"other"]),
        st.one_of(st.binary(max_size=12), st.sampled_from([b"{}", b"[1]", b"{bad", b"\xff\xfe", b"-3", b"x"])),
        min_size=1,
        max_size=5,
    )
    .map(lambda f: {k: v for k, v in f.items() if k not in (b"producer", b"epoch", b"seq")} | _position(f))
    .filter(
        bool  # an XADD needs a field
    )
)


def _position(fields: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """Junk positions are damaged (not integers) or absent: a well-formed position is a record's, not junk."""
    seq = fields.get(b"seq")
    return {} if seq is None else {b"producer": b"junk", b"seq": b"s" + seq}


@pytest.mark.slow(light=True)  # over 8 s: the default run stays near 12 minutes; .ci/run runs it
@junk_settings(EXAMPLES)
@given(plan=st.lists(st.one_of(st.integers(1, 3), junk_fields), min_size=1, max_size=8))
def test_junk_entries_never_stop_a_consumer_and_every_record_is_applied_once(
    unilog_postgres: PostgresHandle, unilog_template: str, unilog_redis: RedisHandle, plan: list[Any]
) -> None:
    url = create_database(unilog_postgres, unilog_template)
    rds = redis.Redis.from_url(unilog_redis.url)
    rds.flushdb()
    settings = Settings.from_dsn(url, unilog_redis.url, "junk")
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(APPLIED_DDL)
        produced = _produce(settings, rds, plan)
        name = "c0"
        handler = lambda conn, records: record_applied(name, conn, records)  # noqa: E731
        with Consumer(settings, ConsumerConfig(name=name), handler) as consumer:
            consumer.drain()
        with psycopg.connect(url) as conn:
            got = [r[0] for r in conn.execute("SELECT n FROM applied WHERE seq IS NOT NULL ORDER BY seq")]
        assert got == produced, "every committed record once, in order, junk or not around it"
    finally:
        rds.close()
        drop_database(unilog_postgres, url)


def _produce(settings: Settings, rds: redis.Redis, plan: list[Any]) -> list[int]:
    produced: list[int] = []
    for item in plan:
        if isinstance(item, dict):
            rds.xadd(settings.stream, item)  # type: ignore[arg-type]
            continue
        with psycopg.connect(settings.conninfo) as conn:
            for _ in range(item):
                produced.append(len(produced))
                emit(conn, action="create", object="ride", data={"n": produced[-1]})
        with Streamer(settings) as streamer:
            streamer.drain(timeout=30)
    return produced


env_values = st.one_of(
    st.text(max_size=30), st.sampled_from(["postgresql://", "redis://", "http://x", "postgresql://u@127.0.0.1:1/x"])
)
NAMED = {int(code) for code in ExitCode}


@pytest.mark.slow(light=True)
@junk_settings(max(6, EXAMPLES // 2))
@given(
    database=env_values,
    redis_url=env_values,
    stream=st.text(max_size=15),
    command=st.sampled_from(["status", "streamer --once", "migrate", "consume handlers:nope --name x --once"]),
)
def test_junk_settings_give_a_named_exit_code_and_one_line(
    database: str, redis_url: str, stream: str, command: str
) -> None:
    if "\x00" in database + redis_url + stream:
        return  # an environment cannot hold NUL
    env = {**os.environ, "DATABASE_URL": database, "REDIS_URL": redis_url, "UNILOG_STREAM": stream}
    argv = [sys.executable, "-m", "unilog", "--log-json", *command.split()]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    note(result.stderr)
    assert result.returncode in NAMED, result.stderr
    assert "Traceback" not in result.stderr
    assert len([line for line in result.stderr.splitlines() if line.strip()]) <= 1, result.stderr
