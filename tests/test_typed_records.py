"""Typed records end to end (issue 37): a record type's instance refused in the producer's transaction when it
breaks its type, with nothing staged; its type and version carried from ``emit`` (table and WAL mode) through the
streamer to the entry's ``type`` field; read back as instances, exact ``Decimal`` s included, by a checkpoint
consumer (both faces), a group and a partitioned consumer; a v1 record read by a v2 consumer through its upcaster;
an unknown newer version dead-lettered with its reason; ``unilog_emit`` with a registered type from SQL; a typed
backfill. The Spark reader's typed rows are in tests/test_spark.py (slow)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import psycopg
import pytest
import redis
from typed_records import STREAM, ChargeCaptured, RideCreated, RideCreatedV1, RideCreatedV3, RideFinished

from unilog import (
    AsyncConsumer,
    Consumer,
    ConsumerConfig,
    GroupConfig,
    GroupConsumer,
    PartitionConfig,
    PartitionedConsumer,
    Settings,
    Streamer,
    emit,
    emit_async,
    emit_many,
)
from unilog.engine import RedisStreams, connect
from unilog.errors import BackfillRefused, InvalidRecord, RecordContractViolation
from unilog.produce.backfill import Backfill, BackfillConfig, start
from unilog.wire import dlq_key

RIDE = uuid.UUID("00000000-0000-4000-8000-000000000001")


def staged(pg: Any) -> list[tuple[Any, ...]]:
    return pg.execute(
        "SELECT object, action, key, record_type, data::text FROM staged_log_records ORDER BY id"
    ).fetchall()


def drain(settings: Settings) -> None:
    with Streamer(settings) as streamer:
        streamer.drain(timeout=60)


def entries(settings: Settings, stream: str = STREAM) -> list[dict[bytes, bytes]]:
    client = redis.Redis.from_url(settings.redis_url)
    try:
        return [fields for _, fields in client.xrange(stream)]
    finally:
        client.close()


# -- refused in the producer's transaction ---------------------------------------------------------------------------


def test_a_bad_typed_emit_is_refused_naming_field_and_rule_with_nothing_staged(settings: Settings, pg: Any) -> None:
    bad = RideCreated.model_construct(ride_id=RIDE, rider="ann", fare="twelve", city="Lyon")  # made unvalidated
    changed = RideCreated(ride_id=RIDE, rider="ann", fare=Decimal("1"))
    changed.rider = None  # type: ignore[assignment]  # pydantic does not validate assignments by default
    with psycopg.connect(settings.conninfo) as conn:
        with pytest.raises(RecordContractViolation, match="fare") as refused:
            emit(conn, bad)
        assert refused.value.field == "fare" and refused.value.rule == "decimal_parsing"
        assert str(refused.value).count("\n") == 0 and "TypedRide v2" in str(refused.value)
        with pytest.raises(RecordContractViolation) as assigned:
            emit(conn, changed)
        assert assigned.value.field == "rider" and assigned.value.rule == "string_type"
        with pytest.raises(RecordContractViolation) as dataclass_refused:
            emit(conn, RideFinished(ride_id=RIDE, distance_km="far"))  # type: ignore[arg-type]
        assert dataclass_refused.value.field == "distance_km"
        with pytest.raises(InvalidRecord, match="sets its own action, object, data and stream"):
            emit(conn, RideCreated(ride_id=RIDE, rider="ann", fare=Decimal("1")), action="other")
        with pytest.raises(RecordContractViolation) as in_many:
            emit_many(conn, [RideCreated(ride_id=RIDE, rider="ann", fare=Decimal("1")), bad])
        assert in_many.value.index == 1 and str(in_many.value).startswith(f"records[1] (key '{RIDE}')")
        assert staged(pg) == [], "nothing staged, not even the good record of the refused emit_many"
        # the transaction is still usable: a good record commits
        emit(conn, RideCreated(ride_id=RIDE, rider="ann", fare=Decimal("12.30")))
        conn.commit()
    [(obj, action, key, record_type, data)] = staged(pg)
    assert (obj, action, key, record_type) == ("ride", "created", str(RIDE), "TypedRide@2")
    assert json.loads(data) == {"ride_id": str(RIDE), "rider": "ann", "fare": "12.30", "city": "unknown"}


def test_an_async_typed_emit_is_refused_and_stages_alike(settings: Settings, pg: Any) -> None:
    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(settings.conninfo) as conn:
            with pytest.raises(RecordContractViolation, match="fare"):
                await emit_async(conn, RideCreated.model_construct(ride_id=RIDE, rider="a", fare=[1]))
            await emit_async(conn, RideFinished(ride_id=RIDE, distance_km=Decimal("3.50")))
            await conn.commit()

    asyncio.run(run())
    assert [(r[0], r[1], r[3]) for r in staged(pg)] == [("ride", "finished", "TypedRideFinished@1")]


# -- carried to the entry and read back typed ------------------------------------------------------------------------


def _emit_versions(settings: Settings) -> None:
    """A v1 record (an old producer), a v2, an untyped record of another action, and a dataclass record."""
    with psycopg.connect(settings.conninfo) as conn:
        emit(conn, RideCreatedV1(ride_id=RIDE, name="ann", fare=Decimal("7.10")))
        emit(conn, RideCreated(ride_id=uuid.UUID(int=2), rider="bob", fare=Decimal("12.30"), city="Lyon"))
        emit(conn, action="noted", object="ride", data={"note": "untyped"}, stream=STREAM)
        emit(conn, RideFinished(ride_id=RIDE, distance_km=Decimal("3.50")))
        conn.commit()


def _check_rides(rides: list[Any]) -> None:
    assert [type(r) for r in rides] == [RideCreated, RideCreated]
    old, new = rides
    assert (old.ride_id, old.rider, old.fare, old.city) == (RIDE, "ann", Decimal("7.10"), "unknown"), "upcast v1"
    assert (new.rider, new.city) == ("bob", "Lyon")
    assert isinstance(new.fare, Decimal) and str(new.fare) == "12.30", "exact, not a float"


@pytest.mark.parametrize("mode", ["table", "wal"])
@pytest.mark.parametrize("face", ["sync", "async"])
def test_typed_records_reach_a_checkpoint_consumer_through_the_handlers_annotation(
    settings: Settings, pg: Any, request: pytest.FixtureRequest, mode: str, face: str
) -> None:
    if mode == "wal":
        request.getfixturevalue("wal")
    app = settings.with_(stream=STREAM)
    _emit_versions(app)
    drain(app)
    fields = entries(app)
    assert [f.get(b"type") for f in fields] == [b"TypedRide@1", b"TypedRide@2", None, b"TypedRideFinished@1"]
    assert fields[0][b"key"] == str(RIDE).encode() and fields[1][b"key"] == str(uuid.UUID(int=2)).encode()
    rides: list[Any] = []
    if face == "sync":

        def handle(conn: Any, records: Sequence[RideCreated]) -> None:
            rides.extend(records)

        with Consumer(app, ConsumerConfig(name=f"typed-{mode}"), handle) as consumer:
            consumer.drain()
    else:

        async def handle_async(conn: Any, records: Sequence[RideCreated]) -> None:
            rides.extend(records)

        async def run() -> None:
            async with AsyncConsumer(app, ConsumerConfig(name=f"typed-{mode}"), handle_async) as consumer:
                await consumer.drain()

        asyncio.run(run())
    _check_rides(rides)


def test_a_group_reads_typed_records_with_records_typed(settings: Settings, pg: Any) -> None:
    app = settings.with_(stream=STREAM)
    _emit_versions(app)
    drain(app)
    rides: list[Any] = []
    finished: list[Any] = []
    versions: list[Any] = []

    def handle(conn: Any, records: Any) -> None:
        rides.extend(records.typed(RideCreated))
        finished.extend(records.typed(RideFinished))
        versions.extend((r.type_name, r.type_version) for r in records)

    with GroupConsumer(app, GroupConfig(group="typed-group"), handle) as group:
        group.drain()
    _check_rides(rides)
    assert finished == [RideFinished(ride_id=RIDE, distance_km=Decimal("3.50"))]
    assert versions == [("TypedRide", 1), ("TypedRide", 2), (None, None), ("TypedRideFinished", 1)]


def test_a_partitioned_stream_carries_typed_records_to_each_partition(settings: Settings, pg: Any) -> None:
    api = RedisStreams(connect(settings.redis_url))
    api.set_partitions("typed-parts", 4)
    api.close()
    app = settings.with_(stream="typed-parts")
    with psycopg.connect(app.conninfo) as conn:
        for i in range(12):
            emit(conn, ChargeCaptured(account=f"acct-{i % 6}", amount=Decimal(f"{i}.05")))
        conn.commit()
    drain(app)
    seen: list[Any] = []

    def handle(conn: Any, records: Sequence[ChargeCaptured]) -> None:
        seen.extend(records)

    with PartitionedConsumer(app, PartitionConfig(name="typed-p"), handle) as consumer:
        consumer.drain()
    assert sorted(c.amount for c in seen) == [Decimal(f"{i}.05") for i in range(12)]
    per_partition = [entries(app, f"typed-parts.p{i}") for i in range(4)]
    assert sum(len(p) for p in per_partition) == 12 and sum(1 for p in per_partition if p) > 1
    assert {f[b"type"] for p in per_partition for f in p} == {b"TypedCharge@1"}


# -- evolution: an unknown newer version -----------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "kind"), [("table", "checkpoint"), ("wal", "checkpoint"), ("table", "group")])
def test_an_unknown_newer_version_is_dead_lettered_with_its_reason(
    settings: Settings, pg: Any, request: pytest.FixtureRequest, mode: str, kind: str
) -> None:
    if mode == "wal":
        request.getfixturevalue("wal")
    app = settings.with_(stream=STREAM)
    with psycopg.connect(app.conninfo) as conn:
        emit(conn, RideCreated(ride_id=RIDE, rider="ann", fare=Decimal("1.00")))
        emit(conn, RideCreatedV3(ride_id=RIDE, rider="ann", fare=Decimal("2.00"), city="Oslo", surge=Decimal("1.5")))
        emit(conn, RideCreated(ride_id=RIDE, rider="cat", fare=Decimal("3.00")))
        conn.commit()
    drain(app)
    applied: list[Any] = []

    def handle(conn: Any, records: Sequence[RideCreated]) -> None:
        applied.extend(r.fare for r in records)

    if kind == "group":
        with GroupConsumer(app, GroupConfig(group="behind"), handle) as group:
            group.drain()
    else:
        with Consumer(app, ConsumerConfig(name="behind"), handle) as consumer:
            consumer.drain()
    assert applied == [Decimal("1.00"), Decimal("3.00")], "the records around it are applied, once each"
    client = redis.Redis.from_url(app.redis_url)
    try:
        [(_, letter)] = client.xrange(dlq_key(STREAM))
    finally:
        client.close()
    assert letter[b"type"] == b"TypedRide@3"
    assert "TypedRide v3 is newer than v2, the newest this consumer knows" in letter[b"dlq_error"].decode()


# -- other languages: unilog_emit with a type ------------------------------------------------------------------------


def _register(pg: Any, cls: type) -> None:
    contract = cls.__unilog_contract__  # type: ignore[attr-defined]
    pg.execute(
        "INSERT INTO unilog_schemas (name, version, stream, object, action, schema, fingerprint) "
        "VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s)",
        (contract.name, contract.version, contract.stream or "", contract.object, contract.action,
         json.dumps(contract.json_schema()), contract.fingerprint()),
    )  # fmt: skip


def test_unilog_emit_checks_a_registered_type_and_the_consumer_reads_it_typed(settings: Settings, pg: Any) -> None:
    _register(pg, RideCreated)
    call = "SELECT unilog_emit(%s, %s, 'created', 'ride', %s::jsonb, record_type => %s, record_version => %s)"
    good = {"ride_id": str(RIDE), "rider": "sql", "fare": "4.20"}
    refusals = [
        ((STREAM, None, json.dumps({"ride_id": str(RIDE), "fare": "1"}), "TypedRide", 2), "requires rider"),
        ((STREAM, None, json.dumps(good), "TypedRide", 9), "TypedRide@9 is not registered"),
        (("elsewhere", None, json.dumps(good), "TypedRide", 2), "is registered for stream 'typed-rides'"),
        ((STREAM, None, "[1]", "TypedRide", 2), "needs a JSON object"),
        ((STREAM, None, json.dumps(good), "TypedRide", None), "record_type and record_version together"),
        ((STREAM, None, json.dumps(good), "bad name!", 1), "invalid record type"),
    ]
    for params, message in refusals:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
            pg.execute(call, params)
    pg.execute(call, (STREAM, "k1", json.dumps(good), "TypedRide", 2))
    pg.execute(  # a field of the wrong type passes SQL's check: the consumer refuses it, as the guide says
        call, (STREAM, "k2", json.dumps({**good, "fare": "lots"}), "TypedRide", 2)
    )
    app = settings.with_(stream=STREAM)
    drain(app)
    fares: list[Any] = []

    def handle(conn: Any, records: Sequence[RideCreated]) -> None:
        fares.extend(r.fare for r in records)

    with Consumer(app, ConsumerConfig(name="from-sql"), handle) as consumer:
        consumer.drain()
    assert fares == [Decimal("4.20")]
    assert len(entries(app, dlq_key(STREAM))) == 1, "the record SQL could not check is dead-lettered"


# -- a backfill of typed records -------------------------------------------------------------------------------------


def test_a_backfill_stages_typed_records_and_refuses_a_row_the_type_refuses(settings: Settings, pg: Any) -> None:
    pg.execute("CREATE TABLE ride_rows (ride_id uuid PRIMARY KEY, rider text, fare numeric, city text, extra int)")
    pg.execute(
        "INSERT INTO ride_rows SELECT ('00000000-0000-4000-8000-' || lpad(i::text, 12, '0'))::uuid, 'r' || i, "
        "i + 0.10, 'Paris', i FROM generate_series(1, 5) i"
    )
    config = BackfillConfig(table="ride_rows", key="ride_id", record_type="typed_records:RideCreated", batch_size=2)
    start(settings, config)
    with Backfill(settings, config.backfill_name) as backfill:
        backfill.drain()
    rows = staged(pg)
    assert [(r[0], r[1], r[3]) for r in rows] == [("ride", "created", "TypedRide@2")] * 5
    assert json.loads(rows[0][4])["fare"] == "1.10", "numeric read exactly as the type's Decimal"
    assert "extra" not in json.loads(rows[0][4]), "the type's fields, not the table's columns"
    pg.execute("DELETE FROM staged_log_records")
    pg.execute("UPDATE ride_rows SET rider = NULL WHERE fare > 3")
    with pytest.raises(BackfillRefused, match=r"not a TypedRide@2: .*rider"):
        start(settings, BackfillConfig(table="ride_rows", key="ride_id", record_type="typed_records:RideCreated",
                                       name="again", batch_size=2))  # fmt: skip
        with Backfill(settings, "again") as backfill:
            backfill.drain()
    assert len(staged(pg)) == 2, "the pages before the refused row committed; nothing of its page did"
    with pytest.raises(BackfillRefused, match="--type sets the records' stream, object and action: drop --object"):
        BackfillConfig(table="ride_rows", key="ride_id", record_type="typed_records:RideCreated", object="x")
    with pytest.raises(BackfillRefused, match="is not a record type"):
        BackfillConfig(table="ride_rows", key="ride_id", record_type="typed_records:STREAM")
