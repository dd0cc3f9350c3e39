"""Issue 26, item B: rebuilding table mode's read index (`unilog capture table`, or a slot re-created over rows that
predate it) never stalls producers, and an invalid index left by a failed or interrupted build is dropped and built
again by the next switch.

The index is built with ``CREATE INDEX CONCURRENTLY``: its lock does not conflict with producers' inserts, so they go
on committing while it builds and while it waits for transactions older than it. A plain ``CREATE INDEX`` holds a
lock every insert waits for, for the whole build, and while it queues behind a long writer. Over this suite's
200,000-row backlog the build alone takes about 0.1 s on a small machine, too short to tell a stall from noise, so
the switch below also runs beside a bulk writer that keeps its transaction on the table open for 3 s: the build has
to wait for it, which a plain build does holding every producer behind it (the test fails so), and a concurrent one
does while producers commit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis
from cli import TESTS, one_line, unilog

from unilog import Settings, Streamer, StreamerConfig, emit
from unilog.stream.modes import capture_status, disable_wal, enable_wal

BACKLOG = 200_000
INDEX = "staged_log_records_stream_xid_id"
HOLD = 3.0  # seconds the bulk writer's transaction stays open on the table after its inserts


@pytest.fixture
def logical(settings: Settings, pg: Any) -> Settings:
    level = pg.execute("SHOW wal_level").fetchone()[0]
    if level != "logical":
        pytest.skip(f"the Postgres given by DATABASE_URL has wal_level={level}; WAL capture needs logical")
    return settings


def index_state(pg: Any) -> str | None:
    row = pg.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", (INDEX,)).fetchone()
    return None if row is None else "valid" if row[0] else "invalid"


def stage_backlog(pg: Any, n: int, start: int = 0) -> None:
    """``n`` staged records committed in one transaction (a bulk import), ``data.n`` from ``start``."""
    pg.execute(
        "INSERT INTO staged_log_records (action, object, data) "
        "SELECT 'create', 'ride', jsonb_build_object('n', g) FROM generate_series(%s, %s - 1) AS g",
        (start, start + n),
    )


def published_ns(rds: redis.Redis, stream: str) -> list[int]:
    """``data.n`` of every entry, in stream order (seqs checked dense on the way)."""
    entries = rds.xrange(stream)
    assert [int(f["seq"]) for _id, f in entries] == list(range(1, len(entries) + 1)), "dense positions"
    return [json.loads(f["data"])["n"] for _id, f in entries]


def drain(settings: Settings) -> int:
    with Streamer(settings, StreamerConfig(restart_after_crash=False)) as s:
        return s.drain(timeout=120)


class Producers(threading.Thread):
    """Single-record transactions back to back (``data.n`` from ``first``), each commit's start and duration."""

    def __init__(self, settings: Settings, first: int) -> None:
        super().__init__(name="producers", daemon=True)
        self.settings, self.first = settings, first
        self.commits: list[tuple[float, float]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.settings.conninfo) as conn:
            n = self.first
            while not self.halt.is_set():
                started = time.monotonic()
                emit(conn, action="create", object="ride", data={"n": n})
                conn.commit()
                self.commits.append((started, time.monotonic() - started))
                n += 1

    def stop(self) -> list[int]:
        self.halt.set()
        self.join(30)
        return list(range(self.first, self.first + len(self.commits)))


def bulk_writer(settings: Settings, first: int, n: int, staged: threading.Event) -> None:
    """One transaction that stages ``n`` records as rows (a bulk import in SQL), then keeps working (open on the
    table) for HOLD seconds: the concurrent index build waits for it."""
    with psycopg.connect(settings.conninfo) as conn:
        stage_backlog(conn, n, start=first)
        staged.set()
        conn.execute("SELECT pg_sleep(%s)", (HOLD,))
        conn.commit()


@pytest.fixture
def producers(logical: Settings) -> Iterator[Producers]:
    thread = Producers(logical, first=1_000_000)
    yield thread
    thread.halt.set()
    thread.join(30)


