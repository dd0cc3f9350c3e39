"""How a table-mode streamer waits for a commit: ``LISTEN`` on the staging trigger's channel, with a poll."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import psycopg
import structlog

from .. import store
from ..errors import ServerUnreachable

log = structlog.get_logger(__name__)

CLOSE_DEADLINE = 5.0  # seconds a close waits for the server's last replies when the caller set no deadline


class CommitListener:
    """A ``LISTEN`` session of its own, opened on first use, for a streamer with nothing to publish.

    Producers notify only while a streamer sleeps (NOTIFY serializes their commits): :meth:`wait` first takes the
    wake-up lock (:func:`unilog.store.try_sleep`) and returns at once, so the caller looks once more; the next call,
    still holding it, sleeps until a producer's commit notifies, ``timeout`` passes, or ``stop_event`` is set, and
    gives the lock back without waiting for the reply (:func:`unilog.store.wake_soon`), so the caller looks at
    once. The lock is only ever tried, never waited for (a ``lock_timeout`` would write an ERROR line in the
    server's log per try). If another streamer sleeps on it, producers notify, and this session sleeps on their
    NOTIFYs as that streamer does. Otherwise a transaction that staged without notifying is still open (its commit
    will send none): the call waits ``retry`` seconds and returns so the caller looks again, and the next such wait
    is twice as long, up to ``retry_max``. :meth:`wake` gives the lock back when the caller found work without
    sleeping. Not thread-safe.

    The session keeps no notification it has no use for: a NOTIFY only says "look", so what arrives while the
    caller is busy, or before the lock is taken (the look that follows sees those commits), is read off the socket
    and dropped whenever the session is used, and a wake-up drains everything that came. Unread, they would pile
    up in psycopg's backlog (one object per commit, while another streamer sleeps and producers notify) or in the
    socket, where a full buffer stalls the server's notification queue.
    """

    def __init__(
        self,
        conninfo: str,
        application_name: str,
        retry: float = 0.005,
        retry_max: float = 0.1,
        *,
        deadline: float | None = 5.0,
    ) -> None:
        self.conninfo, self.application_name = conninfo, application_name
        self.deadline = deadline  # each call to the server (not the sleep) ends within it, answered or not
        self.retry_min, self.retry_max = retry, retry_max
        self._retry = retry
        self._conn: psycopg.Connection[Any] | None = None
        self.asleep = False  # this session holds the wake-up lock: producers notify
        self._unlocking = False  # the unlock was sent (wake_soon) and its reply is unread

    def _bounded(self, conn: psycopg.Connection[Any], closing: bool = False) -> contextlib.AbstractContextManager[None]:
        """A server that went silent (paused, blackholed) answers nothing: without a deadline the streamer's wait,
        or its shutdown, would hang on this side session for good. Closing is bounded even without one."""
        return store.deadline(conn, (self.deadline or CLOSE_DEADLINE) if closing else self.deadline)

    def wait(self, stop_event: threading.Event, timeout: float) -> None:
        try:
            if self._conn is None or self._conn.closed:
                self.asleep = self._unlocking = False
                self._conn = store.connect(self.conninfo, autocommit=True, application_name=self.application_name)
                with self._bounded(self._conn):
                    store.listen(self._conn)
                return  # notifications sent before LISTEN are lost: check once more before sleeping
            if self.asleep:
                self._notified(stop_event, timeout)
                self.asleep = False
                store.wake_soon(self._conn)  # sent, not waited for: the caller's look need not wait for it
                self._unlocking = True
                return
            self._look(stop_event, timeout)
        except (psycopg.OperationalError, ServerUnreachable) as exc:
            log.warning("listen connection lost; polling", error=str(exc))
            self.close()
            stop_event.wait(timeout)

    def _look(self, stop_event: threading.Event, timeout: float) -> None:
        assert self._conn is not None
        with self._bounded(self._conn):
            self._unlocked()
            store.discard_notifies(self._conn)  # sent before the lock: the caller's next look sees those commits
            if store.try_sleep(self._conn):
                self.asleep, self._retry = True, self.retry_min
                return
            another = store.another_sleeps(self._conn)
        if another:  # producers notify it, and this session hears them too
            self._notified(stop_event, timeout)
        else:  # a transaction that staged is open, and its commit sends no NOTIFY: look again, later next time
            self._notified(stop_event, self._retry)
            self._retry = min(self._retry * 2, self.retry_max)

    def _notified(self, stop_event: threading.Event, timeout: float) -> bool:
        """Block until another session's notification, ``timeout`` or ``stop_event``; drain what arrived.

        The session's own ``awake`` (its :func:`unilog.store.wake_soon` notifies every listener, this one too, and
        psycopg keeps it in its backlog while the session runs the next statements) is not a wake-up: taken for one,
        an idle streamer alone on its database woke itself at once after every look, about 3,600 transactions a
        second on an idle system."""
        assert self._conn is not None
        own = self._conn.info.backend_pid
        deadline = time.monotonic() + timeout
        while not stop_event.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            # the generator holds the connection's lock: leave it before draining the rest
            if any(n.pid != own for n in self._conn.notifies(timeout=min(remaining, 0.25), stop_after=1)):
                store.discard_notifies(self._conn)
                return True
        return False

    def wake(self) -> None:
        """Give the wake-up lock back if this session holds it (the caller is busy: producers need not notify), and
        drop what the session received meanwhile (called after every busy pass: a non-blocking read)."""
        self._retry = self.retry_min
        if self._conn is None or self._conn.closed:
            return
        try:
            with self._bounded(self._conn):
                self._unlocked()
                if self.asleep:
                    self.asleep = False
                    store.wake(self._conn)
                store.discard_notifies(self._conn)
        except (psycopg.OperationalError, ServerUnreachable) as exc:  # the lock went with the session
            log.warning("listen connection lost", error=str(exc))
            self.close()

    def _unlocked(self) -> None:
        """Read the reply of an unlock sent without waiting, before the session runs anything else."""
        if self._unlocking and self._conn is not None and not self._conn.closed:
            self._unlocking = False
            store.wake_done(self._conn)
        self._unlocking = False

    def close(self) -> None:
        """Close the session once the server sends it nothing more: the reply of an unlock sent without waiting is
        read, and ``UNLISTEN`` ends the notifications. A session closed while the server still wrote to it (a
        producer's NOTIFY, that reply) left ``FATAL: connection to client lost`` in the server's log: once in a CI
        run, from a streamer that turned standby just after a wake-up and closed its listener. A silent server gets
        ``deadline`` seconds: a close that waited for it hung a streamer's shutdown (and a CI run) for good."""
        if self._conn is not None and not self._conn.closed:
            # a broken session is closed all the same
            with contextlib.suppress(psycopg.Error, ServerUnreachable), self._bounded(self._conn, closing=True):
                self._unlocked()
                store.unlisten(self._conn)
            self._conn.close()
        self.asleep = self._unlocking = False
        self._conn = None
