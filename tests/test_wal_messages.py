"""Records as logical messages (issue 26): in WAL capture mode ``emit`` writes each record with
``pg_logical_emit_message(true, 'unilog', ...)`` in the producer's transaction. Every crash window of the WAL path
again, for messages: there is no row to delete or look up, so a streamer saves the (commit LSN, ordinal) of the
last message it published with its positions, and skips what the slot sends again at or before it.

On the suite's real Postgres (wal_level=logical) and Redis; the restart test starts a server of its own.
"""

from __future__ import annotations

import json
import os
import re
import signal
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

from unilog import Settings, Streamer, StreamerConfig, emit, store
from unilog.errors import CaptureLost, ConfigurationError, InjectedCrash
from unilog.faults import Faults
from unilog.store.pgoutput import Decoder
from unilog.store.wal import ReplicationStream, capture_slot
from unilog.stream.modes import capture_status, disable_wal, enable_wal

STREAM = "test-stream"


def emit_n(settings: Settings, n: int, start: int = 0) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(start, start + n):
            emit(conn, action="create", object="ride", data={"n": i})


def published(rds: redis.Redis, stream: str = STREAM) -> list[tuple[int, int]]:
    return [(int(f["seq"]), json.loads(f["data"])["n"]) for _id, f in rds.xrange(stream)]


def dense(n: int, start: int = 0) -> list[tuple[int, int]]:
    return [(i + 1, start + i) for i in range(n)]


def staged(pg: Any) -> int:
    return int(pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0])


def streamer(settings: Settings, faults: Faults | None = None, **config: Any) -> Streamer:
    return Streamer(settings, StreamerConfig(restart_after_crash=False, **config), faults=faults or Faults())


def test_emit_writes_a_message_not_a_row_and_it_is_published_in_commit_order(
    wal: Settings, pg: Any, rds: redis.Redis
) -> None:
    assert capture_status(wal)["records_as"] == "messages"
    early = psycopg.connect(wal.conninfo)  # begins first, commits last
    assert emit(early, action="create", object="ride", data={"n": 100}, key="k") is None, "no staged id: a message"
    emit_n(wal, 3)
    assert staged(pg) == 0, "nothing written to staged_log_records"
    with streamer(wal) as s:
        assert s.drain(timeout=10) == 3
        early.commit()
        assert s.drain(timeout=10) == 1
    assert published(rds) == [(1, 0), (2, 1), (3, 2), (4, 100)]
    last = rds.xrevrange(STREAM, count=1)[0][1]
    assert (last["action"], last["object"], last["key"]) == ("create", "ride", "k")
    early.close()


def test_a_rolled_back_message_is_never_published(wal: Settings, pg: Any, rds: redis.Redis) -> None:
    with psycopg.connect(wal.conninfo) as conn:
        emit(conn, action="create", object="ride", data={"n": 99})
        conn.rollback()
        emit(conn, action="create", object="ride", data={"n": 0})
    with streamer(wal) as s:
        assert s.drain(timeout=10) == 1
    assert published(rds) == [(1, 0)]


def test_rows_and_messages_in_one_transaction_keep_their_order(wal: Settings, pg: Any, rds: redis.Redis) -> None:
    """A row another producer (SQL, a trigger) inserts and unilog's messages share the slot's stream and order."""
    with psycopg.connect(wal.conninfo) as conn:
        emit(conn, action="create", object="ride", data={"n": 0})
        conn.execute("INSERT INTO staged_log_records (action, object, data) VALUES ('create', 'ride', '{\"n\": 1}')")
        emit(conn, action="create", object="ride", data={"n": 2})
    with streamer(wal) as s:
        assert s.drain(timeout=10) == 3
    assert published(rds) == dense(3)
    assert staged(pg) == 0, "the row was deleted once published"


def test_a_crash_after_the_append_resends_the_same_positions(wal: Settings, pg: Any, rds: redis.Redis) -> None:
    emit_n(wal, 5)
    with streamer(wal, Faults.scripted(streamer__crash_after_publish=[True])) as s, pytest.raises(InjectedCrash):
        s.drain(timeout=10)
    assert published(rds) == dense(5), "appended before the crash, positions and mark not saved"
    emit_n(wal, 2, start=5)
    with streamer(wal) as s:
        assert s.drain(timeout=10) == 7, "the five again from the slot, re-sent with the same positions"
    assert published(rds) == dense(7), "the broker dropped the re-sent ones: no duplicate"


