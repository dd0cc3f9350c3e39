"""The Rocket Rides API on a real database: rides and their log records commit together; bad input writes nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from flask.testing import FlaskClient
from unilog_demo.api import create_app
from unilog_demo.migrate import prepare
from unilog_demo.rides import STREAM

from unilog import Settings


@pytest.fixture
def client(settings: Settings) -> Iterator[FlaskClient]:
    prepare(settings.database_url)
    app = create_app(settings.database_url)
    yield app.test_client()


def counts(pg: psycopg.Connection[Any]) -> tuple[int, int]:
    rides = pg.execute("SELECT count(*) FROM rides").fetchone()[0]
    staged = pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0]
    return rides, staged


def test_post_ride_json_and_form(client: FlaskClient, pg: psycopg.Connection[Any]) -> None:
    response = client.post("/rides", json={"distance": 12.3456})
    assert response.status_code == 201
    ride = response.get_json()["ride"]
    assert ride["distance"] == 12.346
    response = client.post("/rides", data={"distance": "7"})
    assert response.status_code == 201
    rows = pg.execute(
        "SELECT data, stream, key, action, object, record_type FROM staged_log_records ORDER BY id"
    ).fetchall()
    # a typed RideCreated record: the distance an exact decimal string, no chaos id
    data = {"id": ride["id"], "distance": "12.346", "cid": None}
    assert rows[0] == (data, STREAM, f"ride-{ride['id']}", "create", "ride", "RideCreated@1")
    assert rows[1][0]["distance"] == "7.000"
    assert pg.execute("SELECT distance FROM rides ORDER BY id").fetchall() == [(Decimal("12.346"),), (Decimal("7"),)]


@pytest.mark.parametrize(
    ("body", "as_json", "message"),
    [
        ({}, True, "distance is required"),
        ({"distance": None}, True, "distance is required"),
        ({"distance": ""}, False, "distance is required"),
        ({"distance": "abc"}, True, "must be a number"),
        ({"distance": "abc"}, False, "must be a number"),
        ({"distance": [1]}, True, "must be a number"),
        ({"distance": True}, True, "must be a number"),
        ({"distance": -1}, True, "must not be negative"),
        ({"distance": "-0.5"}, False, "must not be negative"),
        ({"distance": "NaN"}, False, "must be finite"),
        ({"distance": "nan"}, True, "must be finite"),
        ({"distance": "Infinity"}, True, "must be finite"),
        ({"distance": "-inf"}, False, "must be finite"),
        ({"distance": "1e400"}, True, "must be finite"),
        ({"distance": 1e12}, True, "must be below"),
    ],
)
def test_bad_distance_is_422_naming_the_field_and_writes_nothing(
    client: FlaskClient, pg: psycopg.Connection[Any], body: dict[str, Any], as_json: bool, message: str
) -> None:
    response = client.post("/rides", json=body) if as_json else client.post("/rides", data=body)
    assert response.status_code == 422
    error = response.get_json()["error"]
    assert error["field"] == "distance" and message in error["message"]
    assert counts(pg) == (0, 0)


def test_raw_json_nan_and_non_object_bodies(client: FlaskClient, pg: psycopg.Connection[Any]) -> None:
    response = client.post("/rides", data='{"distance": NaN}', content_type="application/json")
    assert response.status_code == 422 and response.get_json()["error"]["field"] == "distance"
    response = client.post("/rides", data="[1, 2]", content_type="application/json")
    assert response.status_code == 422 and response.get_json()["error"]["field"] == "body"
    response = client.post("/rides", data="{not json", content_type="application/json")
    assert response.status_code == 422
    assert counts(pg) == (0, 0)


def test_health(client: FlaskClient) -> None:
    assert client.get("/health").get_json() == {"status": "ok"}


def test_concurrent_posts_retry_serialization_failures(client: FlaskClient, pg: psycopg.Connection[Any]) -> None:
    """SERIALIZABLE transactions under contention: every 201 has its ride and its record, nothing else exists."""
    pg.execute("CREATE INDEX IF NOT EXISTS rides_distance ON rides (distance)")  # more read/write dependencies
    statuses: list[int] = []

    def post_many() -> None:
        for i in range(25):
            statuses.append(client.post("/rides", json={"distance": i}).status_code)

    threads = [threading.Thread(target=post_many) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses.count(201) == len(statuses) == 150
    assert counts(pg) == (150, 150)
    ids = {r[0] for r in pg.execute("SELECT (data->>'id')::bigint FROM staged_log_records")}
    assert ids == {r[0] for r in pg.execute("SELECT id FROM rides")}


def test_serialization_failure_is_retried_and_nothing_doubles(client: FlaskClient, pg: psycopg.Connection[Any]) -> None:
    """A real SQLSTATE 40001 from Postgres on the first two attempts (a trigger fed by a non-transactional sequence)."""
    pg.execute("CREATE SEQUENCE fail_seq")
    pg.execute(
        """
        CREATE FUNCTION fail_twice() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF nextval('fail_seq') <= 2 THEN
                RAISE EXCEPTION 'injected conflict' USING ERRCODE = 'serialization_failure';
            END IF;
            RETURN NULL;
        END $$
        """
    )
    pg.execute(
        "CREATE TRIGGER fail_twice AFTER INSERT ON staged_log_records FOR EACH ROW EXECUTE FUNCTION fail_twice()"
    )
    response = client.post("/rides", json={"distance": 5})
    assert response.status_code == 201
    assert pg.execute("SELECT last_value FROM fail_seq").fetchone() == (3,), "two failed attempts, then success"
    assert counts(pg) == (1, 1)
