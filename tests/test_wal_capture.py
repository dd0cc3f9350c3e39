"""WAL capture (issue 18): the streamer reads committed inserts from a logical slot in commit order.

These tests stage records as ROWS of ``staged_log_records`` in WAL mode, as producers outside unilog's emit do (SQL,
triggers, the reference's Ruby API): :func:`stage` inserts them. ``emit`` in WAL mode writes logical messages
instead; tests/test_wal_messages.py runs the same crash windows for those.

Every test runs on the suite's real Postgres (started with wal_level=logical) and Redis; a test that needs its own
server (restart, WAL removal) starts one. Skipped, saying why, on a server given by URL without wal_level=logical.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis
from cli import one_line, unilog

from unilog import Settings, Streamer, StreamerConfig
from unilog.errors import ConfigurationError, InjectedCrash
from unilog.faults import Faults
from unilog.harness.proxy import FaultProxy
from unilog.stream.modes import WalCapture, capture_status, disable_wal, enable_wal

STREAM = "test-stream"


def stage(conn: Any, n: int, key: str | None = None) -> None:
    """A record staged as a row, as a producer outside unilog's emit (SQL, triggers) does in any capture mode."""
    conn.execute(
        "INSERT INTO staged_log_records (action, object, data, key) VALUES ('create', 'ride', jsonb_build_object('n', %s::int), %s)",
        (n, key),
    )


def emit_n(settings: Settings, n: int, start: int = 0, key: str | None = None) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(start, start + n):
            stage(conn, i, key)


def published(rds: redis.Redis, stream: str = STREAM) -> list[tuple[int, int]]:
    """(seq, n) of every entry, in stream order."""
    return [(int(f["seq"]), json.loads(f["data"])["n"]) for _id, f in rds.xrange(stream)]


def staged(pg: Any) -> int:
    return int(pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0])


def streamer(settings: Settings, faults: Faults | None = None, name: str = "streamer", **config: Any) -> Streamer:
    config = StreamerConfig(restart_after_crash=False, **config)
    return Streamer(settings, config, faults=faults or Faults(), name=name)


def test_commit_order_with_no_wait_behind_an_open_transaction(wal: Settings, pg: Any, rds: redis.Redis) -> None:
    early = psycopg.connect(wal.conninfo)  # begins first, commits last
    stage(early, 100)
    idle = psycopg.connect(wal.conninfo)  # an idle-in-transaction session holding an xid, as in the table-mode stall
    idle.execute("SELECT pg_current_xact_id()")
    emit_n(wal, 3)
    with streamer(wal) as s:
        started = time.monotonic()
        assert s.drain(timeout=10) == 3, "the three committed records, while two older transactions stay open"
        assert time.monotonic() - started < 5
        assert published(rds) == [(1, 0), (2, 1), (3, 2)]
        early.commit()
        assert s.drain(timeout=10) == 1
    assert published(rds) == [(1, 0), (2, 1), (3, 2), (4, 100)], "published in commit order, positions dense"
    assert staged(pg) == 0, "published rows are deleted"
    idle.close()
    early.close()


def test_a_crash_after_the_append_resends_the_same_positions(wal: Settings, pg: Any, rds: redis.Redis) -> None:
    emit_n(wal, 5)
    with streamer(wal, Faults.scripted(streamer__crash_after_publish=[True])) as s, pytest.raises(InjectedCrash):
        s.drain(timeout=10)
    assert published(rds) == [(i + 1, i) for i in range(5)], "appended before the crash"
    assert staged(pg) == 5, "nothing deleted: the crash came before the delete committed"
    emit_n(wal, 2, start=5)
    with streamer(wal) as s:
        assert s.drain(timeout=10) == 7, "the five are read from the slot again, re-sent with the same positions"
    assert published(rds) == [(i + 1, i) for i in range(7)], "the broker dropped the re-sent ones: no duplicate"
    assert staged(pg) == 0


