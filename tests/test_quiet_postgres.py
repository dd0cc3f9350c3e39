"""unilog is quiet on Postgres (issue 34, item 7): no ERROR line in the server's log from unilog's sessions, and no
session idle in transaction longer than a batch takes, so a DBA's ``idle_in_transaction_session_timeout`` never
kills one.

A standby streamer retried the wake-up lock with ``lock_timeout`` about 10 times a second while the active one slept
on it; each try left ``canceling statement due to lock timeout`` in the server log (871 in a compose run, endlessly
on an idle system). The fleet here runs on a Postgres of its own, started with
``idle_in_transaction_session_timeout`` and a log line prefix naming each session's application, and is judged by
that log: nothing lost, nothing applied twice, and no ERROR or FATAL line from a ``unilog-`` session (and, as a
positive control, an error provoked in a unilog session afterwards is found by the same check).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from unilog import (
    Consumer,
    ConsumerConfig,
    GroupConfig,
    GroupConsumer,
    Record,
    Settings,
    Streamer,
    StreamerConfig,
    emit,
)
from unilog.harness.embedded import EmbeddedPostgres
from unilog.ops.schema import migrate
from unilog.stream.modes import enable_wal

LOG_SETTINGS = {
    "log_min_messages": "warning",
    "log_min_error_statement": "error",
    "log_line_prefix": "%m [%p] app=%a ",
}
APPLIED = """
CREATE TABLE applied (consumer text NOT NULL, key text NOT NULL, PRIMARY KEY (consumer, key));
"""


def timeout_for(request: pytest.FixtureRequest) -> int:
    return 5 if request.node.get_closest_marker("slow") else 2


@contextlib.contextmanager
def quiet_server(
    settings: Settings, where: Path, mode: str, timeout: int
) -> Iterator[tuple[EmbeddedPostgres, Settings]]:
    """A Postgres of its own (its log is read), migrated, in ``mode``, with the suite's Redis and a stream named for
    the mode, so two of them can run side by side."""
    config = {**LOG_SETTINGS, "idle_in_transaction_session_timeout": f"{timeout}s"}
    with EmbeddedPostgres(where, settings=config) as server:
        migrate(server.url)
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute(APPLIED)
        app = settings.with_(database_url=server.url, stream=f"quiet-{mode}")
        if mode == "wal":
            enable_wal(app)
        yield server, app


@pytest.fixture(params=["table", "wal"])
def quiet_pg(
    request: pytest.FixtureRequest, settings: Settings, tmp_path: Path
) -> Iterator[tuple[EmbeddedPostgres, Settings]]:
    """``quiet_server`` in either capture mode, with the default run's 2 s ``idle_in_transaction_session_timeout``."""
    with quiet_server(settings, tmp_path / "pg", request.param, timeout_for(request)) as pair:
        yield pair