def test_a_crash_before_the_slot_confirmation_skips_what_was_published(
    wal: Settings, pg: Any, rds: redis.Redis
) -> None:
    emit_n(wal, 4)
    with streamer(wal, Faults.scripted(streamer__crash_before_confirm=[True])) as s, pytest.raises(InjectedCrash):
        s.drain(timeout=10)
    emit_n(wal, 1, start=4)
    with streamer(wal) as s:
        assert s.drain(timeout=10) == 1, "the four come from the slot again, at or before the saved mark: skipped"
    assert published(rds) == dense(5)


def test_a_large_transaction_of_messages_resumes_mid_transaction(wal: Settings, pg: Any, rds: redis.Redis) -> None:
    with psycopg.connect(wal.conninfo) as conn:  # one transaction of 25 messages
        for i in range(25):
            emit(conn, action="create", object="ride", data={"n": i})
    faults = Faults.scripted(streamer__crash_before_confirm=[False, True])
    with streamer(wal, faults, batch_size=10) as s, pytest.raises(InjectedCrash):
        s.drain(timeout=10)  # two batches of 10 published and marked; the slot not confirmed past the transaction
    assert rds.xlen(STREAM) == 20
    with streamer(wal, batch_size=10) as s:
        assert s.drain(timeout=10) == 5, "the transaction again; its first 20 messages are at or before the mark"
    assert published(rds) == dense(25)


def test_a_dropped_slot_where_the_wal_cannot_be_read_back_says_what_may_be_lost_and_goes_on(
    wal: Settings, pg: Any, rds: redis.Redis
) -> None:
    """Where messages cannot be read back from the WAL (Postgres 15's pg_walinspect shows no payload, 16 may lack
    it; Postgres 16+ with pg_walinspect recovers them: tests/test_slot_recovery.py), a lost slot's line says how many
    may be lost (exit 12, once), the loss is recorded for an operator, and the log goes on: the streamer re-creates
    the slot itself and producers write messages again once it is safe."""
    if store.walinspect_ready(pg) is None:
        pytest.skip("this server reads record messages back from the WAL: tests/test_slot_recovery.py covers it")
    pg.rollback()
    emit_n(wal, 2)
    with streamer(wal) as s:
        s.drain(timeout=10)
    emit_n(wal, 3, start=2)  # messages the slot has not delivered
    pg.execute("SELECT pg_drop_replication_slot(%s)", (capture_status(wal)["slot"],))
    result = unilog(wal, "streamer", "--once")
    assert result.returncode == 12, result.stderr
    line = one_line(result)
    assert "are lost" in line and "unilog capture losses" in line, line
    emit_n(wal, 2, start=5)
    assert capture_status(wal)["records_as"] == "messages", "the new slot is safe: messages again"
    assert unilog(wal, "streamer", "--once").returncode == 0, "exit 12 once per loss, not at every start"
    assert published(rds) == [(1, 0), (2, 1), (3, 5), (4, 6)], "everything the WAL could give, once each"
    losses = unilog(wal, "capture", "losses")
    assert "NOT ACKNOWLEDGED" in losses.stdout, losses.stdout


def test_a_dropped_slots_line_counts_the_messages_it_may_have_lost(wal: Settings, pg: Any, rds: redis.Redis) -> None:
    """Exit 12 says how many logical messages the WAL holds in the range (an upper bound) where pg_walinspect can
    count but not read them (Postgres 15)."""
    if pg.info.server_version >= 160000:
        pytest.skip("Postgres 16+ reads the messages back (tests/test_slot_recovery.py)")
    try:
        pg.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    except psycopg.Error as exc:
        pytest.skip(f"pg_walinspect is not available on this server: {exc}")
    emit_n(wal, 2)
    with streamer(wal) as s:
        s.drain(timeout=10)
    emit_n(wal, 3, start=2)
    pg.execute("SELECT pg_drop_replication_slot(%s)", (capture_status(wal)["slot"],))
    result = unilog(wal, "streamer", "--once")
    assert result.returncode == 12, result.stderr
    found = re.search(r"up to (\d+) record messages", one_line(result))
    assert found and int(found.group(1)) >= 3, one_line(result)