@pytest.mark.slow(light=True)  # over 8 s: the default run stays near 12 minutes; .ci/run runs it
def test_producers_keep_committing_while_capture_table_rebuilds_the_index(
    logical: Settings, pg: Any, rds: redis.Redis, producers: Producers
) -> None:
    enable_wal(logical)
    assert index_state(pg) is None, "WAL mode, nothing staged before the slot: no read index"
    stage_backlog(pg, BACKLOG)  # staged in WAL mode with no streamer running
    producers.start()
    deadline = time.monotonic() + 10
    while len(producers.commits) < 20:
        assert time.monotonic() < deadline, "the producers do not commit"
        time.sleep(0.01)
    staged = threading.Event()
    bulk = threading.Thread(target=bulk_writer, args=(logical, 500_000, 100, staged), daemon=True)
    bulk.start()
    assert staged.wait(30)
    started = time.monotonic()
    disable_wal(logical)  # settles, builds the index concurrently (waiting for the bulk writer), trigger on
    switch = time.monotonic() - started
    time.sleep(0.3)
    ns = producers.stop()
    bulk.join(30)
    during = [seconds for at, seconds in producers.commits if started <= at <= started + switch]
    longest = max(seconds for _at, seconds in producers.commits)
    assert switch > HOLD / 2, f"the switch took {switch:.2f} s: the build did not wait for the bulk writer"
    assert len(during) >= 20, f"{len(during)} commits in the {switch:.2f} s of the switch: producers were held"
    assert longest < min(1.0, switch / 3), f"a producer's commit took {longest:.2f} s during a {switch:.2f} s switch"
    status = capture_status(logical)
    assert status["mode"] == "table" and status["read_index"] and status["read_index_valid"]
    drain(logical)  # the switch published what the slot held (the backlog, messages); the rest now
    expected = [*range(BACKLOG), *range(500_000, 500_100), *ns]
    assert sorted(published_ns(rds, logical.stream)) == sorted(expected), "every record once"
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0] == 0


def test_a_cancelled_build_leaves_wal_mode_whole_and_the_next_switch_rebuilds_it(
    logical: Settings, pg: Any, rds: redis.Redis
) -> None:
    enable_wal(logical)
    stage_backlog(pg, 1000)
    writer = psycopg.connect(logical.conninfo)  # idle in transaction on the table: the build waits for it
    stage_backlog(writer, 1, start=1000)
    env = {"DATABASE_URL": logical.database_url, "REDIS_URL": logical.redis_url, "UNILOG_STREAM": logical.stream}
    switch = subprocess.Popen(
        [sys.executable, "-m", "unilog", "capture", "table"],
        cwd=TESTS,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    waiting = "SELECT pid FROM pg_stat_progress_create_index WHERE phase = 'waiting for writers before build'"
    while not (row := pg.execute(waiting).fetchone()):
        assert time.monotonic() < deadline and switch.poll() is None, "the concurrent build never waited for the writer"
        time.sleep(0.02)
    assert index_state(pg) == "invalid", "a concurrent build's index is invalid until it is done"
    pg.execute("SELECT pg_cancel_backend(%s)", (row[0],))  # an operator cancels it (or a statement timeout hits)
    _out, err = switch.communicate(timeout=30)
    assert switch.returncode == 3, err
    assert "cancelled" in one_line(subprocess.CompletedProcess(switch.args, 3, "", err))
    status = capture_status(logical)
    assert status["mode"] == "wal" and status["slot_state"] is not None, "WAL mode whole, its slot kept"
    assert status["read_index"] and not status["read_index_valid"], "the cancelled build's invalid index is left"
    assert "INVALID" in unilog(logical, "capture", "status").stdout
    writer.commit()
    assert unilog(logical, "capture", "table").returncode == 0
    assert index_state(pg) == "valid", "dropped and built again"
    assert capture_status(logical)["mode"] == "table"
    drain(logical)  # the switch published through the slot what it held; table mode the rest
    assert sorted(published_ns(rds, logical.stream)) == list(range(1001))
    writer.close()


def test_an_invalid_index_is_dropped_or_rebuilt_by_capture_wal(logical: Settings, pg: Any, rds: redis.Redis) -> None:
    if not pg.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]:
        pytest.skip("marking an index invalid needs a superuser")

    def invalidate() -> None:  # what a concurrent build or drop that failed leaves: the index, not valid
        pg.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass(%s)", (INDEX,))
        assert index_state(pg) == "invalid"

    stage_backlog(pg, 3)  # table mode: staged before the slot
    invalidate()
    enable_wal(logical)
    assert index_state(pg) == "valid", "rows predate the slot: table-mode passes need it, so it is built again"
    assert drain(logical) == 3
    enable_wal(logical)
    assert index_state(pg) is None, "nothing predates the slot: dropped"
    pg.execute(f"CREATE INDEX {INDEX} ON staged_log_records (stream, xid, id)")
    invalidate()
    enable_wal(logical)
    assert index_state(pg) is None, "an invalid index is dropped in WAL mode too (producers may still update it)"
    stage_backlog(pg, 2, start=3)
    disable_wal(logical)  # publishes what the slot holds first (the two rows)
    assert index_state(pg) == "valid"
    stage_backlog(pg, 1, start=5)
    assert drain(logical) == 1
    assert published_ns(rds, logical.stream) == [0, 1, 2, 3, 4, 5]
