"""emit(): staging inside the caller's transaction, and clear errors for bad input that leave it usable."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

import unilog
from unilog import Producer, Settings, emit
from unilog.config import sqlalchemy_url
from unilog.errors import (
    InvalidRecord,
    InvalidStreamName,
    NotInTransaction,
    PayloadNotSerializable,
    PayloadTooLarge,
    SchemaMissing,
)


def staged(pg: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return pg.execute("SELECT action, object, data, stream, key FROM staged_log_records ORDER BY id").fetchall()


def test_psycopg_commit_stages_and_rollback_leaves_nothing(settings: Settings, pg: psycopg.Connection[Any]) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        emit(conn, action="create", object="ride", data={"id": 1, "distance": 2.5})
        conn.rollback()
        staged_id = emit(conn, action="create", object="ride", data={"id": 2, "distance": 3.5}, key="ride-2")
        assert staged(pg) == [], "emit must not commit on its own"
        conn.commit()
    assert isinstance(staged_id, int)
    assert staged(pg) == [("create", "ride", {"id": 2, "distance": 3.5}, "", "ride-2")]


def test_sqlalchemy_session_and_connection(settings: Settings, pg: psycopg.Connection[Any]) -> None:
    engine = create_engine(sqlalchemy_url(settings.database_url))
    with Session(engine) as session:
        emit(session, action="create", object="ride", data={"via": "session"}, stream="rides")
        session.rollback()
        emit(session, action="create", object="ride", data={"via": "session"}, stream="rides")
        session.commit()
    with engine.connect() as conn:
        emit(conn, action="create", object="ride", data={"via": "connection"})
        conn.rollback()
        emit(conn, action="create", object="ride", data={"via": "connection"})
        conn.commit()
    with engine.begin() as conn:
        emit(conn, action="update", object="ride", data={"via": "begin"})
    engine.dispose()
    assert [row[2]["via"] for row in staged(pg)] == ["session", "connection", "begin"]
    assert [row[3] for row in staged(pg)] == ["rides", "", ""]


def test_autocommit_connection_without_transaction_is_refused(settings: Settings, pg: psycopg.Connection[Any]) -> None:
    with psycopg.connect(settings.conninfo, autocommit=True) as conn:
        with pytest.raises(NotInTransaction, match="autocommit"):
            emit(conn, action="create", object="ride", data={})
        with conn.transaction():
            emit(conn, action="create", object="ride", data={"ok": True})
    engine = create_engine(sqlalchemy_url(settings.database_url), isolation_level="AUTOCOMMIT")
    with engine.connect() as sa_conn, pytest.raises(NotInTransaction):
        emit(sa_conn, action="create", object="ride", data={})
    engine.dispose()
    assert [row[2] for row in staged(pg)] == [{"ok": True}]


class Unserializable:
    pass


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"data": {"ride": {"when": Unserializable()}}},
            PayloadNotSerializable,
            r"data\['ride'\]\['when'\].*Unserializable",
        ),
        ({"data": {"distance": float("nan")}}, PayloadNotSerializable, r"data\['distance'\] is nan"),
        ({"data": {"d": [1, float("inf")]}}, PayloadNotSerializable, r"data\['d'\]\[1\] is inf"),
        ({"data": {"d": float("-inf")}}, PayloadNotSerializable, r"-inf"),
        ({"data": {"note": "a\x00b"}}, PayloadNotSerializable, r"data\['note'\] contains a NUL"),
        ({"data": {"bad": "\ud800"}}, PayloadNotSerializable, r"lone surrogate"),
        ({"data": {("a", "b"): 1}}, PayloadNotSerializable, r"key of type tuple"),
        ({"data": {1, 2}}, PayloadNotSerializable, r"data is of type set"),
        ({"action": ""}, InvalidRecord, r"action must not be empty"),
        ({"action": "   "}, InvalidRecord, r"action must not be empty"),
        ({"object": ""}, InvalidRecord, r"object must not be empty"),
        ({"object": None}, InvalidRecord, r"object must be a string, got NoneType"),
        ({"stream": ""}, InvalidStreamName, r"invalid stream name ''"),
        ({"stream": "has space"}, InvalidStreamName, r"invalid stream name 'has space'"),
        ({"stream": "x" * 201}, InvalidStreamName, r"invalid stream name"),
        ({"stream": 5}, InvalidStreamName, r"must be a string"),
        ({"key": ""}, InvalidRecord, r"key must not be empty"),
    ],
)
def test_bad_input_is_rejected_before_writing(
    settings: Settings, pg: psycopg.Connection[Any], kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    record: dict[str, Any] = {"action": "create", "object": "ride", "data": {"id": 1}, **kwargs}
    with psycopg.connect(settings.conninfo) as conn:
        with pytest.raises(error, match=message):
            emit(conn, **record)
        # the transaction is still usable: a good record in the same transaction commits
        emit(conn, action="create", object="ride", data={"id": "good"})
        conn.commit()
    assert [row[2] for row in staged(pg)] == [{"id": "good"}]


def test_payload_size_limit_is_configurable(settings: Settings, pg: psycopg.Connection[Any]) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        with pytest.raises(PayloadTooLarge, match=r"over the limit of 1048576 bytes"):
            emit(conn, action="a", object="o", data={"blob": "x" * (1 << 20)})
        small = Producer(max_payload_bytes=100)
        with pytest.raises(PayloadTooLarge, match=r"over the limit of 100 bytes"):
            small.emit(conn, action="a", object="o", data={"blob": "é" * 60})  # 120 bytes of UTF-8
        small.emit(conn, action="a", object="o", data={"blob": "é" * 30})
        conn.commit()
    assert len(staged(pg)) == 1


def test_errors_are_unilog_errors() -> None:
    assert issubclass(PayloadTooLarge, unilog.UnilogError)
    assert issubclass(unilog.InjectedCrash, BaseException)
    assert not issubclass(unilog.InjectedCrash, Exception)


def test_reference_style_raw_insert_uses_defaults(settings: Settings, pg: psycopg.Connection[Any]) -> None:
    pg.execute(
        "INSERT INTO staged_log_records (action, object, data) VALUES ('create', 'ride', %s::jsonb)",
        (json.dumps({"id": 7, "distance": 1.5}),),
    )
    row = pg.execute("SELECT stream, key, xid IS NOT NULL, created_at IS NOT NULL FROM staged_log_records").fetchone()
    assert row == ("", None, True, True)


def test_emit_without_migrations_says_so(unilog_postgres: Any) -> None:
    from unilog.harness.pytest_plugin import drop_database

    url = unilog_postgres.url_for("postgres")
    with psycopg.connect(url) as conn:
        with pytest.raises(SchemaMissing, match="unilog migrate"):
            emit(conn, action="a", object="o", data={})
        conn.rollback()
    del drop_database
