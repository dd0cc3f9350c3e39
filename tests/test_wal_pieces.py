"""Issue 46, WAL mode: a deep batch over many streams is encoded and sent in pieces (the next piece encoded while Redis
appends the one before), its positions and mark are written while Redis appends and committed only once Redis
confirmed every piece, and a stream just opened on a backlog waits for the backlog while it arrives, so that its
first batch is as deep as the backlog's spread calls for."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from dropped import assert_sessions_end, dropped, refcounting_only
from test_many_streams import _assert_each_once_in_order, _stage

from unilog import Settings, Streamer, StreamerConfig, emit_many
from unilog.errors import InjectedCrash, PublishError
from unilog.store.wal import ReplicationStream
from unilog.stream.capture_wal import PIECES
from unilog.stream.publisher import Publisher

BATCH = 100  # spread is judged on a batch's worth of records: 100 streams at least among them
NAMES = [f"p-{k:03d}" for k in range(500)]


def _positions(pg: Any) -> int:
    pg.commit()  # a fresh snapshot: what the streamer committed, not what it wrote
    return int(pg.execute("SELECT count(*) FROM unilog_stream_positions").fetchone()[0])


def test_a_deep_wal_batch_is_encoded_piece_by_piece_while_redis_appends_the_piece_before(
    wal: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,000 records over 500 streams, ``batch_size`` 100: one deep batch, sent in PIECES script rounds. Each piece's
    positions are looked up (the last step of its encoding) only once Redis has begun appending the piece before: a
    streamer that encoded the whole batch before sending any of it fails here (one send, nothing waited for)."""
    total = _stage(wal, NAMES, per_stream=2)
    started = [threading.Event() for _ in range(64)]
    sends: list[int] = []
    waited: list[bool] = []
    seqs = {"calls": 0}
    send_all, next_seqs = Publisher.send_all, Publisher.next_seqs

    def send(self: Publisher, targets: dict[str, Any], *args: Any, **kw: Any) -> int:
        started[len(sends)].set()
        sends.append(sum(payload.count for payload in targets.values()))
        time.sleep(0.05)  # Redis busy with the piece: the next one is encoded meanwhile
        return send_all(self, targets, *args, **kw)

    def look_up(self: Publisher, conn: Any, targets: Any, epoch: int) -> dict[str, int]:
        k = seqs["calls"]
        seqs["calls"] += 1
        if k:
            waited.append(started[k - 1].wait(10))
        return next_seqs(self, conn, targets, epoch)

    monkeypatch.setattr(Publisher, "send_all", send)
    monkeypatch.setattr(Publisher, "next_seqs", look_up)
    with Streamer(wal, StreamerConfig(batch_size=BATCH), name="pieces") as streamer:
        assert streamer.drain(timeout=60) == total
    assert sends[:PIECES] == [total // PIECES] * PIECES, f"the backlog went in one batch of {PIECES} pieces: {sends}"
    assert waited and all(waited), "each piece's positions were looked up while the piece before was being sent"
    _assert_each_once_in_order(rds, NAMES, 2)


def test_a_wal_batch_is_written_while_redis_appends_and_committed_once_redis_confirmed_it(
    wal: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While Redis appends a batch's last piece, the streamer's session has already written its positions (it holds
    the positions table's row locks) but not committed them: nobody else sees them until Redis confirmed the batch.
    A streamer that wrote them only after the send fails the first assertion; one that committed them before Redis
    confirmed fails the second."""
    total = _stage(wal, NAMES, per_stream=2)
    seen: list[tuple[bool, int]] = []
    send_all = Publisher.send_all
    pid = {"backend": 0}

    def send(self: Publisher, targets: dict[str, Any], *args: Any, **kw: Any) -> int:
        appended = send_all(self, targets, *args, **kw)
        if sum(payload.count for payload in targets.values()) == total // PIECES and len(seen) < PIECES:
            with psycopg.connect(wal.conninfo, autocommit=True) as watcher:
                deadline, writing = time.monotonic() + 5, False
                while not writing and time.monotonic() < deadline:
                    writing = watcher.execute(
                        "SELECT count(*) > 0 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                        "WHERE c.relname = 'unilog_stream_positions' AND l.pid = %s AND l.mode = 'RowExclusiveLock'",
                        (pid["backend"],),
                    ).fetchone()[0]
                    time.sleep(0.01)
                count = watcher.execute("SELECT count(*) FROM unilog_stream_positions").fetchone()[0]
            seen.append((writing, count))
        return appended

    monkeypatch.setattr(Publisher, "send_all", send)
    with Streamer(wal, StreamerConfig(batch_size=BATCH), name="written") as streamer:
        streamer.connect()
        assert streamer.links.pg_open is not None
        pid["backend"] = streamer.links.pg_open.info.backend_pid
        assert streamer.drain(timeout=60) == total
    assert len(seen) == PIECES, seen
    assert seen[-1][0], "the positions were being written while Redis appended the last piece"
    assert [count for _w, count in seen] == [0] * PIECES, "nothing committed before Redis confirmed every piece"
    assert _positions(pg) == len(NAMES)
    _assert_each_once_in_order(rds, NAMES, 2)


def test_a_wal_piece_redis_refused_ends_the_sending_and_saves_nothing(
    wal: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis refuses the second piece of a deep batch: the pieces after it are never sent, the positions and mark
    written meanwhile are rolled back (nothing saved, nothing confirmed to the slot); the next pass reads the batch
    from the slot again and re-sends it under the same positions, each record once, in order."""
    total = _stage(wal, NAMES, per_stream=2)
    sends: list[int] = []
    send_all = Publisher.send_all

    def send(self: Publisher, targets: dict[str, Any], *args: Any, **kw: Any) -> int:
        sends.append(sum(payload.count for payload in targets.values()))
        if len(sends) == 2:
            time.sleep(0.2)  # the batch's positions are written meanwhile: they must not outlive the refusal
            raise PublishError("Redis did not confirm a piece (injected)")
        return send_all(self, targets, *args, **kw)

    with Streamer(wal, StreamerConfig(batch_size=BATCH), name="refused") as streamer:
        monkeypatch.setattr(Publisher, "send_all", send)
        with pytest.raises(PublishError, match="injected"):
            for _ in range(10):
                streamer.run_once()
        assert len(sends) == 2, f"nothing was sent after the refused piece: {sends}"
        assert sum(rds.xlen(n) for n in NAMES) == sends[0], "the first piece only"
        assert _positions(pg) == 0, "no position saved"
        state = pg.execute("SELECT state FROM pg_stat_activity WHERE application_name = 'unilog-refused'").fetchall()
        assert [r[0] for r in state] == ["idle"], "what the batch wrote was rolled back at once, not left open"
        monkeypatch.setattr(Publisher, "send_all", send_all)
        streamer.recover()
        assert streamer.drain(timeout=60) == total
    _assert_each_once_in_order(rds, NAMES, 2)


@pytest.mark.parametrize(("streams", "encoding"), [(500, 0.0), (50, 0.0), (500, 0.2)])
def test_a_server_that_ends_idle_transactions_lets_a_wal_batch_wait_for_redis(
    wal: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch, streams: int, encoding: float
) -> None:
    """The transaction that writes a deep WAL batch's positions stays open, idle, while Redis appends it, and so does
    the one that reads its pieces' positions while the next piece is encoded (``encoding``: 200 ms a piece); a batch
    smaller than ``batch_size`` (50 records) is sent from the streamer's own thread with no transaction open. A server
    with ``idle_in_transaction_session_timeout`` set (100 ms here; each send takes 300 ms) must end none of them: else
    every retry would meet the same timeout and the backlog would never drain."""
    names = NAMES[:streams]
    total = _stage(wal, names, per_stream=2 if streams > BATCH else 1)
    send_all, next_seqs = Publisher.send_all, Publisher.next_seqs

    def slow(self: Publisher, targets: dict[str, Any], *args: Any, **kw: Any) -> int:
        time.sleep(0.3)
        return send_all(self, targets, *args, **kw)

    def encoded_slowly(self: Publisher, *args: Any) -> dict[str, int]:
        time.sleep(encoding)
        return next_seqs(self, *args)

    monkeypatch.setattr(Publisher, "next_seqs", encoded_slowly)

    database = pg.execute("SELECT current_database()").fetchone()[0]
    pg.execute(f'ALTER DATABASE "{database}" SET idle_in_transaction_session_timeout = 100')
    pg.commit()
    try:
        monkeypatch.setattr(Publisher, "send_all", slow)
        with Streamer(wal, StreamerConfig(batch_size=BATCH), name="patient") as streamer:
            assert streamer.drain(timeout=60) == total
    finally:
        pg.execute(f'ALTER DATABASE "{database}" RESET idle_in_transaction_session_timeout')
        pg.commit()
    _assert_each_once_in_order(rds, names, 2 if streams > BATCH else 1)


@pytest.mark.parametrize("opened", [False, True], ids=["just-opened", "open-before"])
def test_a_backlog_arriving_over_many_streams_is_waited_for_and_taken_in_one_deep_batch(
    wal: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch, opened: bool
) -> None:
    """The server sends a backlog over 1,000 streams (transactions of 100 records) at its own pace: 100 messages
    every 10 ms. On a stream just opened, or once a tenth of a batch is pending, the streamer waits while it arrives
    that fast, so that the first batch holds the whole backlog (one position and one script section per stream). A
    streamer that took what had arrived at its first look sends a shallow batch first and touches the streams twice,
    and fails here."""
    batch, names = 400, [f"a-{k:04d}" for k in range(1000)]
    read = ReplicationStream.read
    held: dict[int, list[bytes]] = {}
    due: dict[int, float] = {}

    def trickle(self: ReplicationStream, max_messages: int, wait: float) -> list[bytes]:
        backlog = held.setdefault(id(self), [])
        backlog += read(self, 100_000, 0)
        now = time.monotonic()
        if now < due.get(id(self), 0.0):
            time.sleep(min(wait, due[id(self)] - now))
            if time.monotonic() < due[id(self)]:
                return []
        due[id(self)] = time.monotonic() + 0.01
        take = min(100, max_messages)
        out, held[id(self)] = backlog[:take], backlog[take:]
        return out

    sends: list[int] = []
    send_all = Publisher.send_all

    def send(self: Publisher, targets: dict[str, Any], *args: Any, **kw: Any) -> int:
        sends.append(sum(payload.count for payload in targets.values()))
        return send_all(self, targets, *args, **kw)

    monkeypatch.setattr(ReplicationStream, "read", trickle)
    monkeypatch.setattr(Publisher, "send_all", send)
    with Streamer(wal, StreamerConfig(batch_size=batch), name="arriving") as streamer:
        if opened:
            assert streamer.drain(timeout=60) == 0  # the slot's stream is open, nothing pending
        records = [{"action": "a", "object": "o", "data": {"i": i}, "stream": n} for i in range(2) for n in names]
        with psycopg.connect(wal.conninfo) as conn:
            for lo in range(0, len(records), 100):
                emit_many(conn, records[lo : lo + 100])
                conn.commit()
        assert streamer.drain(timeout=60) == len(records)
    assert sum(sends[:PIECES]) == len(records), f"the whole backlog in the first batch: {sends}"
    _assert_each_once_in_order(rds, names, 2)


def test_a_wal_streamer_whose_piece_redis_refused_ends_its_session_when_dropped(
    wal: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A piece of a deep batch fails (here an injected crash, raised in the Redis thread) and the caller drops the
    streamer: its session must end with its last reference. The error's traceback holds the frame that waited for the
    pieces; a local there holding the pieces' futures, which hold the error, made a cycle that kept the streamer (its
    session, its stream locks) until a full garbage collection."""
    _stage(wal, NAMES, per_stream=2)
    sends: list[int] = []
    send_all = Publisher.send_all

    def send(self: Publisher, targets: dict[str, Any], *args: Any, **kw: Any) -> int:
        sends.append(len(targets))
        if len(sends) == 2:
            raise InjectedCrash("a piece's send (test)")
        return send_all(self, targets, *args, **kw)

    monkeypatch.setattr(Publisher, "send_all", send)
    with refcounting_only():
        dropped(
            lambda: Streamer(wal, StreamerConfig(batch_size=BATCH), name="dropped-wal").drain(timeout=60), InjectedCrash
        )
        assert len(sends) == 2, sends
        assert_sessions_end(pg, "unilog-dropped-wal%", "the dropped streamer's sessions")