def test_an_operator_recreating_a_healthy_slot_publishes_its_messages_first(
    wal: Settings, pg: Any, rds: redis.Redis
) -> None:
    emit_n(wal, 3)
    assert unilog(wal, "capture", "wal", "--recreate").returncode == 0
    emit_n(wal, 2, start=3)
    with streamer(wal) as s:
        assert s.drain(timeout=10) == 2
    assert published(rds) == dense(5)


def test_repeatable_read_producer_that_began_before_the_switch_writes_a_row(
    wal: Settings, pg: Any, rds: redis.Redis
) -> None:
    """The mode is a sequence, read as it is now whatever the transaction's snapshot: a REPEATABLE READ transaction
    whose snapshot predates ``capture table`` must not write a message after the slot is gone."""
    rr = psycopg.connect(wal.conninfo)
    rr.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    rr.execute("SELECT 1")  # the snapshot is taken: WAL mode
    with psycopg.connect(wal.conninfo, autocommit=True) as conn:
        store.set_emit_messages(conn, False, wait=False)  # the switch's first step (then it waits for rr to end)
    assert emit(rr, action="create", object="ride", data={"n": 0}) is not None, "a row, with its staged id"
    rr.commit()
    with streamer(wal) as s:
        assert s.drain(timeout=10) == 1
    assert published(rds) == dense(1)
    rr.close()


