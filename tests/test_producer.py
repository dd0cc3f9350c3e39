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


# emit_many: many records in one statement, with emit's checks, encoding and errors.


def _records(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"action": "create", "object": "ride", "data": {"n": i}, "key": f"ride-{i}"} for i in range(start, n)]


@pytest.mark.parametrize("handle", ["psycopg", "session", "connection"])
def test_emit_many_stages_in_order_and_a_rollback_stages_nothing(
    settings: Settings, pg: psycopg.Connection[Any], handle: str
) -> None:
    records = _records(50)[::-1]  # descending n: the order given, not any order of the data, is kept
    engine = create_engine(sqlalchemy_url(settings.database_url))
    if handle == "psycopg":
        with psycopg.connect(settings.conninfo) as conn:
            assert unilog.emit_many(conn, records[:3]) and staged(pg) == []
            conn.rollback()
            ids = unilog.emit_many(conn, records)
            conn.commit()
    else:
        with Session(engine) if handle == "session" else engine.connect() as tx:
            unilog.emit_many(tx, records[:3])
            tx.rollback()
            ids = unilog.emit_many(tx, records)
            tx.commit()
    engine.dispose()
    assert len(ids) == 50 and ids == sorted(ids), "one id per record, ascending in the order given"
    rows = staged(pg)
    assert [row[2]["n"] for row in rows] == list(range(49, -1, -1))
    assert rows[0] == ("create", "ride", {"n": 49}, "", "ride-49")
    by_id = pg.execute("SELECT id, data->>'n' FROM staged_log_records ORDER BY id").fetchall()
    assert [int(n) for _, n in by_id] == [r["data"]["n"] for r in records] and [i for i, _ in by_id] == ids


def test_emit_many_encodes_and_routes_as_emit_does(settings: Settings, pg: psycopg.Connection[Any]) -> None:
    import datetime as dt
    from decimal import Decimal

    record = {"action": "a", "object": "o", "data": {"d": Decimal("1.10"), "t": dt.date(2024, 5, 1), "b": b"\x00"}}
    with psycopg.connect(settings.conninfo) as conn:
        emit(conn, **record, stream="s1")
        unilog.emit_many(conn, [{**record, "stream": "s1"}, {**record, "key": None}])
        Producer(default_stream="s2").emit_many(conn, [{**record, "data": {"x": Unserializable()}}], default=repr)
        conn.commit()
    rows = staged(pg)
    assert rows[0] == rows[1] and rows[0][2] == {"d": "1.10", "t": "2024-05-01", "b": "AA=="} and rows[0][3] == "s1"
    assert rows[2][3:] == ("", None) and rows[3][3] == "s2" and rows[3][2]["x"].startswith("<")


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        ({"data": {"x": float("nan")}}, PayloadNotSerializable, r"^records\[2\] \(key 'ride-2'\): data\['x'\] is nan"),
        ({"data": {"blob": "x" * (1 << 20)}}, PayloadTooLarge, r"^records\[2\] .*over the limit of 1048576 bytes"),
        ({"action": ""}, InvalidRecord, r"^records\[2\] .*action must not be empty"),
        ({"stream": "has space"}, InvalidStreamName, r"^records\[2\] .*invalid stream name 'has space'"),
        ({"colour": "red"}, InvalidRecord, r"^records\[2\] .*unknown fields \['colour'\]"),
        ({"key": None, "data": None, "action": None}, InvalidRecord, r"^records\[2\]: action must be a string"),
    ],
)
def test_emit_many_refuses_the_whole_list_naming_the_bad_record(
    settings: Settings, pg: psycopg.Connection[Any], bad: dict[str, Any], error: type[Exception], message: str
) -> None:
    records: list[Any] = _records(5)
    records[2] = {**records[2], **bad}
    with psycopg.connect(settings.conninfo) as conn:
        with pytest.raises(error, match=message) as refused:
            unilog.emit_many(conn, records)
        assert refused.value.index == 2  # type: ignore[attr-defined]
        unilog.emit_many(conn, _records(1))  # nothing was sent: the transaction is still usable
        conn.commit()
    assert [row[2] for row in staged(pg)] == [{"n": 0}]


