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
* **It only ever speeds a pass up.** A read that fails (the session broken, the server gone, its deadline passed)
  is logged in one line and the share is claimed in the streamer's own session, as without it; the session is
  opened again for a later pass.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any

import psycopg
import structlog

from .. import store
from ..errors import ServerUnreachable

log = structlog.get_logger(__name__)


class SideReads:
    """The side session and its thread, made on first use. ``connect`` opens a session (of the streamer's
    database); ``timeout`` is a read's deadline. Not thread-safe: one pass at a time submits reads."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], timeout: float | None, name: str) -> None:
        self._connect, self.timeout, self.name = connect, timeout, name
        self._conn: psycopg.Connection[Any] | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.reads = 0  # reads that succeeded (a pass's claim saved from one)

    def submit(
        self, sources: list[str], limit: int, before: str | None, per_source: int
    ) -> concurrent.futures.Future[store.Read | None]:
        """Read ``sources``' batch (as :func:`unilog.store.read_across` takes them) in the side thread; the future
        gives None if the read failed."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=self.name)
        return self._pool.submit(self._read, sources, limit, before, per_source)

    def _read(self, sources: list[str], limit: int, before: str | None, per_source: int) -> store.Read | None:
        try:
            conn = self._session()
            with store.deadline(conn, self.timeout):
                read = store.read_across(conn, sources, limit, before, per_source)
                conn.rollback()  # read only: ends the snapshot
        except (psycopg.Error, ServerUnreachable) as exc:
            log.warning(
                "a share's batch could not be read in the side session: it is claimed in the streamer's own",
                error=" ".join(str(exc).split())[:300],
            )
            self._close_session()
            return None
        self.reads += 1
        return read

    def _session(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            conn = self._connect()
            try:
                store.tune_streamer_session(conn)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

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
