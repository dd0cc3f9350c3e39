"""Numbers arrive exactly as the source had them (issue 34, item 1).

A backfill sent a ``jsonb`` column through a Python float (``0.33333333333333333333`` arrived as
``0.3333333333333333``, ``0.75000000000000000000`` as ``0.75``), and ``Record.data`` reads every non-integral number
as a float. Now the backfill's JSON is built by Postgres, ``emit(data=RawJSON(text))`` stages JSON text as it is,
and every consumer kind reads ``Decimal`` with ``numbers="decimal"``. The property test round-trips arbitrary JSON
(big integers, long decimals, exponents) through both capture modes, from ``emit`` and from SQL's ``unilog_emit``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import psycopg
import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from unilog import (
    AsyncConsumer,
    AsyncGroupConsumer,
    Consumer,
    ConsumerConfig,
    GroupConfig,
    GroupConsumer,
    PartitionConfig,
    RawJSON,
    Record,
    Settings,
    Streamer,
    StreamerConfig,
    emit,
)
from unilog.errors import InvalidSetting, PayloadNotSerializable
from unilog.produce.backfill import Backfill, BackfillConfig, start
from unilog.stream.modes import enable_wal

EXAMPLES = int(os.environ.get("UNILOG_HYPOTHESIS_EXAMPLES") or 25)
DOC = '{"third": 0.33333333333333333333, "three_quarters": 0.75000000000000000000, "big": 123456789012345678901234567890, "tiny": 1e-30}'


def drain(settings: Settings) -> None:
    with Streamer(settings, StreamerConfig(restart_after_crash=False)) as s:
        s.drain(timeout=60)


def entries(settings: Settings, after: str = "-") -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The stream's entries after ``after``, as bytes (as a consumer reads them)."""
    client = redis.Redis.from_url(settings.redis_url)
    try:
        return client.xrange(settings.stream, after, "+")
    finally:
        client.close()


def stream_data(settings: Settings) -> list[bytes]:
    return [f[b"data"] for _, f in entries(settings)]


def exact(text: bytes | str) -> Any:
    return json.loads(text, parse_float=Decimal)


@pytest.mark.parametrize("mode", ["table", "wal"])
def test_a_backfill_carries_every_digit_of_numeric_jsonb_and_float_columns(
    settings: Settings, pg: Any, mode: str
) -> None:
    pg.execute(
        "CREATE TABLE amounts (id int PRIMARY KEY, doc jsonb, js json, amount numeric, price money, f4 real, "
        "f8 double precision, big bigint, xs numeric[])"
    )
    pg.execute(
        "INSERT INTO amounts VALUES (1, %s::jsonb, %s::json, 0.75000000000000000000, 12.34, 0.1, 0.1, "
        "9223372036854775807, ARRAY[1.10, 2.000])",
        (DOC, DOC),
    )
    if mode == "wal":
        enable_wal(settings)
    with Backfill(settings, start(settings, BackfillConfig("amounts", "id"))["name"]) as b:
        assert b.drain() == 1
    drain(settings)
    (raw,) = stream_data(settings)
    data = exact(raw)
    doc = exact(DOC)
    assert data["doc"] == doc and data["js"] == doc
    assert str(data["doc"]["third"]) == "0.33333333333333333333", "not through a float"
    assert data["amount"] == "0.75000000000000000000", "numeric is a string, as emit encodes a Decimal: every digit"
    assert data["price"] == "12.34" and data["xs"] == ["1.10", "2.000"]
    assert str(data["f4"]) == "0.1", "a real is Postgres's shortest text for it, not a double's expansion"
    assert data["f8"] == Decimal("0.1") and data["big"] == 9223372036854775807


def test_raw_json_is_staged_as_it_is_and_checked_first(settings: Settings, pg: Any) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        emit(conn, action="create", object="payment", data=RawJSON(DOC))
        for bad, reason in [
            ('{"x": NaN}', "NaN is not valid JSON"),
            ("{", "not one JSON value"),
            ('"a\\u0000b"', "NUL character"),
            ("1 2", "not one JSON value"),
        ]:
            with pytest.raises(PayloadNotSerializable, match=reason):
                emit(conn, action="create", object="payment", data=RawJSON(bad))
        with pytest.raises(
            PayloadNotSerializable, match=r"data\['x'\] is RawJSON, which is accepted only as the whole"
        ):
            emit(conn, action="create", object="payment", data={"x": RawJSON("1")})
        conn.commit()
    drain(settings)
    (raw,) = stream_data(settings)
    assert exact(raw) == exact(DOC) and str(exact(raw)["third"]) == "0.33333333333333333333"


def _emit_doc(settings: Settings) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(4):  # partitioned consumers route by key: one per partition at most
            emit(conn, action="pay", object="payment", data=RawJSON(DOC), key=f"k{i}")
        conn.commit()
    drain(settings)