def applier(consumer: str) -> Any:
    def handle(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
        for r in records:  # a second apply of one record fails the primary key: applied twice is caught here
            conn.execute("INSERT INTO applied VALUES (%s, %s)", (consumer, r.key))

    return handle


def unilog_errors(log_path: Path) -> list[str]:
    """The server log's ERROR/FATAL/PANIC lines (with their statement) from sessions unilog named ``unilog-...``."""
    lines = log_path.read_text(errors="replace").splitlines()
    return [line for line in lines if re.search(r"app=unilog-\S* (ERROR|FATAL|PANIC):", line)]


def assert_no_unilog_error_and_the_check_sees_one(server: EmbeddedPostgres, app: Settings) -> None:
    """No unilog error in the log; then the positive control: a statement failing in a session unilog opened and
    named (a streamer's, ``unilog-control``) is found by the same check in the same log, so a change of unilog's
    session names or of the log's line prefix cannot make the check pass by seeing nothing."""
    assert unilog_errors(server.log_path) == []
    streamer = Streamer(app, StreamerConfig(restart_after_crash=False), name="control")
    try:
        with pytest.raises(psycopg.errors.DivisionByZero):
            streamer.links.pg().execute("SELECT 1/0")
    finally:
        streamer.close()
    deadline = time.monotonic() + 10
    while not (found := unilog_errors(server.log_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(found) == 1 and "app=unilog-control ERROR:" in found[0] and "division by zero" in found[0], found


def run_fleet(app: Settings, seconds: float, records: int, idle_timeout: int) -> None:
    """Two streamers (one a standby), a checkpoint consumer and two group workers, for ``seconds``, with a
    producer that emits ``records`` in bursts, each after an idle gap longer than the idle-in-transaction timeout."""
    stop = threading.Event()
    workers: list[Any] = [
        Streamer(app, StreamerConfig(restart_after_crash=False), name="streamer-a"),
        Streamer(app, StreamerConfig(restart_after_crash=False), name="streamer-b"),
        Consumer(app, ConsumerConfig(name="mirror", restart_after_crash=False), applier("mirror")),
        *(
            GroupConsumer(app, GroupConfig(group="g", worker=f"w{i}", restart_after_crash=False), applier("g"))
            for i in range(2)
        ),
    ]
    threads = [threading.Thread(target=w.run, args=(stop,), daemon=True) for w in workers]
    for t in threads:
        t.start()
    try:
        bursts = max(1, int(seconds // (idle_timeout + 2)))
        per_burst = records // bursts
        deadline = time.monotonic() + seconds
        with psycopg.connect(app.conninfo) as conn:
            for b in range(bursts):
                # idle first: a streamer that starts on an empty table has seen no stream held by another one
                stop.wait(max(0.0, min(idle_timeout + 2, deadline - time.monotonic())))
                for i in range(per_burst):
                    emit(conn, action="create", object="thing", data={"n": i}, key=f"{b}-{i}")
                    if i % 10 == 9:
                        conn.commit()
                conn.commit()
        _wait_applied(app, bursts * per_burst)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        for w in workers:
            w.close()


def _wait_applied(app: Settings, total: int) -> None:
    deadline = time.monotonic() + 60
    with psycopg.connect(app.conninfo, autocommit=True) as conn:
        while time.monotonic() < deadline:
            counts = dict(conn.execute("SELECT consumer, count(*) FROM applied GROUP BY consumer").fetchall())
            if counts.get("mirror") == total and counts.get("g") == total:
                return
            time.sleep(0.2)
    pytest.fail(f"not everything was applied once within 60 s: {counts}, expected {total} each")


def long_idle_transactions(app: Settings) -> list[tuple[str, float]]:
    with psycopg.connect(app.conninfo, autocommit=True) as conn:
        return conn.execute(
            "SELECT application_name || ': ' || left(query, 300), extract(epoch FROM now() - state_change)::float8 "
            "FROM pg_stat_activity "
            "WHERE state LIKE 'idle in transaction%' AND application_name LIKE 'unilog-%' "
            "AND now() - state_change > interval '0.5 seconds'"
        ).fetchall()


def test_an_idle_fleet_with_a_standby_streamer_leaves_no_error_in_the_server_log(
    quiet_pg: tuple[EmbeddedPostgres, Settings], request: pytest.FixtureRequest
) -> None:
    server, app = quiet_pg
    sampled: list[tuple[str, float]] = []
    sampler_stop = threading.Event()

    def sample() -> None:
        while not sampler_stop.wait(0.2):
            sampled.extend(long_idle_transactions(app))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        run_fleet(app, seconds=2 * (timeout_for(request) + 2), records=200, idle_timeout=timeout_for(request))
    finally:
        sampler_stop.set()
        sampler.join(10)
    assert sampled == [], "a unilog session sat idle in transaction for over half a second"
    assert_no_unilog_error_and_the_check_sees_one(server, app)


@pytest.mark.slow(seconds=300, light=True)
def test_a_five_minute_fleet_run_in_each_mode_leaves_no_error_in_the_server_log(
    settings: Settings, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Issue 34's five minutes in table mode and in WAL mode at once, each fleet on a Postgres of its own (the fleets
    run at ten records a second: side by side they take five minutes of one test worker, not ten)."""
    seconds = float(os.environ.get("UNILOG_QUIET_SECONDS") or 300)
    timeout = timeout_for(request)
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(quiet_server(settings, tmp_path / m, m, timeout)) for m in ("table", "wal")]
        with concurrent.futures.ThreadPoolExecutor(len(servers)) as pool:
            runs = [pool.submit(run_fleet, app, seconds, 3000, timeout) for _, app in servers]
            for run in runs:
                run.result()  # a fleet's failure (pytest.fail, an exception) is raised here
        for server, app in servers:
            assert_no_unilog_error_and_the_check_sees_one(server, app)
