"""The streamer's packed fetch: Postgres encodes a batch for Redis, byte for byte what the row path would send."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
import redis

from unilog import Settings, Streamer, StreamerConfig, emit, engine, store
from unilog.harness.pytest_plugin import PostgresHandle, drop_database
from unilog.ops.schema import migrate

TRICKY = [
    ({"text": "plain"}, None),
    ({"text": "é ü ß", "emoji": "🚀🛰️", "cjk": "火箭"}, "ключ-🔑"),
    ({"quote": 'a "q" \\ b', "nl": "line1\nline2\r\n", "tab": "\t"}, "k with spaces"),
    ({"nested": {"list": [1, 2.5, None, True, "x"]}, "empty": ""}, None),
]


def stage(conn: psycopg.Connection[Any]) -> None:
    """One transaction per record (``conn`` is in autocommit mode)."""
    for data, key in TRICKY:
        with conn.transaction():
            emit(conn, action="update", object="ride", data=data, key=key)


def test_packed_batch_equals_the_rows_encoded_in_python(settings: Settings, pg: Any) -> None:
    stage(pg)
    with psycopg.connect(settings.conninfo) as conn:
        assert store.packed_fetch_supported(conn)
        as_rows = store.claim_rows(conn, "", 100, store.Cursor())
        conn.rollback()
        packed = store.claim_packed(conn, "", 100, store.Cursor())
        assert as_rows is not None and packed is not None
        assert (packed.count, packed.last, packed.parents) == (len(TRICKY), as_rows.last, ())
        expected = engine.pack_rows(
            [(data, action, obj, created, key) for _, action, obj, data, key, created, *_ in as_rows.rows]
        )
        assert packed.body == expected.body
        # a saved claim read again is the same batch, byte for byte
        again = store.reclaim_packed(conn, packed.claim)
        assert again is not None and (again.count, again.last, again.body) == (packed.count, packed.last, packed.body)
        conn.rollback()
        # a limit inside the backlog stops at the same record, and a cursor past everything claims nothing
        assert store.claim_packed(conn, "", 2, store.Cursor()).last == as_rows.rows[1][0]  # type: ignore[union-attr]
        conn.rollback()
        assert store.claim_packed(conn, "", 100, store.Cursor(last=as_rows.last, since="18446744073709551615")) is None
        conn.rollback()


def test_streamed_entries_carry_the_exact_json_and_keys(settings: Settings, pg: Any) -> None:
    stage(pg)
    with Streamer(settings, StreamerConfig(batch_size=3)) as streamer:
        assert streamer.drain() == len(TRICKY)
    entries = redis.Redis.from_url(settings.redis_url).xrange(settings.stream)
    assert [json.loads(f[b"data"]) for _, f in entries] == [data for data, _ in TRICKY]
    assert [f.get(b"key", b"").decode() for _, f in entries] == [key or "" for _, key in TRICKY]


def test_a_latin1_database_streams_through_the_row_path(unilog_postgres: PostgresHandle, settings: Settings) -> None:
    """octet_length() counts server-encoding bytes, so the packed fetch is only used in UTF8 databases."""
    name = f"unilog_latin1_{id(settings)}"
    with psycopg.connect(unilog_postgres.admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    url = unilog_postgres.url_for(name)
    try:
        migrate(url)
        latin = Settings.from_dsn(url, settings.redis_url, stream="latin1-stream")
        with psycopg.connect(url) as conn:
            assert not store.packed_fetch_supported(conn)
            emit(conn, action="create", object="café", data={"text": "crème brûlée"}, key="clé")
            conn.commit()
        with Streamer(latin) as streamer:
            assert streamer.drain() == 1
        [(_, fields)] = redis.Redis.from_url(settings.redis_url).xrange("latin1-stream")
        assert json.loads(fields[b"data"]) == {"text": "crème brûlée"}
        assert (fields[b"object"].decode(), fields[b"key"].decode()) == ("café", "clé")
    finally:
        drop_database(unilog_postgres, url)


def test_a_traced_batch_is_packed_the_same_in_postgres_and_in_python(settings: Settings, pg: Any) -> None:
    """Seven arguments a record when any has a trace context (the partitioned path packs in Python)."""
    stage(pg)
    pg.execute("UPDATE staged_log_records SET traceparent = 'tp-' || id WHERE id % 2 = 0")
    pg.execute("UPDATE staged_log_records SET tracestate = 'v=' || id WHERE id % 4 = 0")
    with psycopg.connect(settings.conninfo) as conn:
        claimed = store.claim_rows(conn, "", 100, store.Cursor())
        conn.rollback()
        packed = store.claim_packed(conn, "", 100, store.Cursor())
        conn.rollback()
    assert claimed is not None and packed is not None
    rows, count, body, parents = claimed.rows, packed.count, packed.body, list(packed.parents)
    assert count == len(rows)
    expected = engine.pack_rows(
        [(data, action, obj, created, key, tp, ts) for _, action, obj, data, key, created, tp, ts, _ty in rows]
    )
    assert expected.stride == 7 and body == expected.body
    assert parents == [row[6] for row in rows if row[6]]


@pytest.mark.parametrize("traced", [False, True])
def test_a_typed_batch_is_packed_the_same_in_postgres_and_in_python(settings: Settings, pg: Any, traced: bool) -> None:
    """Eight arguments a record when any is typed, its type last (empty for the untyped ones), traced or not, the
    same from Postgres as from Python (the publish script's handling of them: tests/test_typed_records.py)."""
    stage(pg)
    pg.execute("UPDATE staged_log_records SET record_type = 'RideCreated@' || id WHERE id % 3 = 0")
    if traced:
        pg.execute("UPDATE staged_log_records SET traceparent = 'tp-' || id WHERE id % 2 = 0")
    with psycopg.connect(settings.conninfo) as conn:
        claimed = store.claim_rows(conn, "", 100, store.Cursor())
        conn.rollback()
        packed = store.claim_packed(conn, "", 100, store.Cursor())
        conn.rollback()
    assert claimed is not None and packed is not None
    expected = engine.pack_rows([(r[3], r[1], r[2], r[5], r[4], r[6], r[7], r[8]) for r in claimed.rows])
    assert packed.stride == expected.stride == 8 and packed.body == expected.body
    assert [row[8] for row in claimed.rows if row[8]] == [
        f"RideCreated@{row[0]}" for row in claimed.rows if row[0] % 3 == 0
    ]