def _collector(seen: list[Any]) -> Any:
    def handler(conn: Any, records: Sequence[Record]) -> None:
        seen.extend(r.data for r in records)

    return handler


def _async_collector(seen: list[Any]) -> Any:
    async def handler(conn: Any, records: Sequence[Record]) -> None:
        seen.extend(r.data for r in records)

    return handler


def _run_kind(settings: Settings, kind: str, numbers: str) -> list[Any]:
    seen: list[Any] = []
    name = f"{kind}-{numbers}"
    if kind == "checkpoint":
        with Consumer(settings, ConsumerConfig(name=name, numbers=numbers), _collector(seen)) as c:
            c.drain()
    elif kind == "group":
        with GroupConsumer(settings, GroupConfig(group=name, numbers=numbers), _collector(seen)) as g:
            g.drain()
    else:
        asyncio.run(_run_async(settings, kind, name, numbers, seen))
    return seen


async def _run_async(settings: Settings, kind: str, name: str, numbers: str, seen: list[Any]) -> None:
    if kind == "async":
        async with AsyncConsumer(settings, ConsumerConfig(name=name, numbers=numbers), _async_collector(seen)) as c:
            await c.drain()
    else:
        config = GroupConfig(group=name, numbers=numbers)
        async with AsyncGroupConsumer(settings, config, _async_collector(seen)) as g:
            await g.drain()


@pytest.mark.parametrize("kind", ["checkpoint", "group", "async", "async-group"])
def test_every_consumer_kind_reads_decimal_when_told_and_float_by_default(
    settings: Settings, pg: Any, kind: str
) -> None:
    _emit_doc(settings)
    exact_seen = _run_kind(settings, kind, "decimal")
    assert len(exact_seen) == 4
    assert all(d == exact(DOC) and isinstance(d["third"], Decimal) for d in exact_seen)
    assert str(exact_seen[0]["third"]) == "0.33333333333333333333"
    assert isinstance(exact_seen[0]["big"], int), "integers stay int"
    default_seen = _run_kind(settings, kind, "float")
    assert default_seen[0]["third"] == 0.3333333333333333 and isinstance(default_seen[0]["third"], float)


def test_numbers_is_checked_and_partitions_inherit_it() -> None:
    with pytest.raises(InvalidSetting, match="numbers must be one of float, decimal, not 'exact'"):
        ConsumerConfig(name="c", numbers="exact")
    partition = PartitionConfig(name="p", numbers="decimal").partition(0, "s:p0")
    assert partition.numbers == "decimal"


# -- the property: arbitrary JSON round-trips exactly ------------------------------------------------------------


def _number() -> st.SearchStrategy[Decimal | int]:
    big_ints = st.integers(min_value=-(10**40), max_value=10**40)
    decimals = st.builds(
        lambda sign, digits, exp: Decimal((sign, tuple(digits), exp)),
        st.integers(0, 1),
        st.lists(st.integers(0, 9), min_size=1, max_size=40),
        st.integers(-60, 60),
    )
    return big_ints | decimals


_scalars = (
    st.none()
    | st.booleans()
    | _number()
    | st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=8)
)
JSON_VALUES = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text(max_size=5).filter(lambda k: "\x00" not in k and all(not 0xD800 <= ord(c) <= 0xDFFF for c in k)),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


def render(value: Any) -> str:
    """JSON text with every number written as its digits (``str(Decimal)`` is a valid JSON number)."""
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k) + ":" + render(v) for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(render(v) for v in value) + "]"
    if isinstance(value, Decimal | int) and not isinstance(value, bool):
        return str(value)
    return json.dumps(value)


def same(a: Any, b: Any) -> bool:
    """Equal as JSON values, numbers compared as exact decimals (jsonb may write 1E+2 as 100)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    numeric = (int, Decimal)
    if isinstance(a, numeric) and isinstance(b, numeric) and not isinstance(a, bool) and not isinstance(b, bool):
        return Decimal(a) == Decimal(b)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("mode", ["table", "wal"])
def test_arbitrary_json_round_trips_exactly_from_emit_and_unilog_emit(settings: Settings, pg: Any, mode: str) -> None:
    if mode == "wal":
        enable_wal(settings)
    last = ["-"]

    @hypothesis_settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(JSON_VALUES, min_size=1, max_size=5))
    def round_trip(values: list[Any]) -> None:
        texts = [render(v) for v in values]
        with psycopg.connect(settings.conninfo) as conn:
            for text in texts:
                emit(conn, action="emit", object="doc", data=RawJSON(text))
                conn.execute("SELECT unilog_emit('', NULL, 'sql', 'doc', %s::jsonb)", (text,))
            conn.commit()
        drain(settings)
        new = entries(settings, "(" + last[0] if last[0] != "-" else "-")
        last[0] = new[-1][0].decode()
        got = [Record(settings.stream, eid, fields, "decimal").data for eid, fields in new]
        expected = [v for v in values for _ in range(2)]
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            assert same(g, e), (g, e)

    round_trip()