def test_emit_many_refuses_records_of_the_wrong_shape_and_handles_without_a_transaction(
    settings: Settings, pg: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        with pytest.raises(InvalidRecord, match=r"^records\[1\]: a record must be a mapping .*got tuple"):
            unilog.emit_many(conn, [*_records(1), ("create", "ride", {})])  # type: ignore[list-item]
        with pytest.raises(InvalidRecord, match=r"^records\[0\]: missing fields \['data'\]"):
            unilog.emit_many(conn, [{"action": "a", "object": "o"}])
    with (
        psycopg.connect(settings.conninfo, autocommit=True) as conn,
        pytest.raises(NotInTransaction, match=r"^emit_many\(\) needs an open transaction"),
    ):
        unilog.emit_many(conn, _records(2))
    with pytest.raises(TypeError, match=r"^emit_many\(\) needs"):
        unilog.emit_many(object(), _records(1))
    assert staged(pg) == []


def test_emit_many_of_nothing_sends_nothing(settings: Settings, pg: psycopg.Connection[Any]) -> None:
    with psycopg.connect(settings.conninfo, autocommit=True) as conn:
        assert unilog.emit_many(conn, []) == []  # not even the transaction check: there is nothing to stage
        assert unilog.emit_many(conn, iter(())) == []
    assert unilog.emit_many(object(), []) == []
    assert staged(pg) == []


def test_emit_many_stores_the_trace_context_of_the_active_span(
    settings: Settings, pg: psycopg.Connection[Any], spans: Any
) -> None:
    from opentelemetry import trace

    with trace.get_tracer("test").start_as_current_span("request") as span, psycopg.connect(settings.conninfo) as conn:
        unilog.emit_many(conn, _records(2))
        emit(conn, action="create", object="ride", data={})
        conn.commit()
    parents = [r[0] for r in pg.execute("SELECT traceparent FROM staged_log_records ORDER BY id")]
    trace_id = format(span.get_span_context().trace_id, "032x")
    assert len(set(parents)) == 1 and parents[0] is not None and trace_id in parents[0]


@pytest.mark.parametrize("mode", ["table", "wal"])
def test_emit_many_is_published_in_the_order_given_in_both_capture_modes(
    settings: Settings, pg: psycopg.Connection[Any], rds: Any, mode: str, request: pytest.FixtureRequest
) -> None:
    """Rows in table mode, logical messages in WAL mode (the ``wal`` fixture): either way the stream holds the
    records in the order given, interleaved with emit's in the same transaction as they were called."""
    from unilog import Streamer, StreamerConfig

    if mode == "wal":
        request.getfixturevalue("wal")
    records = [{"action": "create", "object": "ride", "data": {"n": n}, "stream": "many"} for n in (5, 3, 9, 1, 7)]
    with psycopg.connect(settings.conninfo) as conn:
        ids = unilog.emit_many(conn, records[:2])
        emit(conn, action="create", object="ride", data={"n": 0}, stream="many")
        ids += unilog.emit_many(conn, records[2:])
        conn.rollback()  # rolled back: neither a row nor a message is published
        unilog.emit_many(conn, records[:2])
        emit(conn, action="create", object="ride", data={"n": 0}, stream="many")
        ids = unilog.emit_many(conn, records[2:])
        conn.commit()
    assert (ids == [None] * 3) if mode == "wal" else all(isinstance(i, int) for i in ids)
    with Streamer(settings, StreamerConfig(restart_after_crash=False)) as streamer:
        assert streamer.drain(timeout=10) == 6
    assert [json.loads(f["data"])["n"] for _, f in rds.xrange("many")] == [5, 3, 0, 9, 1, 7]
    assert staged(pg) == []
