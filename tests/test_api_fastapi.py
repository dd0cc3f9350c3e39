"""The FastAPI rides API (``services/api_fastapi.py``) served by a real uvicorn on the test's database: the ride and
its record in one AsyncSession transaction, the Flask API's validation, serialization failures retried under
concurrent requests, and ``unilog demo --api fastapi`` agreeing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from unilog_demo.migrate import prepare
from unilog_demo.rides import STREAM

from unilog import Settings
from unilog.harness.embedded import free_port

ROOT = Path(__file__).parent.parent


@pytest.fixture
def api(settings: Settings, tmp_path: Path) -> Iterator[str]:
    prepare(settings.database_url)
    port = free_port()
    # unbuffered: a test reads the API's log lines while it runs
    env = {**os.environ, "DATABASE_URL": settings.database_url, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port), "unilog_demo.api_fastapi:app"]
    with open(tmp_path / "uvicorn.log", "w") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if call(url + "/health")[0] == 200:
                break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "uvicorn.log").read_text()
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def call(url: str, body: bytes | None = None, content_type: str = "application/json") -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type} if body else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return exc.code, json.loads(body)
        except ValueError:  # a 500's plain text
            return exc.code, body.decode(errors="replace")


def post(api: str, payload: Any) -> tuple[int, Any]:
    return call(api + "/rides", json.dumps(payload).encode())


def counts(pg: psycopg.Connection[Any]) -> tuple[int, int]:
    rides = pg.execute("SELECT count(*) FROM rides").fetchone()[0]
    staged = pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0]
    return rides, staged


def test_post_ride_json_and_form_stage_the_record_in_the_rides_transaction(api: str, pg: Any) -> None:
    status, body = post(api, {"distance": 12.3456})
    assert status == 201 and body["ride"]["distance"] == 12.346
    ride = body["ride"]
    form = urllib.parse.urlencode({"distance": "7"}).encode()
    assert call(api + "/rides", form, "application/x-www-form-urlencoded")[0] == 201
    rows = pg.execute(
        "SELECT data, stream, key, action, object, record_type FROM staged_log_records ORDER BY id"
    ).fetchall()
    # a typed RideCreated record: the distance an exact decimal string, no chaos id
    data = {"id": ride["id"], "distance": "12.346", "cid": None}
    assert rows[0] == (data, STREAM, f"ride-{ride['id']}", "create", "ride", "RideCreated@1")
    assert rows[1][0]["distance"] == "7.000"
    assert pg.execute("SELECT distance FROM rides ORDER BY id").fetchall() == [(Decimal("12.346"),), (Decimal("7"),)]


@pytest.mark.parametrize(
    "payload",
    [{}, {"distance": ""}, {"distance": "far"}, {"distance": -1}, {"distance": True}, {"distance": [1]}, [1, 2]],
)
def test_bad_input_is_422_naming_the_field_and_writes_nothing(api: str, pg: Any, payload: Any) -> None:
    status, body = post(api, payload)
    assert status == 422
    assert body["error"]["field"] in ("distance", "body")
    assert counts(pg) == (0, 0)


def retried_serialization_failures(log_path: Path) -> int:
    """The API's "serialization failure; retrying" log lines (JSON, one per retried transaction)."""
    events = []
    for line in log_path.read_text().splitlines():
        try:
            events.append(json.loads(line).get("event"))
        except (ValueError, AttributeError):
            continue  # uvicorn's own lines
    return events.count("serialization failure; retrying")


# the first INJECTED staging attempts fail with a real SQLSTATE 40001 from Postgres (a non-transactional sequence
# counts the attempts): this workload's own contention (inserts only) makes no serialization failure at all
INJECTED = 8
FAIL_FIRST_ATTEMPTS = f"""
CREATE SEQUENCE staging_attempts;
CREATE FUNCTION fail_first_attempts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('staging_attempts') <= {INJECTED} THEN
        RAISE EXCEPTION 'injected conflict' USING ERRCODE = 'serialization_failure';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER fail_first_attempts AFTER INSERT ON staged_log_records
    FOR EACH ROW EXECUTE FUNCTION fail_first_attempts();
"""


def test_concurrent_posts_retry_serialization_failures_and_nothing_doubles(api: str, pg: Any, tmp_path: Path) -> None:
    """Concurrent posts, the first staging attempts failing to serialize: every post ends 201 with its ride and its
    record once, and the API's log shows each failure retried."""
    pg.execute(FAIL_FIRST_ATTEMPTS)
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda i: post(api, {"distance": i + 1}), range(64)))
    assert [status for status, _ in results] == [201] * 64
    attempts = pg.execute("SELECT last_value FROM staging_attempts").fetchone()[0]
    assert attempts >= 64 + INJECTED, "the failed attempts happened"
    assert retried_serialization_failures(tmp_path / "uvicorn.log") >= INJECTED, "each failure was retried"
    assert counts(pg) == (64, 64)
    ids = sorted(body["ride"]["id"] for _, body in results)
    staged = sorted(row[0] for row in pg.execute("SELECT (data->>'id')::bigint FROM staged_log_records"))
    assert staged == ids, "each ride's record staged once, in its own transaction"


@pytest.mark.slow
def test_demo_with_the_fastapi_api_agrees(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNILOG_", "DATABASE_URL", "REDIS_URL"))}
    argv = [sys.executable, "-m", "unilog", "demo", "--duration", "8", "--seed", "3", "--no-spark", "--api", "fastapi"]
    result = subprocess.run(
        [*argv, "--log-dir", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    verdict = result.stdout.strip().splitlines()[-1]
    assert verdict.startswith("unilog demo verdict: AGREE"), verdict
    assert "uvicorn" in (tmp_path / "api.log").read_text().lower(), "the API was served by uvicorn"
