"""The streamer: moves committed staged records from Postgres into Redis Streams, in batches.

The streamer is the process around a capture (:class:`unilog.stream.capture.Capture`), which reads and publishes the
records: it manages the connections, reads the database's capture mode when a Postgres session opens and picks the
capture (table mode, :class:`~unilog.stream.capture_table.TableCapture`; WAL mode,
:class:`~unilog.stream.capture_wal.WalCapture`: see :mod:`unilog.stream.modes`), runs retention, waits between
passes and drains.
Its :class:`~unilog.stream.publisher.Publisher`, made once and handed to each capture, holds what every capture shares.

Guarantees (each capture's module states how it keeps them):

* **Nothing committed is skipped, nothing waits for another transaction.** Table mode claims every committed row
  it has not published, in id order (commit order for records whose transactions conflict on a row), so a
  transaction that commits late is published after, never lost behind, records already streamed; WAL mode reads in
  commit order.
* **Nothing is deleted before Redis confirmed it**, in the transaction that also advances the stream's position. A
  crash anywhere before that commit leaves the records staged; they are re-sent with the *same* positions, which
  consumers deduplicate.
* **Dense, monotone positions.** Each stream's records carry ``seq`` numbers 1, 2, 3, ... per (producer, epoch); a
  re-send after a crash assigns the same numbers to the same records.
* **One publisher per stream.** A session-level advisory lock makes one streamer the publisher of a stream; others
  stand by and take over when its session dies.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog

from .. import engine, store
from ..config import Settings
from ..errors import PublishError, RedisOutOfMemory, UnilogError
from ..faults import NO_FAULTS, Faults
from ..routing import partition_stream
from ..runtime import TRANSIENT, Links, Worker
from . import retention
from .backpressure import MemoryWatch
from .capture import BatchResult, Capture
from .capture_table import TableCapture
from .capture_wal import WalCapture
from .publisher import Publisher
from .settings import StreamerConfig
from .side_reads import SideReads
from .waiting import CommitListener

log = structlog.get_logger(__name__)

# a pass that fails this way is retried; it deleted nothing
RETRYABLE: tuple[type[BaseException], ...] = (*TRANSIENT, PublishError)

# a table-mode pass starts no new source once it used this share of its deadline (pg_timeout): its calls end well
# within it, and the deadline only fires on a server that is really stuck
PASS_SHARE = 0.25
TRIM_PER_PASS = 200  # streams a pass trims at most (retention, every retention_interval)
POLL_MIN, POLL_MAX = 0.005, 0.1  # seconds between looks while records are known to be on their way (WAL mode)


@dataclass
class _Drain:
    """A drain's state between its passes: when it gives up, the back-off of its polls."""

    deadline: float | None = None
    timeout: float | None = None
    max_wait: float | None = None
    delay: float = POLL_MIN


def _side_reads(conninfo: str, name: str, pg_timeout: float | None) -> SideReads:
    """The side session of a streamer's table passes (:mod:`unilog.stream.side_reads`): a function of its settings
    alone, no reference back to the streamer (a cycle would keep a dropped streamer's sessions and locks)."""
    app, timeout = f"unilog-{name}-side"[:63], pg_timeout or None
    wait = PASS_SHARE * timeout if timeout else None  # a pass claims nothing after that share of its deadline either
    return SideReads(lambda: store.connect(conninfo, application_name=app, timeout=timeout), timeout, app, wait)


