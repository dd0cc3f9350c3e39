"""A second Postgres session that reads a share's batch while the streamer's own session claims the share before it.

Over many sources, a pass's first two claims (one per share, :mod:`unilog.stream.capture_spread`) were the longest
wait of a drain: the second could not start before the first ended, one session doing both, while the server had a
core to spare. The side session reads the second share's batch (:func:`unilog.store.read_across`) at the same time,
in a thread of its own; the streamer's session then saves it (:func:`unilog.store.save_read`), in a few
milliseconds, where it claimed it before.

Guarantees:

* **The side session writes nothing.** It holds no lock and saves no claim: the owner of the sources (the
  streamer's own session, holding their buckets) saves what it read, and nothing but the owner deletes their rows,
  so the ids it read are still the rows it read. What it read is no different from a claim taken at its snapshot:
  rows committed later are left to a later claim, as any claim leaves them.
* **It only ever speeds a pass up.** A read that fails (the session broken, the server gone, its deadline passed,
  any error) is logged in one line and the share is claimed in the streamer's own session, as without it; the
  session is opened again for a later pass. A session the server ended while it sat idle between passes (a
  restart) is opened again at once, without a line. Every wait on it is bounded by the deadline: the read's (the
  session's set-up included), and the streamer's wait for the read's result.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any

import psycopg
import structlog

from .. import store

log = structlog.get_logger(__name__)


class SideReads:
    """The side session and its thread, made on first use. ``connect`` opens a session (of the streamer's
    database); ``timeout`` is a read's deadline, ``wait`` how long the streamer waits for a read's result (less: its
    own pass has a deadline too). Not thread-safe: one pass at a time submits reads."""

    def __init__(
        self, connect: Callable[[], psycopg.Connection[Any]], timeout: float | None, name: str, wait: float | None
    ) -> None:
        self._connect, self.timeout, self.name, self.wait = connect, timeout, name, wait
        self._conn: psycopg.Connection[Any] | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def submit(
        self, sources: list[str], limit: int, before: str | None, per_source: int
    ) -> concurrent.futures.Future[store.Read | None]:
        """Read ``sources``' batch (as :func:`unilog.store.read_across` takes them) in the side thread; the future
        gives None if the read failed."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=self.name)
        return self._pool.submit(self._read, sources, limit, before, per_source)

    def result(self, future: concurrent.futures.Future[store.Read | None]) -> store.Read | None:
        """What ``future`` read, waiting ``wait`` seconds at most (None: it failed, or it is still reading: the read
        goes on, to its deadline, and is dropped)."""
        try:
            return future.result(self.wait)
        except concurrent.futures.TimeoutError:
            log.warning("a share's batch is still being read in the side session: it is claimed in the streamer's own")
            return None

    def _read(self, sources: list[str], limit: int, before: str | None, per_source: int) -> store.Read | None:
        # any error: a read only ever saves a claim, which the streamer's own session takes as well without it
        reopened = False
        while True:
            new = False
            try:
                conn, new = self._session()
                with store.deadline(conn, self.timeout):
                    if new:
                        store.tune_streamer_session(conn)
                    read = store.read_across(conn, sources, limit, before, per_source)
                    conn.rollback()  # read only: ends the snapshot
                return read
            except Exception as exc:
                self._close_session()
                # a session the server ended while it sat idle (a restart, an operator): opened again at once, with
                # no line (the streamer's own session says what happened to the server); a deadline is not retried
                if isinstance(exc, psycopg.OperationalError) and not new and not reopened:
                    reopened = True
                    continue
                log.warning(
                    "a share's batch could not be read in the side session: it is claimed in the streamer's own",
                    error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}",
                )
                return None

    def _session(self) -> tuple[psycopg.Connection[Any], bool]:
        """The side session, and whether it is new (opened now: the connection attempt is bounded by its connect
        timeout, the set-up by the read's deadline)."""
        if self._conn is not None and not self._conn.closed:
            return self._conn, False
        self._conn = self._connect()
        return self._conn, True

    def _close_session(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            conn.close()

    def close(self) -> None:
        """Wait for a read in flight, then close the thread and the session."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._close_session()