def test_a_crash_before_the_slot_confirmation_skips_what_was_deleted(wal: Settings, pg: Any, rds: redis.Redis) -> None:
    emit_n(wal, 4)
    with streamer(wal, Faults.scripted(streamer__crash_before_confirm=[True])) as s, pytest.raises(InjectedCrash):
        s.drain(timeout=10)
    assert staged(pg) == 0, "deleted and positions committed; the slot was not told"
    emit_n(wal, 1, start=4)
    with streamer(wal) as s:
        assert s.drain(timeout=10) == 1, "the four come from the slot again, but their rows are gone: skipped"
    assert published(rds) == [(i + 1, i) for i in range(5)]


def test_a_large_transaction_is_split_across_batches_and_confirmed_once_whole(
    wal: Settings, pg: Any, rds: redis.Redis
) -> None:
    with psycopg.connect(wal.conninfo) as conn:  # one transaction of 25 records
        for i in range(25):
            stage(conn, i)
    faults = Faults.scripted(streamer__crash_before_confirm=[False, True])
    with streamer(wal, faults, batch_size=10) as s, pytest.raises(InjectedCrash):
        s.drain(timeout=10)  # two batches of 10 deleted; the slot never confirmed (the transaction is unfinished)
    assert staged(pg) == 5
    with streamer(wal, batch_size=10) as s:
        assert s.drain(timeout=10) == 5, "the transaction again from the slot; its first 20 rows are gone: skipped"
    assert published(rds) == [(i + 1, i) for i in range(25)]


@pytest.mark.slow(light=True)  # over 8 s: the default run stays near 12 minutes; .ci/run runs it
def test_a_large_transaction_is_never_held_whole(wal: Settings, pg: Any, rds: redis.Redis) -> None:
    """Issue 26: the WAL pass decodes, publishes and deletes a large transaction a batch at a time as it arrives;
    before, the decoder held all of it until its commit message (200,000 rows here, about 90 MB)."""
    size, batch = 200_000, 2000
    pg.execute(
        "INSERT INTO staged_log_records (action, object, data) "
        "SELECT 'create', 'ride', jsonb_build_object('n', g) FROM generate_series(0, %s - 1) AS g",
        (size,),
    )
    with streamer(wal, batch_size=batch) as s:
        assert s.drain(timeout=120) == size
        capture = s.capture
        assert isinstance(capture, WalCapture)
        assert 0 < capture.held_peak <= 2 * batch, "decoded rows held at once: at most two batches"
        assert capture.held_rows == 0
    assert staged(pg) == 0
    assert rds.xlen(STREAM) == size
    last = rds.xrevrange(STREAM, count=1)[0][1]
    assert (int(last["seq"]), json.loads(last["data"])["n"]) == (size, size - 1), "in order, positions dense"


def until_published(s: Streamer) -> int:
    """Passes until one publishes (what a commit sends reaches the slot's stream within milliseconds)."""
    deadline = time.monotonic() + 10
    while (result := s.run_once()).published == 0:
        assert time.monotonic() < deadline, result
        time.sleep(0.02)
    return result.published