def test_a_switch_behind_an_idle_emitter_gives_up_in_one_line(
    wal: Settings, pg: Any, rds: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("unilog.store.wal.DDL_LOCK_TIMEOUT", 0.3)
    writer = psycopg.connect(wal.conninfo)  # emitted a message and sits idle in transaction
    emit(writer, action="create", object="ride", data={"n": 0})
    with pytest.raises(ConfigurationError, match="producers now stage rows, but a transaction that may have written"):
        disable_wal(wal)
    status = capture_status(wal)
    assert status["mode"] == "wal" and status["records_as"] == "rows", "still WAL mode (which captures rows too)"
    writer.commit()
    disable_wal(wal)
    assert published(rds) == dense(1), "the switch published the message before dropping the slot"
    writer.close()


def publish_for(settings: Settings, seconds: float) -> None:
    halt = threading.Event()
    with streamer(settings) as s:
        runner = threading.Thread(target=s.run, args=(halt,))
        runner.start()
        time.sleep(seconds)
        halt.set()
        runner.join(30)


def test_producers_committing_throughout_switches_lose_and_repeat_nothing(
    settings: Settings, pg: Any, rds: redis.Redis
) -> None:
    """Four producers commit records (one, or three in one transaction) without pause while the database goes
    table -> WAL -> table -> WAL -> table, a streamer draining between switches: every committed record is published
    exactly once, each producer's in its commit order, positions dense."""
    if pg.execute("SHOW wal_level").fetchone()[0] != "logical":
        pytest.skip("wal_level is not logical")
    stop = threading.Event()
    committed: dict[int, list[int]] = {w: [] for w in range(4)}

    def produce(worker: int) -> None:
        with psycopg.connect(settings.conninfo) as conn:
            n = 0
            while not stop.is_set():
                batch = 3 if n % 5 == 0 else 1
                for i in range(batch):
                    emit(conn, action="create", object="ride", data={"n": worker * 1_000_000 + n + i}, key=str(worker))
                conn.commit()
                committed[worker].extend(range(n, n + batch))
                n += batch

    threads = [threading.Thread(target=produce, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    try:
        for switch in (enable_wal, disable_wal, enable_wal, disable_wal):
            publish_for(settings, 0.5)  # a streamer runs, then stops: a switch runs only while none does
            switch(settings)
        publish_for(settings, 0.5)
    finally:
        stop.set()
        for t in threads:
            t.join()
    with streamer(settings) as s:
        s.drain(timeout=30)
    seen = published(rds)
    assert [seq for seq, _n in seen] == list(range(1, len(seen) + 1)), "dense positions"
    for w in range(4):
        mine = [n - w * 1_000_000 for _seq, n in seen if n // 1_000_000 == w]
        assert mine == committed[w], f"producer {w}: each committed record once, in its commit order"
    assert sum(len(c) for c in committed.values()) > 200


def test_unilog_emit_stages_in_either_mode_and_checks_like_emit(wal: Settings, pg: Any, rds: redis.Redis) -> None:
    """The SQL function for producers in any language and triggers: a message in WAL mode, a row in table mode."""
    sql = "SELECT unilog_emit(%s, %s, 'create', 'ride', %s::jsonb)"
    with psycopg.connect(wal.conninfo) as conn:
        assert conn.execute(sql, ("", "k", '{"n": 0}')).fetchone()[0] is None, "a message"
    disable_wal(wal)
    with psycopg.connect(wal.conninfo) as conn:
        assert isinstance(conn.execute(sql, ("", None, '{"n": 1}')).fetchone()[0], int), "a row"
        conn.commit()
        big = json.dumps({"n": 2, "pad": "x" * (1 << 20)})
        with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="over the limit of 1048576 bytes"):
            conn.execute(sql, ("", None, big))
        conn.rollback()
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="invalid stream name"):
            conn.execute(sql, ("bad stream", None, '{"n": 3}'))
        conn.rollback()
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="action and object"):
            conn.execute("SELECT unilog_emit('', NULL, '', 'ride', '{}'::jsonb)")
    with streamer(wal) as s:
        assert s.drain(timeout=10) == 1
    assert published(rds) == dense(2), "the message went out with the switch; the row after it"


def test_a_trigger_can_emit_through_unilog_emit(wal: Settings, pg: Any, rds: redis.Redis) -> None:
    pg.execute("CREATE TABLE planets (id int PRIMARY KEY, name text)")
    pg.execute(
        """
        CREATE FUNCTION planets_log() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM unilog_emit('', NEW.id::text, lower(TG_OP), 'planet', jsonb_build_object('n', NEW.id));
            RETURN NULL;
        END $$
        """
    )
    pg.execute(
        "CREATE TRIGGER planets_log AFTER INSERT OR UPDATE ON planets FOR EACH ROW EXECUTE FUNCTION planets_log()"
    )
    pg.commit()
    with psycopg.connect(wal.conninfo) as conn:
        conn.execute("INSERT INTO planets VALUES (0, 'mercury'), (1, 'venus')")
    with streamer(wal) as s:
        assert s.drain(timeout=10) == 2
    assert published(rds) == dense(2)
    assert rds.xrange(STREAM)[0][1]["action"] == "insert"


# -- Postgres restarted mid-transaction, streamers killed mid-batch: on a server of its own -----------------------------


@pytest.fixture(scope="module")
def own_server() -> Iterator[Any]:
    from unilog.harness.embedded import EmbeddedPostgres

    server = EmbeddedPostgres().start()
    try:
        yield server
    finally:
        server.stop(mode="immediate", cleanup=True)


def test_postgres_restarts_and_streamer_kills_publish_each_message_once(
    own_server: Any, settings: Settings, rds: redis.Redis
) -> None:
    from unilog.ops.schema import migrate

    with psycopg.connect(own_server.url, autocommit=True) as admin:
        admin.execute('CREATE DATABASE "messages_restart"')
    own = Settings.from_dsn(own_server.url_for("messages_restart"), settings.redis_url, settings.stream)
    migrate(own.database_url)
    enable_wal(own)
    env = {**os.environ, "DATABASE_URL": own.database_url, "REDIS_URL": own.redis_url, "UNILOG_STREAM": STREAM}
    argv = [sys.executable, "-m", "unilog", "streamer", "--batch-size", "7"]

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(argv, cwd=TESTS, env=env, stdout=subprocess.DEVNULL, text=True)

    proc = start()
    try:
        for round_ in range(4):
            open_tx = psycopg.connect(own.conninfo)  # mid-transaction when the server restarts: never committed
            emit(open_tx, action="create", object="ride", data={"n": -1})
            emit_n(own, 50, start=round_ * 50)
            time.sleep(0.3)
            if round_ % 2 == 0:
                own_server.restart("immediate")
            else:
                open_tx.rollback()
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
                proc = start()
            open_tx.close()
        emit_n(own, 10, start=200)
        deadline = time.monotonic() + 60
        while rds.xlen(STREAM) < 210:
            assert time.monotonic() < deadline, rds.xlen(STREAM)
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(30)
    seen = published(rds)
    assert sorted(n for _s, n in seen) == list(range(210)), "every committed message once; the aborted ones never"
    assert [s for s, _n in seen] == list(range(1, 211)), "dense positions"
    assert proc.returncode == 0


def test_a_slot_lost_with_a_batch_in_doubt_stops_in_one_line(wal: Settings, rds: redis.Redis) -> None:
    """The one loss that still stops the streamer (exit 12): a batch was in Redis but not yet saved when the slot
    went (crash injected right after the publish), so only the lost slot knew its order; the error names the
    recovery (docs/guides/wal-capture.md, 'slot lost mid-batch')."""
    emit_n(wal, 2)
    with streamer(wal) as s:
        s.drain(timeout=10)  # positions saved: a later batch past them is in doubt
    emit_n(wal, 3, start=2)
    faults = Faults.scripted(streamer__crash_after_publish=[True])
    with streamer(wal, faults) as s, pytest.raises(InjectedCrash):
        s.drain(timeout=10)
    assert rds.xlen(STREAM) == 5, "the batch is in Redis, not saved in Postgres"
    with psycopg.connect(wal.conninfo, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (capture_status(wal)["slot"],))
    with streamer(wal) as s, pytest.raises(CaptureLost, match="capture wal --recreate"):
        s.drain(timeout=10)
    result = unilog(wal, "streamer", "--once")
    assert result.returncode == 12 and "capture wal --recreate" in one_line(result), result.stderr


def test_a_mixed_batch_of_messages_carries_each_records_own_context(
    wal: Settings, rds: redis.Redis, spans: Any
) -> None:
    """Traced and untraced messages (and a row) in one batch: each entry gets exactly its own fields, as in table
    mode (the seven-argument publish path when any record of the batch is traced)."""
    from opentelemetry import context, trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    parent = SpanContext(
        0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1), trace_state=TraceState([("vendor", "v1")])
    )
    tracer = trace.get_tracer("test")
    with psycopg.connect(wal.conninfo) as conn:
        with tracer.start_as_current_span("keyed"):
            emit(conn, action="a", object="o", data={"n": 1}, key="k1")
        emit(conn, action="a", object="o", data={"n": 2})
        conn.execute("INSERT INTO staged_log_records (action, object, data) VALUES ('a', 'o', '{\"n\": 3}')")
        token = context.attach(trace.set_span_in_context(NonRecordingSpan(parent)))
        try:
            emit(conn, action="a", object="o", data={"n": 4}, key="k4")
        finally:
            context.detach(token)
    with streamer(wal) as s:
        assert s.drain(timeout=10) == 4
    entries = [fields for _, fields in rds.xrange(STREAM)]
    assert [sorted(set(f) - {"data", "action", "object", "producer", "epoch", "seq", "created"}) for f in entries] == [
        ["key", "traceparent"],
        [],
        [],
        ["key", "traceparent", "tracestate"],
    ]
    assert [json.loads(f["data"])["n"] for f in entries] == [1, 2, 3, 4]
    assert entries[0]["key"] == "k1" and entries[3]["tracestate"] == "vendor=v1"
    assert entries[3]["traceparent"] == f"00-{0xABC:032x}-{0xDEF:016x}-01"
    assert abs(int(entries[0]["created"]) - time.time() * 1000) < 60_000, "created: the transaction's start, in ms"


