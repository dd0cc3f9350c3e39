"""Rocket Rides' typed records (services/records.py): the migrate step registers them, so the log's AsyncAPI
document has them; a ride that breaks the type is refused in the producer's transaction; the distance consumer reads
typed records exactly, records written before the demo typed them too, and skips the others."""

from __future__ import annotations

import json
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from unilog_demo.consumer import apply_rides
from unilog_demo.migrate import prepare, register_types
from unilog_demo.records import RideCreated
from unilog_demo.rides import CHECKSUM_MOD, STREAM, Totals, consumer_totals, ride_checksum

import unilog
from unilog import Consumer, ConsumerConfig, Record, Settings, Streamer
from unilog.cli import main
from unilog.errors import RecordContractViolation
from unilog.store import schemas


def test_migrate_registers_the_record_types_and_the_asyncapi_document_has_them(
    settings: Settings, pg: Any, tmp_path: Path
) -> None:
    prepare(settings.database_url)
    assert register_types(settings.database_url) == [], "registered by prepare; again, nothing changes"
    rows = schemas.registered(pg, "RideCreated")
    assert [(r.version, r.stream, r.object, r.action) for r in rows] == [(1, STREAM, "ride", "create")]
    assert rows[0].fingerprint == RideCreated.__unilog_contract__.fingerprint()
    out = tmp_path / "doc.json"
    urls = ["--database-url", settings.database_url, "--redis-url", settings.redis_url]
    assert main(["asyncapi", "--out", str(out), *urls]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["channels"][STREAM]["messages"]) == {"RideCreated_v1"}


def test_a_ride_that_breaks_the_type_is_refused_with_nothing_staged(settings: Settings, pg: Any) -> None:
    prepare(settings.database_url)
    with psycopg.connect(settings.conninfo) as conn, conn.transaction():
        bad = RideCreated.model_construct(id=1, distance=Decimal("1.2345"), cid=None)  # finer than NUMERIC(14, 3)
        with pytest.raises(RecordContractViolation) as caught:
            unilog.emit(conn, bad)
        assert (caught.value.field, caught.value.rule) == ("distance", "decimal_max_places")
        unilog.emit(conn, RideCreated(id=1, distance=Decimal("1.234")), key="ride-1")  # the transaction goes on
    assert pg.execute("SELECT data, record_type FROM staged_log_records").fetchall() == [
        ({"id": 1, "distance": "1.234", "cid": None}, "RideCreated@1")
    ]


def test_the_consumer_adds_typed_and_older_untyped_rides_exactly_and_skips_the_rest(
    settings: Settings, pg: Any
) -> None:
    prepare(settings.database_url)
    own = settings.with_(stream=STREAM)
    with psycopg.connect(own.conninfo) as conn, conn.transaction():
        unilog.emit(conn, RideCreated(id=1, distance=Decimal("0.100")), key="ride-1")
        unilog.emit(conn, RideCreated(id=2, distance=Decimal("0.200"), cid="p0-1"), key="ride-2")
        # written before the demo typed its records: a float, read as the type
        unilog.emit(conn, action="create", object="ride", data={"id": 3, "distance": 0.3}, stream=STREAM)
        unilog.emit(conn, action="backfill", object="ride", data={"id": 1, "distance": "0.100"}, stream=STREAM)
        unilog.emit(conn, action="poison", object="chaos", data={"poison": True, "cid": "x"}, stream=STREAM)
    Streamer(own).drain()
    seen: list[list[str | None]] = []

    def handler(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
        seen.append([r.type_name for r in records])
        apply_rides("typed", conn, records)

    Consumer(own, ConsumerConfig(name="typed"), handler).drain()
    assert seen == [["RideCreated", "RideCreated", None, None, None]]
    checksum = sum(ride_checksum(i) for i in (1, 2, 3)) % CHECKSUM_MOD
    assert consumer_totals(pg)["typed"] == Totals(Decimal("0.600"), 3, checksum), "0.1 + 0.2 + 0.3, exactly"