def test_a_connection_cut_while_waiting_on_the_slot_is_reconnected(wal: Settings, pg: Any, rds: redis.Redis) -> None:
    """Found by the soak (``python -m bench --only soak``, WAL mode with connection cuts): Postgres lost while the
    streamer waited on its slot between passes ended the process with a traceback; it must reconnect and go on.

    The streamer runs as its own process: libpq's blocking calls hold the GIL, so a proxy in the same process would
    stall with it."""
    port = int(wal.database_url.rsplit(":", 1)[1].split("/")[0])
    with FaultProxy("127.0.0.1", port) as proxy:
        argv = [sys.executable, "-m", "unilog", "streamer", "--name", "cut-while-waiting", "--poll-interval", "30"]
        connection = ["--database-url", proxy.url_for(wal.database_url), "--redis-url", wal.redis_url]
        proc = subprocess.Popen([*argv, *connection, "--default-stream", STREAM], stderr=subprocess.PIPE, text=True)
        try:
            emit_n(wal, 1)
            assert until(lambda: rds.xlen(STREAM) == 1, timeout=30), "the first record was not published"
            time.sleep(1.0)  # published and confirmed: waiting on the slot (up to --poll-interval) for a commit
            proxy.cut()
            time.sleep(1.0)
            emit_n(wal, 1, start=1)
            assert until(lambda: rds.xlen(STREAM) == 2 or proc.poll() is not None, timeout=30)
            assert proc.poll() is None, f"the streamer exited with {proc.returncode}: {proc.communicate()[1][-800:]}"
        finally:
            proc.terminate()
            proc.wait(30)
    assert published(rds) == [(1, 0), (2, 1)]


