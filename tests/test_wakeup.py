"""The commit wake-up (migration unilog_0007): producers notify only while a streamer sleeps, and a streamer never
falls asleep while a transaction that staged without notifying is still open (it would sleep through its commit)."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
import redis

from unilog import Settings, Streamer, StreamerConfig, emit, store
from unilog.harness.proxy import FaultProxy
from unilog.harness.pytest_plugin import running
from unilog.runtime import Hook
from unilog.store.connection import next_result
from unilog.stream.waiting import CommitListener


def notified(listener: psycopg.Connection[Any], timeout: float) -> int:
    return len(list(listener.notifies(timeout=timeout, stop_after=1)))


def test_producers_notify_at_commit_only_while_a_streamer_sleeps(settings: Settings) -> None:
    with psycopg.connect(settings.conninfo, autocommit=True) as listener, psycopg.connect(settings.conninfo) as conn:
        store.listen(listener)
        emit(conn, action="a", object="o", data={})
        conn.commit()
        assert notified(listener, 0.2) == 0, "no streamer sleeps: the commit must not take NOTIFY's lock"
        assert store.try_sleep(listener)
        emit(conn, action="a", object="o", data={})
        assert notified(listener, 0.2) == 0, "NOTIFY is sent at commit, not before"
        conn.commit()
        assert notified(listener, 2) == 1
        emit(conn, action="a", object="o", data={})
        conn.rollback()
        assert notified(listener, 0.2) == 0, "a rolled-back transaction wakes nobody"
        store.wake(listener)
        assert notified(listener, 2) == 1, "giving the lock back tells another streamer sleeping without it"
        emit(conn, action="a", object="o", data={})
        conn.commit()
        assert notified(listener, 0.2) == 0


def test_a_streamer_cannot_fall_asleep_while_a_transaction_that_staged_is_open(settings: Settings) -> None:
    with (
        psycopg.connect(settings.conninfo, autocommit=True) as listener,
        psycopg.connect(settings.conninfo) as producer,
        psycopg.connect(settings.conninfo) as bystander,
    ):
        bystander.execute("SELECT txid_current()")  # an open transaction that staged nothing does not count
        emit(producer, action="a", object="o", data={})
        assert not store.try_sleep(listener), "the producer's commit would come with no NOTIFY"
        producer.execute("SAVEPOINT s")
        producer.execute("SELECT 1")
        producer.execute("ROLLBACK TO SAVEPOINT s")
        assert not store.try_sleep(listener), "the staged row is still in the transaction"
        producer.commit()
        assert store.try_sleep(listener)
        store.wake(listener)
        producer.execute("SAVEPOINT s")
        emit(producer, action="a", object="o", data={})
        producer.execute("ROLLBACK TO SAVEPOINT s")  # the staged row is gone with the savepoint: so is the mark
        assert store.try_sleep(listener)
        producer.rollback()
        bystander.rollback()


def published(rds: redis.Redis, stream: str, n: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while rds.xlen(stream) < n:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_a_sleeping_streamer_is_woken_by_a_commit(settings: Settings, rds: Any) -> None:
    streamer = Streamer(settings, StreamerConfig(poll_interval=30.0))
    with psycopg.connect(settings.conninfo) as producer, running(streamer.run):
        for n in range(1, 4):
            time.sleep(0.3)  # the streamer found nothing and sleeps
            emit(producer, action="a", object="o", data={"n": n})
            producer.commit()
            assert published(rds, settings.stream, n, 10), "a commit while the streamer slept waited for the poll"
    streamer.close()


def test_a_commit_racing_the_streamer_falling_asleep_is_published_at_once(settings: Settings, rds: Any) -> None:
    """The producer stages while the streamer is awake (no NOTIFY then) and commits after the streamer's last look:
    without the mark its commit would wait for the 30-second poll."""
    streamer = Streamer(settings, StreamerConfig(poll_interval=30.0))
    with psycopg.connect(settings.conninfo) as producer:
        emit(producer, action="a", object="o", data={"n": 1})
        with running(streamer.run):
            time.sleep(0.5)  # the streamer looked, found nothing committed, and tries to fall asleep meanwhile
            producer.commit()
            assert published(rds, settings.stream, 1, 10), "the streamer slept through a commit that sent no NOTIFY"
    streamer.close()


def test_two_idle_streamers_both_publish_a_commit_on_their_streams_at_once(settings: Settings, rds: Any) -> None:
    """Only one streamer can hold the wake-up lock; the other looks every 100 ms at most and hears its NOTIFYs."""
    first = Streamer(settings, StreamerConfig(poll_interval=30.0, streams=("s1",)), name="first")
    second = Streamer(settings, StreamerConfig(poll_interval=30.0, streams=("s2",)), name="second")
    with psycopg.connect(settings.conninfo) as producer, running(first.run), running(second.run):
        for n in range(1, 4):
            time.sleep(0.3)  # both idle
            for stream in ("s1", "s2"):
                emit(producer, action="a", object="o", data={}, stream=stream)
                producer.commit()
                assert published(rds, stream, n, 10), f"{stream}: a commit waited for the 30-second poll"
    first.close()
    second.close()


class Passes(Hook):
    def __init__(self) -> None:
        self.count = 0

    def on_pass_end(self, worker: Any, result: Any) -> None:
        self.count += 1


def test_an_idle_streamer_alone_is_not_woken_by_its_own_wake_up(settings: Settings, rds: Any) -> None:
    """Giving the wake-up lock back notifies every listener, the streamer's own session too. An idle streamer alone
    on its database took its own ``awake`` for a producer's commit, looked at once, slept, and woke again: about
    3,600 transactions a second on an idle system, a core's worth of work. Idle, it must look about twice per poll
    (after each sleep, and once more before the next), also after a commit woke it."""
    streamer = Streamer(settings, StreamerConfig(poll_interval=0.5))
    passes = streamer.hooks.add(Passes())
    with psycopg.connect(settings.conninfo) as producer, running(streamer.run):
        time.sleep(0.5)
        emit(producer, action="a", object="o", data={})
        producer.commit()
        assert published(rds, settings.stream, 1, 10)
        before = passes.count
        time.sleep(2.5)  # five polls
        idle_passes = passes.count - before
    streamer.close()
    assert 2 <= idle_passes <= 30, f"{idle_passes} passes in 2.5 s idle with a 0.5 s poll"


@pytest.mark.parametrize("unlock_pending", [True, False], ids=["unlock-reply-unread", "asleep"])
def test_closing_the_listen_session_of_a_silent_server_returns_at_once(
    settings: Settings, unlock_pending: bool
) -> None:
    """Closing reads the reply of an unlock sent without waiting and ends the subscriptions first, so the server
    writes nothing to a closed socket; but a server that went silent (paused, behind a blackholing proxy) answers
    neither: a close that waited for it hung a streamer's shutdown, and a CI run with it, for good."""
    port = int(settings.database_url.rsplit(":", 1)[1].split("/")[0])
    with FaultProxy("127.0.0.1", port) as proxy:
        listener = CommitListener(proxy.url_for(settings.conninfo), "test-listener", deadline=1.0)
        stop = threading.Event()
        listener.wait(stop, 0.05)  # connects and listens
        listener.wait(stop, 0.05)  # takes the wake-up lock: asleep
        assert listener.asleep
        if unlock_pending:
            listener.wait(stop, 0.05)  # sleeps, then sends the unlock without reading its reply
            assert not listener.asleep
        proxy.blackhole()
        closing = threading.Thread(target=listener.close, daemon=True)
        started = time.monotonic()
        closing.start()
        closing.join(10)
        hung = closing.is_alive()
        proxy.reset()  # lets a hung close end, so the test does not leave it behind
        closing.join(10)
    assert not hung, "close() waited for a silent server"
    assert time.monotonic() - started < 4


def test_a_reply_awaited_in_python_waits_for_its_query_to_be_sent_whole(settings: Settings) -> None:
    """``store.next_result`` waits for a reply without holding the GIL. A query larger than the socket takes at once
    stays partly in libpq's buffer on a nonblocking connection; waiting for the reply alone would wait for good (the
    server waits for the rest of the query), so the rest is sent while waiting."""
    with psycopg.connect(settings.conninfo) as conn:
        conn.pgconn.nonblocking = 1  # as psycopg's own connection waits do: the send returns with output left
        for size in (16 << 20, 64 << 20, 128 << 20):  # a server that read 16 MB at once (a busy run): a larger one
            conn.pgconn.send_query(b"SELECT length('" + b"x" * size + b"')")
            if conn.pgconn.flush() == 1:
                break  # part of the query is still to send
            with store.deadline(conn, 30):
                while next_result(conn.pgconn) is not None:
                    pass
        else:
            pytest.fail("every query was sent whole at once: this test would prove nothing")
        with store.deadline(conn, 30):
            result = next_result(conn.pgconn)
        assert result is not None and result.get_value(0, 0) == str(size).encode()
        assert next_result(conn.pgconn) is None