def test_messages_of_a_partitioned_stream_go_to_their_keys_partitions(wal: Settings, rds: redis.Redis) -> None:
    from unilog.engine import RedisStreams, connect
    from unilog.routing import partition_of, partition_stream

    api = RedisStreams(connect(wal.redis_url))
    api.set_partitions(STREAM, 4)
    api.close()
    with psycopg.connect(wal.conninfo) as conn:
        for i in range(40):
            emit(conn, action="create", object="ride", data={"n": i}, key=f"k{i % 8}")
        emit(conn, action="create", object="ride", data={"n": 40})  # no key: spread, but published once
    with streamer(wal) as s:
        assert s.drain(timeout=10) == 41
    seen = []
    for p in range(4):
        for _id, f in rds.xrange(partition_stream(STREAM, p)):
            n = json.loads(f["data"])["n"]
            seen.append(n)
            if n < 40:
                assert p == partition_of(f"k{n % 8}", 4), "a key's records in its partition"
        ns = [json.loads(f["data"])["n"] for _id, f in rds.xrange(partition_stream(STREAM, p))]
        assert ns == sorted(ns), "in commit order within the partition"
    assert sorted(seen) == list(range(41))


def test_emit_async_writes_a_message_too(wal: Settings, pg: Any, rds: redis.Redis) -> None:
    import asyncio

    from unilog import emit_async

    async def produce() -> Any:
        async with await psycopg.AsyncConnection.connect(wal.conninfo) as conn:
            staged_id = await emit_async(conn, action="create", object="ride", data={"n": 0})
            await conn.commit()
            return staged_id

    assert asyncio.run(produce()) is None, "a message: no staged id"
    assert staged(pg) == 0
    with streamer(wal) as s:
        assert s.drain(timeout=10) == 1
    assert published(rds) == dense(1)