def until(check: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_two_streamers_one_slot_owner(wal: Settings, pg: Any, rds: redis.Redis) -> None:
    emit_n(wal, 3)
    first, second = streamer(wal, name="first"), streamer(wal, name="second")
    try:
        assert until_published(first) == 3
        blocked = second.run_once()
        assert blocked.blocked and not blocked.published, "the slot streams to one session at a time"
        emit_n(wal, 2, start=3)
        first.close()  # its session ends: the other takes the slot over
        assert until_published(second) == 2
    finally:
        first.close()
        second.close()
    assert published(rds) == [(i + 1, i) for i in range(5)]


def test_the_streamer_that_published_the_rows_before_the_slot_lets_go_of_their_streams_when_another_streams_it(
    wal: Settings, pg: Any, rds: redis.Redis
) -> None:
    """The chaos run with Postgres failovers (WAL mode) stalled with 71 rows staged for good: after a slot was
    re-created, one streamer published the rows staged before it (a table-mode pass, which takes the stream's
    bucket), the other then opened the new slot first. The first, refused the slot, kept the bucket and the one
    streaming could publish nothing of it, ever. A streamer refused the slot now lets go of its streams."""
    from unilog import store

    emit_n(wal, 3)
    with psycopg.connect(wal.conninfo) as conn:
        slot = store.capture_slot(conn)
    assert slot is not None
    store.recreate_slot(wal.conninfo, slot)  # the 3 rows now predate the slot: a table-mode pass publishes them
    first, second = streamer(wal, name="first"), streamer(wal, name="second")
    try:
        assert until_published(second) == 3, "the rows before the slot, by a table-mode pass (second holds the bucket)"
        assert first.run_once().published == 0  # nothing predates the slot now: first opens it
        emit_n(wal, 2, start=3)
        refused = second.run_once()
        assert refused.blocked and not refused.published, "the slot streams to first"
        deadline = time.monotonic() + 10
        while (result := first.run_once()).published == 0:
            assert time.monotonic() < deadline, f"first, streaming the slot, published nothing: {result}"
            time.sleep(0.02)
    finally:
        first.close()
        second.close()
    assert published(rds) == [(i + 1, i) for i in range(5)]
    assert staged(pg) == 0


def test_a_streamer_killed_between_a_lost_slots_replacement_and_its_from_xid_loses_nothing(
    wal: Settings, pg: Any, rds: redis.Redis
) -> None:
    """The chaos run with Postgres failovers (WAL mode) ended twice with rows staged for good (71, 107): a streamer
    replacing a lost slot was killed after the new slot existed and before its from_xid was recorded. The next
    streamer read the new slot under the old from_xid: the rows staged while no slot was there were above it (no
    table-mode pass for them) and before the new slot (not in its stream). Now the capture says RECREATING until the
    from_xid is recorded, and a streamer that finds it so replaces the slot again."""
    emit_n(wal, 2)
    with streamer(wal) as s:
        s.drain(timeout=10)
    slot = capture_status(wal)["slot"]
    pg.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    emit_n(wal, 3, start=2)  # staged while the slot is gone
    crashing = streamer(wal, Faults.scripted(streamer__crash_recreating_slot=[True]))
    with crashing, pytest.raises(InjectedCrash):
        crashing.drain(timeout=30)
    assert pg.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone() == (1,)
    emit_n(wal, 2, start=5)  # staged after the new slot
    with streamer(wal) as s:
        assert s.drain(timeout=30) == 5
    assert published(rds) == [(i + 1, i) for i in range(7)], "each once, in commit order"
    assert staged(pg) == 0


def test_a_row_before_the_slot_naming_an_invalid_stream_does_not_stop_the_log(
    wal: Settings, pg: Any, rds: redis.Redis
) -> None:
    """A row staged by raw SQL under ``'a b'`` (not a stream name) before the slot stays staged, named in one line,
    as in table mode; the rows staged before the slot go out by a table-mode pass and the slot is streamed after
    them. Waiting for the invalid one to go (it never does) stopped the log: nothing after it was published."""
    from unilog import store

    emit_n(wal, 2)
    pg.execute("INSERT INTO staged_log_records (action, object, data, stream) VALUES ('a', 'o', '{}', 'a b')")
    with psycopg.connect(wal.conninfo) as conn:
        slot = store.capture_slot(conn)
    assert slot is not None
    store.recreate_slot(wal.conninfo, slot)
    emit_n(wal, 2, start=2)
    with streamer(wal) as s:
        s.drain(timeout=20)
    assert published(rds) == [(i + 1, i) for i in range(4)], "before the slot, then from it"
    assert pg.execute("SELECT stream FROM staged_log_records").fetchall() == [("a b",)]


def test_a_dropped_slot_with_only_rows_waiting_costs_nothing_and_the_streamer_recreates_it(
    wal: Settings, pg: Any, rds: redis.Redis
) -> None:
    """Issue 44: a lost slot never stops the log. With only rows waiting (the WAL holds no logical message after the
    slot's last known position), the streamer records a loss that cost nothing, re-creates the slot itself and
    publishes the rows, in-process and through the command."""
    emit_n(wal, 2)
    with streamer(wal) as s:
        s.drain(timeout=10)
    emit_n(wal, 3, start=2)
    slot = capture_status(wal)["slot"]
    pg.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    with streamer(wal) as s:
        assert s.drain(timeout=30) == 3, "the rows, once each, through the re-created slot's table-mode pass"
        assert [loss.complete for loss in s.losses] == [True], s.losses
    assert staged(pg) == 0
    emit_n(wal, 2, start=5)
    result = unilog(wal, "streamer", "--once")
    assert result.returncode == 0, result.stderr
    assert published(rds) == [(i + 1, i) for i in range(7)], "published once each after the new slot"
    assert capture_status(wal)["slot_state"] is not None, "the slot is back"


def test_switching_modes_back_and_forth_loses_and_repeats_nothing(
    settings: Settings, pg: Any, rds: redis.Redis
) -> None:
    level = pg.execute("SHOW wal_level").fetchone()[0]
    if level != "logical":
        pytest.skip(f"wal_level={level}")
    emit_n(settings, 3)  # table mode
    with streamer(settings) as s:
        assert s.run_once().published == 3, "table mode"
        result = unilog(settings, "capture", "wal")
        assert result.returncode == 3 and "stop them" in one_line(result), "refused while a streamer runs"
    with streamer(settings, Faults.scripted(streamer__crash_after_publish=[True])) as s:
        emit_n(settings, 1, start=3)
        with pytest.raises(InjectedCrash):
            s.run_once()  # a table-mode batch in flight: in Redis, still staged
    open_tx = psycopg.connect(settings.conninfo)  # spans the switch: it commits while the slot is being created
    stage(open_tx, 99)
    # creating the slot waits for open transactions: this one commits meanwhile, before the slot's consistent
    # point, so its record is not in the WAL and the table-mode pass before WAL reading must publish it
    threading.Timer(0.5, open_tx.commit).start()
    enable_wal(settings)  # settles the batch in flight in table mode first
    emit_n(settings, 2, start=4)
    with streamer(settings) as s:
        assert s.drain(timeout=10) == 3
    disable_wal(settings)
    emit_n(settings, 2, start=6)
    with streamer(settings) as s:
        assert s.drain(timeout=10) == 2
    assert [n for _seq, n in published(rds)] == [0, 1, 2, 3, 99, 4, 5, 6, 7], "each record once across both switches"
    assert [seq for seq, _n in published(rds)] == list(range(1, 10)), "one dense sequence"
    assert staged(pg) == 0
    open_tx.close()


def read_index(pg: Any) -> bool:
    return bool(pg.execute("SELECT to_regclass('staged_log_records_stream_xid_id') IS NOT NULL").fetchone()[0])


def test_wal_mode_drops_the_table_mode_index_once_nothing_predates_the_slot(
    settings: Settings, pg: Any, rds: redis.Redis
) -> None:
    if pg.execute("SHOW wal_level").fetchone()[0] != "logical":
        pytest.skip("wal_level is not logical")
    emit_n(settings, 2)  # staged before the slot: a table-mode pass publishes them, reading by the index
    enable_wal(settings)
    assert read_index(pg) and capture_status(settings)["read_index"], "kept while rows predate the slot"
    with streamer(settings) as s:
        assert s.drain(timeout=10) == 2
    enable_wal(settings)  # again, once they are published
    assert not read_index(pg), "producers in WAL mode update only the primary key"
    emit_n(settings, 2, start=2)
    with streamer(settings) as s:
        assert s.drain(timeout=10) == 2
    emit_n(settings, 2, start=4)  # staged, then the slot is lost and re-created (as after an outage): they predate it
    pg.execute("SELECT pg_drop_replication_slot(%s)", (capture_status(settings)["slot"],))
    enable_wal(settings, recreate=True)
    assert read_index(pg), "rebuilt: a table-mode pass publishes what predates the new slot"
    with streamer(settings) as s:
        assert s.drain(timeout=10) == 2
    disable_wal(settings)
    assert read_index(pg), "kept for table mode"
    enable_wal(settings)
    disable_wal(settings)
    assert read_index(pg), "rebuilt for table mode"
    emit_n(settings, 1, start=6)
    with streamer(settings) as s:
        assert s.drain(timeout=10) == 1
    assert [n for _seq, n in published(rds)] == list(range(7))


def test_a_switch_behind_a_long_transaction_gives_up_on_its_lock_in_one_line(
    settings: Settings, pg: Any, rds: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    if pg.execute("SHOW wal_level").fetchone()[0] != "logical":
        pytest.skip("wal_level is not logical")
    monkeypatch.setattr("unilog.store.wal.DDL_LOCK_TIMEOUT", 0.3)
    reader = psycopg.connect(settings.conninfo)  # idle in transaction after reading the table: it holds a lock
    reader.execute("SELECT count(*) FROM staged_log_records").fetchone()
    enable_wal(settings)  # on, but the index cannot be dropped under that lock: kept, not an error
    assert capture_status(settings)["mode"] == "wal" and read_index(pg)
    assert not capture_status(settings)["read_index_valid"], "the concurrent drop's first step: marked invalid"
    reader.rollback()
    enable_wal(settings)
    assert not read_index(pg)
    writer = psycopg.connect(settings.conninfo)  # idle in transaction after staging: rebuilding the index waits on it
    stage(writer, 0)
    started = time.monotonic()
    result = unilog(settings, "capture", "table")
    assert result.returncode == 3 and "could not lock staged_log_records" in one_line(result)
    assert time.monotonic() - started < 30, "gave up instead of waiting for the writer without end"
    status = capture_status(settings)
    assert status["mode"] == "wal", "the mode did not change"
    # the build is concurrent: it gave up waiting for the writer after entering its index in the catalog, so the
    # index is there, invalid (producers never waited for it); the next switch drops it and builds it again
    assert status["read_index"] and not status["read_index_valid"]
    writer.commit()
    assert unilog(settings, "capture", "table").returncode == 0
    assert capture_status(settings)["read_index_valid"]
    with streamer(settings) as s:
        s.drain(timeout=10)
    assert [n for _seq, n in published(rds)] == [0] and staged(pg) == 0
    reader.close()
    writer.close()


def test_a_switch_back_that_gives_up_halfway_leaves_wal_mode_whole(
    settings: Settings, pg: Any, rds: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    if pg.execute("SHOW wal_level").fetchone()[0] != "logical":
        pytest.skip("wal_level is not logical")
    monkeypatch.setattr("unilog.store.wal.DDL_LOCK_TIMEOUT", 0.3)
    enable_wal(settings)
    holder = psycopg.connect(settings.conninfo)  # SHARE: neither the concurrent index build nor the trigger may run
    holder.execute("LOCK TABLE staged_log_records IN SHARE MODE")
    with pytest.raises(ConfigurationError, match="could not lock staged_log_records"):
        disable_wal(settings)  # gives up at its first step, the index
    status = capture_status(settings)
    assert status["mode"] == "wal" and status["slot_state"] is not None, "still WAL mode, its slot kept"
    assert not status["read_index"], "refused its lock before entering the index in the catalog"
    holder.rollback()
    # halfway: the index is already built (no lock needed for it), re-enabling the trigger gives up. (With a plain
    # CREATE INDEX, whose SHARE lock a SHARE holder does not block, the lock above stopped the switch here; the
    # concurrent build's lock conflicts with SHARE, so the index is built first to reach this step.)
    pg.execute("CREATE INDEX staged_log_records_stream_xid_id ON staged_log_records (stream, xid, id)")
    holder.execute("LOCK TABLE staged_log_records IN SHARE MODE")
    with pytest.raises(ConfigurationError, match="could not lock staged_log_records"):
        disable_wal(settings)
    status = capture_status(settings)
    assert status["mode"] == "wal" and status["slot_state"] is not None, "still WAL mode, its slot kept"
    assert status["read_index_valid"]
    holder.rollback()
    disable_wal(settings)
    status = capture_status(settings)
    assert status["mode"] == "table" and status["read_index"]
    assert (
        pg.execute("SELECT count(*) FROM pg_replication_slots WHERE database = current_database()").fetchone()[0] == 0
    )
    holder.close()


def test_capture_wal_needs_wal_level_logical_in_one_line(settings: Settings, pg: Any) -> None:
    if pg.execute("SHOW wal_level").fetchone()[0] == "logical":
        from unilog.harness.embedded import EmbeddedPostgres

        server = EmbeddedPostgres(settings={"wal_level": "replica"}).start()
        try:
            admin = psycopg.connect(server.url, autocommit=True)
            admin.execute("CREATE DATABASE t")
            admin.close()
            target = server.url_for("t")
            assert unilog(settings, "migrate", database_url=target).returncode == 0
            result = unilog(settings, "capture", "wal", database_url=target)
        finally:
            server.stop(mode="immediate", cleanup=True)
    else:
        result = unilog(settings, "capture", "wal")
    assert result.returncode == 3
    assert "needs wal_level = logical" in one_line(result)


# -- on a server of its own: restarts and removed WAL ------------------------------------------------------------------


@pytest.fixture(scope="module")
def own_server() -> Iterator[Any]:
    from unilog.harness.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(settings={"max_slot_wal_keep_size": "32MB"}).start()
    try:
        yield server
    finally:
        server.stop(mode="immediate", cleanup=True)


@pytest.fixture
def own(own_server: Any, settings: Settings, request: pytest.FixtureRequest) -> Iterator[Settings]:
    """A migrated database in WAL mode on the module's own server, with the suite's Redis."""
    from unilog.ops.schema import migrate

    name = f"own_{request.node.name[:40]}"
    with psycopg.connect(own_server.url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = own_server.url_for(name)
    migrate(url)
    own = Settings.from_dsn(url, settings.redis_url, settings.stream)
    enable_wal(own)
    yield own


def test_server_restarts_and_streamer_kills_publish_each_record_once(
    own: Settings, own_server: Any, rds: redis.Redis
) -> None:
    import signal
    import subprocess
    import sys

    from cli import TESTS

    env = {"DATABASE_URL": own.database_url, "REDIS_URL": own.redis_url, "UNILOG_STREAM": STREAM}
    argv = [sys.executable, "-m", "unilog", "streamer", "--batch-size", "7"]
    import os

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(argv, cwd=TESTS, env={**os.environ, **env}, stdout=subprocess.DEVNULL, text=True)

    proc = start()
    try:
        for round_ in range(4):
            emit_n(own, 50, start=round_ * 50)
            time.sleep(0.3)  # mid-stream
            if round_ % 2 == 0:
                own_server.restart("immediate")  # the streamer's replication stream and session break
            else:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
                proc = start()
        emit_n(own, 10, start=200)  # published by the last streamer started: it is up when SIGTERM comes
        deadline = time.monotonic() + 60
        while rds.xlen(STREAM) < 210 or count_staged(own):
            assert time.monotonic() < deadline, (rds.xlen(STREAM), count_staged(own))
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(30)
    seen = published(rds)
    assert sorted(n for _s, n in seen) == list(range(210)), "every record once"
    assert [s for s, _n in seen] == list(range(1, 211)), "dense positions"
    assert proc.returncode == 0, "SIGTERM: the streamer finished its batch and exited cleanly"


def count_staged(settings: Settings) -> int:
    with psycopg.connect(settings.conninfo, autocommit=True) as conn:
        return staged(conn)


def test_a_slot_whose_wal_was_removed_is_detected_and_recreated(own: Settings, rds: redis.Redis) -> None:
    emit_n(own, 3)
    assert unilog(own, "streamer", "--once").returncode == 0
    emit_n(own, 4, start=3)  # staged, then the slot falls behind past max_slot_wal_keep_size
    with psycopg.connect(own.conninfo, autocommit=True) as conn:
        conn.execute("CREATE TABLE ballast (x text)")
        for _ in range(6):
            conn.execute("INSERT INTO ballast SELECT repeat('x', 2000) FROM generate_series(1, 10000)")
            conn.execute("SELECT pg_switch_wal()")
        conn.execute("CHECKPOINT")
        conn.execute("CHECKPOINT")
    status = capture_status(own)
    assert status["slot_state"]["wal_status"] == "lost", status
    result = unilog(own, "streamer", "--once")
    # the WAL the slot needed is gone: whether it held record messages cannot be known, so the loss is named (exit
    # 12), but the log does not stop: the rows are published in the same run, and the slot is re-created
    assert result.returncode == 12, result.stderr
    assert "already removed" in result.stderr and "are lost" in result.stderr, result.stderr
    assert published(rds) == [(i + 1, i) for i in range(7)], "the rest from the table, each once"
    assert unilog(own, "streamer", "--once").returncode == 0, "exit 12 once per loss"


def test_a_commit_the_wal_sent_before_it_became_visible_is_published_not_skipped(
    own: Settings, own_server: Any, rds: redis.Redis
) -> None:
    """A commit record is in the WAL (and on the slot's stream) a moment before the transaction stops counting as
    running: here that moment is stretched by synchronous replication to a standby that does not exist, which holds
    the producer after its commit record was flushed. A missing row then means "not visible yet", not "published"."""
    with psycopg.connect(own_server.url, autocommit=True) as admin:
        dbname = own.database_url.rpartition("/")[2]
        admin.execute(f'ALTER DATABASE "{dbname}" SET synchronous_commit = local')  # everyone but the producer
        admin.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        admin.execute("SELECT pg_reload_conf()")
    producer = psycopg.connect(own.conninfo, options="-c synchronous_commit=on")
    try:
        # a reload reaches a session at its next statement: a producer that missed it would not wait (a CI run's
        # timer then cancelled nothing, and the test passed without its premise)
        deadline = time.monotonic() + 10
        while producer.execute("SHOW synchronous_standby_names").fetchone()[0] != "nobody":
            assert time.monotonic() < deadline, "the producer's session never saw synchronous_standby_names"
            producer.rollback()
            time.sleep(0.05)
        producer.rollback()
        stage(producer, 0)
        pid = producer.info.backend_pid
        committing = threading.Thread(target=producer.commit)  # flushed, then waits for the standby
        committing.start()
        with psycopg.connect(own_server.url, autocommit=True) as admin:
            admin.execute("SELECT pg_sleep(1)")  # the slot has sent the commit meanwhile
            assert committing.is_alive(), "the producer's commit waits for the standby that does not exist"
            threading.Timer(1.0, admin.execute, ("SELECT pg_cancel_backend(%s)", (pid,))).start()
            with streamer(own) as s:
                assert until_published(s) == 1, "waited until the transaction was visible, then published it"
        committing.join(10)
    finally:
        producer.close()
        with psycopg.connect(own_server.url, autocommit=True) as admin:
            admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
            admin.execute("SELECT pg_reload_conf()")
    assert published(rds) == [(1, 0)]
    assert count_staged(own) == 0


def test_a_dropped_streamer_releases_its_locks_and_slot_without_close(wal: Settings, pg: Any) -> None:
    """No reference cycle keeps a streamer alive: ``Streamer(settings).drain()`` without ``with`` lets the next one
    publish (the test suite and users write it that way)."""
    import gc

    gc.disable()  # only reference counting may free it
    try:
        emit_n(wal, 2)
        assert Streamer(wal).drain(timeout=10) == 2
        emit_n(wal, 2, start=2)
        assert Streamer(wal).drain(timeout=10) == 2, "the first one's slot session and stream lock are gone"
        disable_wal(settings := wal)
        emit_n(settings, 1, start=4)
        assert Streamer(settings).drain(timeout=10) == 1, "and in table mode"
        assert Streamer(settings).drain(timeout=10) == 0
    finally:
        gc.enable()


def test_a_switch_is_refused_while_a_streamer_publishes_naming_a_few_of_its_streams(
    settings: Settings, pg: Any, rds: redis.Redis
) -> None:
    """A mode switch settles the batches in flight in the mode that sent them, so it refuses while a streamer holds
    streams; the line names three of them and counts the rest (one statement reads every stream's holders: it was a
    statement per stream, 3.8 s of a switch over 10,000 streams). Once the streamer stops, the switch goes through."""
    if pg.execute("SHOW wal_level").fetchone()[0] != "logical":
        pytest.skip("wal_level is not logical")
    pg.execute(
        "INSERT INTO staged_log_records (action, object, data, stream) "
        "SELECT 'create', 'ride', '{}'::jsonb, format('switch-%s', lpad(n::text, 3, '0')) FROM generate_series(1, 300) n"
    )
    running = streamer(settings)
    try:
        assert running.drain() == 300
        with pytest.raises(ConfigurationError) as refused:
            enable_wal(settings)
        line = str(refused.value)
        assert line.startswith(
            "streamers are running on this database (switch-001, switch-002, switch-003 and 297 more streams): stop "
        ), line
        assert "\n" not in line
        assert capture_status(settings)["mode"] == "table"
    finally:
        running.close()
    enable_wal(settings)
    assert capture_status(settings)["mode"] == "wal"
    disable_wal(settings)
