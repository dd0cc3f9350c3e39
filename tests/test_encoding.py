"""What ``emit`` makes of the values an ORM hands you (issue 28): ``Decimal``, ``UUID``, dates and times and
``bytes`` are encoded by the documented rules (docs/guides/producers.md) and come back exactly when read by those
rules; anything else goes to the application's ``default`` encoder, whose failures are one clear
``PayloadNotSerializable`` line. Each value is read from a real table (Numeric, uuid, timestamptz, date, time,
bytea columns) the way SQLAlchemy gives it, staged, and decoded again from the staged row."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import uuid
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from unilog import PayloadNotSerializable, Producer, Settings, emit, emit_async
from unilog.config import sqlalchemy_url

COLUMNS = "price NUMERIC(20, 6), ident UUID, at TIMESTAMPTZ, naive TIMESTAMP, day DATE, clock TIME, blob BYTEA"
ROW = {
    "price": Decimal("12345678901234.300000"),  # more digits than a float keeps
    "ident": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "at": dt.datetime(2024, 5, 1, 12, 30, 15, 123456, tzinfo=dt.UTC),
    "naive": dt.datetime(2024, 5, 1, 12, 30),
    "day": dt.date(2024, 2, 29),
    "clock": dt.time(23, 59, 58),
    "blob": bytes(range(256)),
}
# the documented rules, read back
DECODE = {
    "price": Decimal,
    "ident": uuid.UUID,
    "at": dt.datetime.fromisoformat,
    "naive": dt.datetime.fromisoformat,
    "day": dt.date.fromisoformat,
    "clock": dt.time.fromisoformat,
    "blob": base64.b64decode,
}


def staged_data(pg: psycopg.Connection[Any]) -> list[Any]:
    return [row[0] for row in pg.execute("SELECT data FROM staged_log_records ORDER BY id")]


def orm_values(settings: Settings) -> dict[str, Any]:
    """The row as SQLAlchemy returns it from the database: the types models hand to emit."""
    engine = create_engine(sqlalchemy_url(settings.database_url))
    with engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE IF NOT EXISTS typed ({COLUMNS})"))
        conn.execute(text("DELETE FROM typed"))
        conn.execute(text(f"INSERT INTO typed VALUES ({', '.join(':' + name for name in ROW)})"), ROW)
        values = dict(conn.execute(text("SELECT * FROM typed")).mappings().one())
    engine.dispose()
    assert values == ROW and type(values["price"]) is Decimal and type(values["ident"]) is uuid.UUID
    return values


def test_decimal_uuid_dates_times_and_bytes_round_trip_by_the_documented_rules(
    settings: Settings, pg: psycopg.Connection[Any]
) -> None:
    values = orm_values(settings)
    engine = create_engine(sqlalchemy_url(settings.database_url))
    with Session(engine) as session, session.begin():
        emit(session, action="create", object="typed", data={**values, "nested": [values["price"]]})
    engine.dispose()
    [data] = staged_data(pg)
    assert data["price"] == "12345678901234.300000", "a Decimal is its exact string"
    assert data["nested"] == ["12345678901234.300000"]
    assert data["ident"] == "12345678-1234-5678-1234-567812345678"
    assert data["at"] == "2024-05-01T12:30:15.123456+00:00" and data["naive"] == "2024-05-01T12:30:00"
    assert data["day"] == "2024-02-29" and data["clock"] == "23:59:58"
    assert data["blob"] == base64.b64encode(ROW["blob"]).decode("ascii")
    assert {name: DECODE[name](data[name]) for name in ROW} == ROW


def test_emit_async_and_a_producer_encode_the_same_way(settings: Settings, pg: psycopg.Connection[Any]) -> None:
    pytest.importorskip("greenlet")

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(settings.conninfo) as conn:
            await emit_async(conn, action="create", object="typed", data=ROW)

    asyncio.run(scenario())
    with psycopg.connect(settings.conninfo) as conn:
        Producer(max_payload_bytes=4096).emit(conn, action="create", object="typed", data=ROW)
    first, second = staged_data(pg)
    assert first == second and {name: DECODE[name](first[name]) for name in ROW} == ROW


class Money:
    def __init__(self, cents: int, currency: str) -> None:
        self.cents, self.currency = cents, currency


def money(value: Any) -> Any:
    if isinstance(value, Money):
        return {"cents": value.cents, "currency": value.currency, "at": dt.date(2024, 1, 2)}  # rules apply to it
    raise TypeError(f"cannot encode {type(value).__name__}")


def test_a_default_encoder_takes_what_the_rules_do_not_cover(settings: Settings, pg: psycopg.Connection[Any]) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        with pytest.raises(PayloadNotSerializable, match=r"data\['total'\] is of type Money.*give a default= encoder"):
            emit(conn, action="create", object="order", data={"total": Money(1250, "EUR")})
        emit(conn, action="create", object="order", data={"total": Money(1250, "EUR")}, default=money)
        Producer(default=money).emit(conn, action="create", object="order", data=[Money(5, "USD"), Decimal("1.5")])
        conn.commit()
    assert staged_data(pg) == [
        {"total": {"cents": 1250, "currency": "EUR", "at": "2024-01-02"}},
        [{"cents": 5, "currency": "USD", "at": "2024-01-02"}, "1.5"],
    ]


class Opaque:
    pass


@pytest.mark.parametrize(
    ("default", "message"),
    [
        (money, r"data\['x'\]\[0\] is of type Opaque, and the default= encoder raised TypeError: cannot encode Opaque"),
        (lambda value: 1 / 0, r"data\['x'\]\[0\] is of type Opaque, and the default= encoder raised ZeroDivisionError"),
        (lambda value: value, r"data\['x'\]\[0\] is of type Opaque, and the default= encoder returned it unchanged"),
        (lambda value: {"bad": "a\x00b"}, r"data\['x'\]\[0\]\['bad'\] contains a NUL character"),
        (lambda value: float("nan"), r"data\['x'\]\[0\] is nan"),
    ],
)
def test_a_failing_default_encoder_is_one_clear_line_and_the_transaction_stays_usable(
    settings: Settings, pg: psycopg.Connection[Any], default: Any, message: str
) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        with pytest.raises(PayloadNotSerializable, match=message) as caught:
            emit(conn, action="create", object="o", data={"x": [Opaque()]}, default=default)
        assert "\n" not in str(caught.value)
        emit(conn, action="create", object="o", data={"ok": True})
        conn.commit()
    assert staged_data(pg) == [{"ok": True}]


def test_the_rules_do_not_change_what_json_already_holds() -> None:
    from unilog.produce.encoding import encode_data

    plain = {"s": "x", "n": 1, "f": 1.5, "b": True, "z": None, "l": [1, "2"], "t": (3,)}
    assert json.loads(encode_data(plain)) == {**plain, "t": [3]}