def slot_messages(settings: Settings, pg: Any, commits: int) -> list[bytes]:
    """The raw pgoutput messages of the database's slot, read until ``commits`` transactions have arrived."""
    slot = capture_slot(pg)
    assert slot is not None
    reader = ReplicationStream(settings.conninfo, slot, application_name="test-slot-messages", timeout=10)
    messages: list[bytes] = []
    deadline = time.monotonic() + 10
    while sum(m[:1] == b"C" for m in messages) < commits and time.monotonic() < deadline:
        messages += reader.read(1000, 0.2)
    reader.close()
    return messages


def test_the_decoders_short_path_reads_messages_as_the_general_one_does(wal: Settings, pg: Any) -> None:
    """feed_all's short path (untraced record messages) and feed's general one, on one real slot's output: records of
    every shape (default and named streams, with and without a key, traced, a row among them) decode alike."""
    with psycopg.connect(wal.conninfo) as conn:
        conn.execute("SELECT unilog_stage('create', 'ride', '{\"n\": 0}', '', NULL, NULL, NULL)")
        conn.execute("SELECT unilog_stage('create', 'ride', '{\"n\": 1}', 'named.s-1', 'k1', NULL, NULL)")
        conn.execute("SELECT unilog_stage('create', 'ride', '{\"n\": 2}', '', 'k2', '00-ab-cd-01', 'x=1')")
        conn.execute("SELECT unilog_stage('create', 'ride', '{\"n\": 3}', 'named', NULL, '00-ab-cd-01', NULL)")
        conn.execute("SELECT unilog_stage('create', 'ride', '{\"é\": 4}', 'named', 'ü', NULL, NULL)")
        conn.execute("SELECT pg_logical_emit_message(true, 'other', 'not ours')")
        conn.execute(
            "INSERT INTO staged_log_records (action, object, data, stream) VALUES ('create', 'ride', '{\"n\": 5}', '')"
        )
    messages = slot_messages(wal, pg, commits=1)
    general = Decoder()
    by_feed = [t for m in messages if (t := general.feed(m)) is not None]
    by_feed_all = Decoder().feed_all(messages)
    assert [t.rows for t in by_feed_all] == [t.rows for t in by_feed]
    rows = by_feed_all[-1].rows
    assert [stream for stream, *_ in rows] == ["", "named.s-1", "", "named", "named", ""]
    assert [bool(trace) for *_, trace in rows] == [False, False, True, True, False, False]
    body = rows[4][3]
    assert body.startswith('$9\r\n{"é": 4}\r\n'.encode()) and body.endswith("$2\r\nü\r\n".encode())
    assert [mark[1] if mark else None for _s, _r, mark, *_ in rows] == [0, 1, 2, 3, 4, None]
    assert rows[5][1] is not None and rows[5][3:] == (b"", b""), "a row: no body, no trace"
    assert by_feed_all[-1].plain is None, "traced messages and a row: not plain"


def test_the_decoder_says_which_transactions_hold_untraced_messages_of_one_stream(wal: Settings, pg: Any) -> None:
    """WalTransaction.plain, which lets the streamer concatenate a batch without looking at each record: the one
    stream of a transaction (or part) whose records are all untraced messages; None for anything else."""
    stage = "SELECT unilog_stage('create', 'ride', '{}', %s, NULL, %s, NULL)"
    shapes = [[("s", None)] * 3, [("s", None), ("t", None)], [("s", None), ("s", "00-ab-cd-01")], [("", None)] * 5]
    for shape in shapes:
        with psycopg.connect(wal.conninfo) as conn:
            for stream, traceparent in shape:
                conn.execute(stage, (stream, traceparent))
    messages = slot_messages(wal, pg, commits=len(shapes))
    assert [t.plain for t in Decoder().feed_all(messages)] == ["s", None, None, ""]
    parts = Decoder(part_rows=2).feed_all(messages)
    assert [(len(t.rows), t.plain) for t in parts] == [
        (2, "s"),
        (1, "s"),
        (2, None),
        (2, None),
        (2, ""),
        (2, ""),
        (1, ""),
    ]