class Streamer(Worker):
    """Drains ``staged_log_records`` into Redis Streams. Not thread-safe: one thread drives one streamer (whose
    table-mode capture uses one helper thread of its own for Redis while a large backlog drains)."""

    def __init__(
        self,
        settings: Settings,
        config: StreamerConfig | None = None,
        *,
        faults: Faults = NO_FAULTS,
        name: str = "streamer",
    ) -> None:
        self.settings = settings
        self.config = config or StreamerConfig()
        self.name = name
        self.restart_after_crash = self.config.restart_after_crash
        self.max_backoff = self.config.max_backoff
        self.links = Links(
            settings,
            app_name=f"unilog-{name}",
            pg_timeout=self.config.pg_timeout,
            redis_timeout=self.config.redis_timeout,
            on_pg_connect=self._on_pg_connect,
        )
        # the captures' shared services; no capture holds a reference back to the streamer (a cycle would keep a
        # dropped streamer's sessions, its stream locks and its slot, until the garbage collector ran)
        self.publisher = Publisher(
            self.links.redis,
            name=name,
            default_stream=settings.stream,
            faults=faults,
            wait_replicas=self.config.wait_replicas,
            wait_timeout_ms=self.config.wait_timeout_ms,
        )
        self.publisher.listed = self.config.streams is not None
        self._table = TableCapture(
            self.publisher,
            batch_size=self.config.batch_size,
            pipeline_batches=self.config.pipeline_batches,
            streams=self.config.streams,
            pass_seconds=PASS_SHARE * self.config.pg_timeout if self.config.pg_timeout else None,
            side=_side_reads(settings.conninfo, name, self.config.pg_timeout) if self.config.side_session else None,
        )
        self._wal: WalCapture | None = (
            None  # while the database is in WAL capture mode (switched by unilog.stream.capture)
        )
        self._capture: Capture = self._table
        # WAL capture slots this streamer found lost and recovered from the WAL (unilog.store.Recovery): `streamer
        # --once` exits 12 after its drain if records could not be recovered
        self.losses: list[store.Recovery] = []
        self._mode_known = False  # the capture mode is read once per Postgres session
        self._stuck_pid: int | None = None  # the backend of a session whose deadline broke it, ended by the next
        retry = (self.config.wakeup_retry, self.config.wakeup_retry_max)
        self._listener = CommitListener(
            settings.conninfo, f"unilog-{name}-listen", *retry, deadline=self.config.pg_timeout or None
        )
        self._last_retention = 0.0
        self._to_trim: list[str] = []  # the streams of this retention round not trimmed yet
        self._wait_delay = POLL_MIN  # between looks while a WAL-mode pass says records are on their way
        self._drain = _Drain()
        self._memory = MemoryWatch(name, self.config.redis_memory_limit, self.config.redis_memory_interval)

    kind = "streamer"
    retryable = RETRYABLE

    @property
    def faults(self) -> Faults:
        """The fault points of this streamer's passes (may be replaced between passes)."""
        return self.publisher.faults

    @faults.setter
    def faults(self, faults: Faults) -> None:
        self.publisher.faults = faults

    @property
    def published_total(self) -> int:
        """Records published (their staged rows deleted) by this streamer so far."""
        return self.publisher.published_total

    @property
    def capture(self) -> Capture:
        """The capture this streamer's passes use: table mode's, or WAL mode's (a
        :class:`~unilog.stream.capture_wal.WalCapture`) once a pass found the database in WAL mode."""
        return self._capture

    @property
    def label(self) -> dict[str, Any]:
        return {"streamer": self.name}

    def describe(self) -> dict[str, Any]:
        """The start-up line names the streams this streamer publishes (a streamer has no one stream of its own:
        each record says its stream, ``default_stream`` when it names none)."""
        streams: Any = list(self.config.streams) if self.config.streams else "every stream with staged records"
        return {**self.links.settings.describe(), "streams": streams}

    def totals(self) -> dict[str, Any]:
        return {"published": self.published_total}

    def identity(self) -> store.ProducerIdentity:
        """This database's producer identity, as resolved when the Postgres session opened."""
        return self.publisher.identity()

    # -- connections -------------------------------------------------------------------------------------------------

    def _conn(self) -> psycopg.Connection[Any]:
        return self.links.pg()

    def _engine(self) -> engine.RedisStreams:
        return self.links.redis()

    def _on_pg_connect(self, conn: psycopg.Connection[Any]) -> None:
        """A new Postgres session: locks died with the old one, the capture mode is read again, a restored database
        starts a new epoch."""
        if self._stuck_pid is not None:
            store.end_stuck_session(conn, self._stuck_pid)
            self._stuck_pid = None
        store.tune_streamer_session(conn)
        self._table.session_opened(conn)
        self._mode_known = False
        self.publisher.session_opened(conn)

    def connect(self) -> None:
        """Connect to both servers now and check the schema; raises a one-line-worthy error if either fails."""
        self._conn()
        self._engine()

    def close(self) -> None:
        """Close connections (releasing this streamer's stream locks) and the helper thread."""
        self._table.close()  # before the connections: it waits for its sends
        super().close()
        if self._wal is not None:
            self._wal.close()
        self._listener.close()
        self.publisher.release()

    # -- one pass ----------------------------------------------------------------------------------------------------

    def run_once(self) -> BatchResult:
        """Publish at most one batch per owned source; return what was done.

        Raises on connection failures (the caller backs off and retries); the staged records stay until a later
        pass has published them.
        """
        conn = self._conn()
        pid = conn.info.backend_pid
        try:
            return self._pass(conn)
        except store.DeadlineExceeded:
            self._stuck_pid = pid  # the next session ends it: blocked, it would hold its buckets until it noticed
            raise

    def _pass(self, conn: psycopg.Connection[Any]) -> BatchResult:
        with store.deadline(conn, self.config.pg_timeout):
            self._retention()  # also while paused: trimming frees Redis's memory
            if self._memory.full(self._engine()):
                return BatchResult(paused=True)
            # a deep batch is hundreds of thousands of short-lived objects and no cycle: the cyclic collector's full
            # passes over them (60-180 ms in a 10,000-stream WAL batch) found nothing
            with engine.no_gc():
                result = self._capture_mode(conn).run_once(conn)
            # every write of a pass is committed where its step says; what is left open holds only reads (an idle
            # pass's look), which must not sit "idle in transaction" while the streamer sleeps
            conn.commit()
            return result

    def _capture_mode(self, conn: psycopg.Connection[Any]) -> Capture:
        """The capture of the database's mode: WAL mode's if the database has a capture slot, else table mode's;
        read when a Postgres session opens (`unilog capture wal|table` switch only while no streamer runs, see
        :mod:`unilog.stream.modes`)."""
        if self._mode_known:
            return self._capture
        self._mode_known = True
        slot = store.capture_slot(conn)
        conn.commit()
        if slot == (self._wal.slot if self._wal is not None else None):
            return self._capture
        if self._wal is not None:
            self._wal.close()
        self._table.reset()  # rows the WAL passes left may sort before the old table-mode cursor
        self._capture, self._wal = self._table, None
        if slot is not None:
            config = self.config
            self._capture = self._wal = WalCapture(
                self.publisher,
                slot,
                TableCapture(  # publishes the rows that may predate the slot first
                    self.publisher,
                    batch_size=config.batch_size,
                    pipeline_batches=config.pipeline_batches,
                    streams=None,
                    before=slot.from_xid,
                    pass_seconds=PASS_SHARE * config.pg_timeout if config.pg_timeout else None,
                ),
                conninfo=self.settings.conninfo,
                standbys=self.settings.standby_conninfos,
                losses=self.losses,
                batch_size=config.batch_size,
                timeout=config.pg_timeout,
                streams=config.streams,
                pipeline_batches=config.pipeline_batches,
            )
            self._listener.close()  # the slot's stream wakes a WAL-mode streamer
        log.info("capture mode", mode="wal" if slot else "table", streamer=self.name)
        return self._capture

    def drain(self, timeout: float | None = None, *, max_wait: float | None = None) -> int:
        """Publish batches until nothing staged is left for this streamer (burst mode); return records published.

        Streams whose lock another streamer holds are waited for (until it published them or let go), so everything
        committed before ``drain`` was called has been published when it returns; no other transaction is waited
        for. While Redis is too full to publish, :class:`RedisOutOfMemory` is raised after ``max_wait`` seconds.
        Raises :class:`UnilogError` after ``timeout`` seconds if the drain is not done.
        """
        self._drain = _Drain(None if timeout is None else time.monotonic() + timeout, timeout, max_wait)
        return super().drain()

    def drain_pass(self) -> tuple[int, bool]:
        """One pass of :meth:`drain`: publish a batch; when there was none, wait as the drain's state says."""
        drain = self._drain
        result = self.run_once()
        if result.published:
            drain.delay = POLL_MIN
            return result.published, False
        if result.paused:
            self._paused_too_long(drain.max_wait)
            time.sleep(self._memory.interval)
            return 0, False
        if not result.waiting and not (result.blocked and self._staged_elsewhere()):
            return 0, True
        if drain.deadline is not None and time.monotonic() > drain.deadline:
            raise UnilogError(
                f"drain timed out after {drain.timeout}s with committed records still staged "
                f"({'not yet read from the slot' if result.waiting else 'on a stream another streamer holds'})"
            )
        time.sleep(drain.delay)
        drain.delay = min(drain.delay * 2, POLL_MAX)
        return 0, False

    def _paused_too_long(self, max_wait: float | None) -> None:
        """Burst mode: raise :class:`RedisOutOfMemory` once publishing was held off ``max_wait`` seconds."""
        since = self._memory.paused_since
        if max_wait is not None and since is not None and time.monotonic() - since >= max_wait:
            raise RedisOutOfMemory(
                f"{self._memory.describe()} for {max_wait:g}s (--max-wait): nothing was published and the records stay "
                "staged in Postgres; raise maxmemory, let retention trim (unilog status: a consumer may hold it "
                "back), or raise --redis-memory-limit"
            )

    def _staged_elsewhere(self) -> bool:
        """Whether committed records are staged on a stream this streamer does not hold."""
        conn = self._conn()
        owned = self.publisher.owned
        streams = [s for s in self._table.sources(conn) if self.publisher.stream_of(s) not in owned]
        found = any(store.has_staged(conn, s) for s in streams)
        conn.commit()
        return found

    def _retention(self) -> None:
        """Trim the owned streams every ``retention_interval``, at most :data:`TRIM_PER_PASS` of them a pass (a few
        round trips each): a round over ten thousand streams is spread over passes, each within its deadline."""
        if not self._to_trim:
            now = time.monotonic()
            if now - self._last_retention < self.config.retention_interval:
                return
            self._last_retention = now
            self._to_trim = sorted(self.publisher.owned)
        streams, self._to_trim = self._to_trim[:TRIM_PER_PASS], self._to_trim[TRIM_PER_PASS:]
        counts = self.publisher.partitions_of(s for s in streams if s in self.publisher.owned)
        for stream, count in counts.items():
            for target in [stream] if count <= 1 else [partition_stream(stream, i) for i in range(count)]:
                self.trim(target)

    def trim(self, stream: str) -> int:
        """Trim ``stream`` behind its consumers and groups (and to the hard cap, if set); return entries removed
        (see :func:`unilog.stream.retention.trim`)."""
        return retention.trim(self._engine(), stream, self.config.max_len)

    # -- the loop ----------------------------------------------------------------------------------------------------

    def idle(self, result: BatchResult, stop_event: threading.Event) -> None:
        """Between passes of :meth:`run`: go on at once after publishing; else sleep on ``LISTEN`` so a producer's
        commit wakes the streamer within milliseconds, with a poll fallback (a capture that wakes itself, WAL
        mode's, sleeps on its own stream instead). A standby (it holds no stream, another streamer does) polls for
        the lock instead: no commit can make it publish, and asleep it would make every producer notify."""
        capture = self._capture
        if result.paused:  # Redis is nearly full: look again once its memory was read again
            self._listener.wake()
            stop_event.wait(self._memory.interval)
            return
        if self.publisher.standby and not self.publisher.owned and not capture.wakes_itself:
            self._listener.close()  # its NOTIFYs would only pile up
            stop_event.wait(self.config.poll_interval)
            return
        if not (result.published or result.waiting or capture.wakes_itself):
            self._wait_delay = POLL_MIN
            self._listener.wait(stop_event, self.config.poll_interval)
            return
        self._listener.wake()  # busy again: producers need not notify
        if result.published:
            self._wait_delay = POLL_MIN
        elif capture.wakes_itself:  # a commit arrives on the capture's own stream
            deadline = time.monotonic() + (self._wait_delay if result.waiting else self.config.poll_interval)
            while not stop_event.is_set() and (remaining := deadline - time.monotonic()) > 0:
                if capture.wait(min(remaining, 0.25)):
                    return
        elif result.waiting:
            stop_event.wait(self._wait_delay)
            self._wait_delay = min(self._wait_delay * 2, POLL_MAX)

    def recover(self) -> None:
        """After a failed pass: roll back or drop the Postgres session, and drop the Redis client (it reconnects);
        the capture mode is read again (a slot lost at no cost was just replaced: its new ``from_xid`` makes a new
        WAL capture, which publishes the rows staged before it first)."""
        self._mode_known = False
        pg = self.links.pg_open
        if pg is not None and not pg.broken:
            with contextlib.suppress(psycopg.Error):
                pg.rollback()
        self.links.discard_failed_transaction()
        self.links.drop_redis()
        self._capture.reset()
