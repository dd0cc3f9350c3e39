"""The streamer: moves committed staged records from Postgres into Redis Streams, in batches.

Guarantees:

* **Nothing committed is skipped.** Records are read only below the transaction-visibility horizon, in (xid, id)
  order (see :func:`unilog.store.fetch_visible`), so a transaction that commits late is published after, never
  lost behind, records already streamed.
* **Nothing is deleted before Redis confirmed it.** A batch is deleted after Redis confirmed it, as exactly the rows
  fetched (the (xid, id) range they span, which no other row can enter: see :func:`unilog.store.delete_published`),
  in the transaction that also advances the stream's position. A crash anywhere before that commit leaves the
  records staged; they are re-sent with the *same* positions, which consumers deduplicate.
* **Dense, monotone positions.** Each stream's records carry ``seq`` numbers 1, 2, 3, ... per (producer, epoch),
  assigned in (xid, id) order; a re-send after a crash assigns the same numbers to the same records.
* **One publisher per stream.** A session-level advisory lock makes one streamer the publisher of a stream; others
  stand by and take over when its session dies.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
import structlog

from . import engine, metrics, retention, routing, sending, store, tracing
from .config import Settings, validate_stream_name
from .errors import ConfigurationError, PublishError, UnilogError
from .faults import NO_FAULTS, Faults
from .routing import partition_stream
from .runtime import TRANSIENT, Links, Worker
from .waiting import CommitListener, HorizonWatch

if TYPE_CHECKING:
    from .capture import WalCapture

log = structlog.get_logger(__name__)

# a pass that fails this way is retried; it deleted nothing
RETRYABLE: tuple[type[BaseException], ...] = (*TRANSIENT, PublishError)
PARTITION_RECHECK = 10.0  # seconds between looks at an unpartitioned stream's settings


@dataclass(frozen=True)
class StreamerConfig:
    """How the streamer batches and waits.

    ``streams`` limits the streamer to these target streams (None: every stream that has staged records; records
    staged without a stream go to ``Settings.stream``). ``poll_interval`` is the longest sleep between checks when
    no notification arrives; while committed records wait behind an older open transaction the streamer re-checks
    after ``horizon_poll`` seconds, doubling up to ``horizon_poll_max`` (that transaction's end sends no NOTIFY).
    A backlog drains up to ``pipeline_batches`` batches per pass, Redis appending one batch while Postgres deletes
    the one before and fetches the one after. A batch is one script call in Redis, which serves no other client
    while it runs (about 5 us per record measured here: 25 ms for the default 5000); smaller batches trade drain
    rate (see bench/RESULTS.md) for shorter pauses. When committed records have waited ``horizon_warn_after``
    seconds behind an open transaction, a warning names the session that holds them, every
    ``horizon_warn_interval`` seconds while it lasts (burst mode warns after 5 s).
    """

    batch_size: int = 5000
    pipeline_batches: int = 8
    poll_interval: float = 1.0
    horizon_poll: float = 0.005
    horizon_poll_max: float = 0.1
    streams: tuple[str, ...] | None = None
    max_backoff: float = 10.0
    restart_after_crash: bool = True
    retention_interval: float = 5.0
    max_len: int | None = None
    wait_replicas: int = 0
    wait_timeout_ms: int = 1000
    redis_timeout: float = 10.0
    pg_timeout: float | None = 30.0
    horizon_warn_after: float = 30.0  # records held this long behind an open transaction: warn, naming it
    horizon_warn_interval: float = 60.0  # and again at most this often while it lasts

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if self.pipeline_batches < 1:
            raise ValueError("pipeline_batches must be at least 1")
        for s in self.streams or ():
            validate_stream_name(s)


@dataclass(frozen=True)
class BatchResult:
    """What one pass did: records published, whether committed records are still waiting behind the horizon, and
    whether a stream with staged records is held by another streamer's lock."""

    published: int = 0
    waiting: bool = False
    blocked: bool = False


@dataclass(frozen=True)
class _Batch:
    """The staged rows of one source in the (xid, id) range (``after``, ``last``], packed per target stream."""

    count: int
    after: tuple[str, int]
    last: tuple[str, int]
    targets: dict[str, engine.Packed]
    first_created_ms: int | None = None  # for the publish latency metric
    traceparents: tuple[str, ...] = ()  # the records' trace contexts, for the publish span's links


@dataclass(frozen=True)
class _Sent:
    """A batch Redis confirmed and Postgres has not deleted yet."""

    source: str
    stream: str
    batch: _Batch
    last_seqs: dict[str, int]
    appended: int
    started: float


class Streamer(Worker):
    """Drains ``staged_log_records`` into Redis Streams. Not thread-safe: one thread drives one streamer (which
    uses one helper thread of its own for Redis while a large backlog drains)."""

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
        self.faults = faults
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
        poll = (self.config.horizon_poll, self.config.horizon_poll_max)  # also while it may not sleep yet
        self._listener = CommitListener(settings.conninfo, f"unilog-{name}-listen", *poll)
        self._owned: set[str] = set()
        self._standby = False  # found a stream held by another streamer: looks for its lock, not for commits
        self._identity: store.ProducerIdentity | None = None
        self._last_seq: dict[str, int] = {}  # valid while we hold the stream's lock and our commits succeed
        self._after: dict[str, tuple[str, int]] = {}  # (xid, id) last published per source: same validity
        self._last_retention = 0.0
        self._partition_counts: dict[str, tuple[int, float]] = {}
        self._helper: concurrent.futures.ThreadPoolExecutor | None = None  # Redis, while a backlog drains
        self._packed_fetch = False  # whether Postgres can encode batches for Redis (a UTF8 database)
        self._horizon_delay = self.config.horizon_poll  # between looks while records wait behind the horizon
        self._horizon = HorizonWatch(name, self.config.horizon_warn_interval)
        self._wal: WalCapture | None = None  # the database is in WAL capture mode (unilog.capture)
        self._mode_known = False  # the capture mode is read once per Postgres session
        self.published_total = 0

    kind = "streamer"
    retryable = RETRYABLE

    @property
    def label(self) -> dict[str, Any]:
        return {"streamer": self.name}

    def totals(self) -> dict[str, Any]:
        return {"published": self.published_total}

    # -- connections -------------------------------------------------------------------------------------------------

    def _conn(self) -> psycopg.Connection[Any]:
        return self.links.pg()

    def _engine(self) -> engine.RedisStreams:
        return self.links.redis()

    def _on_pg_connect(self, conn: psycopg.Connection[Any]) -> None:
        """A new Postgres session: locks died with the old one; a restored database starts a new epoch."""
        self._release_owned()
        self._last_seq.clear()
        self._after.clear()
        self._packed_fetch = store.packed_fetch_supported(conn)
        self._mode_known = False
        self._identity, new_epoch = store.resolve_identity(conn)
        if new_epoch:
            log.warning(
                "database was restored or copied: new producer epoch",
                producer=self._identity.producer_id,
                epoch=self._identity.epoch,
            )

    def connect(self) -> None:
        """Connect to both servers now and check the schema; raises a one-line-worthy error if either fails."""
        self._conn()
        self._engine()

    def close(self) -> None:
        """Close connections (releasing this streamer's stream locks) and the helper thread."""
        if self._helper is not None:
            self._helper.shutdown(wait=True)  # idle here: a pass waits for its sends before it returns or raises
            self._helper = None
        super().close()
        if self._wal is not None:
            self._wal.close()
        self._listener.close()
        self._release_owned()

    def _release_owned(self) -> None:
        """Forget the streams whose lock this session held (a closed or new session holds none)."""
        for stream in self._owned:
            metrics.STREAM_LOCK.labels(stream).set(0)
        self._owned.clear()

    # -- one pass ----------------------------------------------------------------------------------------------------

    def run_once(self) -> BatchResult:
        """Publish at most one batch per owned source; return what was done.

        Raises on connection failures (the caller backs off and retries); the staged records stay until a later
        pass has published them.
        """
        conn = self._conn()
        with store.deadline(conn, self.config.pg_timeout):
            self._retention()
            wal = self._capture_mode(conn)
            return wal.run_once(conn) if wal is not None else self.table_pass(conn)

    def table_pass(self, conn: psycopg.Connection[Any]) -> BatchResult:
        """Table mode's pass: at most one batch per owned source, read below the visibility horizon."""
        published, waiting, blocked = 0, False, False
        for source in self._sources(conn):
            stream = source or self.settings.stream
            if not self.owns(conn, stream):
                blocked = True  # another session publishes it (or is about to release it)
                continue
            n = self._publish_batch(conn, source, stream)
            published += n
            if n == 0:
                waiting = waiting or store.has_staged(conn, source)
                conn.commit()
        return BatchResult(published, waiting, blocked)

    def _capture_mode(self, conn: psycopg.Connection[Any]) -> WalCapture | None:
        """The WAL pass if the database is in WAL capture mode, else None: read when a Postgres session opens
        (`unilog capture wal|table` switch only while no streamer runs, see :mod:`unilog.capture`)."""
        if self._mode_known:
            return self._wal
        self._mode_known = True
        slot = store.capture_slot(conn)
        conn.commit()
        if slot == (self._wal.slot if self._wal is not None else None):
            return self._wal
        if self._wal is not None:
            self._wal.close()
        self._after.clear()  # rows the WAL passes left may sort before the old table-mode cursor
        from .capture import WalCapture  # imported on use: table-mode streamers never load the WAL reader

        self._wal = WalCapture(self, slot) if slot is not None else None
        if self._wal is not None:
            self._listener.close()  # the slot's stream wakes a WAL-mode streamer
        log.info("capture mode", mode="wal" if slot else "table", streamer=self.name)
        return self._wal

    def drain(self, timeout: float | None = None, *, max_wait: float | None = None) -> int:
        """Publish batches until nothing staged is left for this streamer (burst mode); return records published.

        Records that are committed but still behind an older open transaction are waited for, and so are streams
        whose lock another streamer holds (until it published them or let go), so everything committed before
        ``drain`` was called has been published when it returns. While records wait behind a transaction, a
        warning names it every few seconds; after ``max_wait`` seconds without progress :class:`HorizonHeld` is
        raised, naming it. Raises :class:`UnilogError` after ``timeout`` seconds if the drain is not done.
        """
        self.connect()
        deadline = None if timeout is None else time.monotonic() + timeout
        total, delay = 0, self.config.horizon_poll
        self._horizon.clear()
        while True:
            result = self.run_once()
            total += result.published
            if result.published:
                delay = self.config.horizon_poll
                self._horizon.clear()
                continue
            if not result.waiting and not (result.blocked and self._staged_elsewhere()):
                return total
            if result.waiting:
                self._horizon.check(
                    self._held_report, warn_after=min(5.0, self.config.horizon_warn_after), limit=max_wait
                )
            if deadline is not None and time.monotonic() > deadline:
                raise UnilogError(
                    f"drain timed out after {timeout}s with committed records still staged "
                    f"({'behind an open transaction' if result.waiting else 'on a stream another streamer holds'})"
                )
            time.sleep(delay)
            delay = min(delay * 2, self.config.horizon_poll_max)

    def _held_report(self) -> tuple[int, dict[str, Any] | None]:
        """(records of this streamer's streams that are committed but not publishable yet, the session holding
        them back); ends its read-only transaction, so the streamer holds nothing itself meanwhile."""
        conn = self._conn()
        sources = [s for s in self._sources(conn) if (s or self.settings.stream) in self._owned]
        count, holder = store.held_back(conn, sources), store.horizon_holder(conn)
        conn.commit()
        return count, holder

    def _staged_elsewhere(self) -> bool:
        """Whether committed records are staged on a stream this streamer does not hold."""
        conn = self._conn()
        streams = [s for s in self._sources(conn) if (s or self.settings.stream) not in self._owned]
        found = any(store.has_staged(conn, s) for s in streams)
        conn.commit()
        return found

    def _retention(self) -> None:
        now = time.monotonic()
        if now - self._last_retention < self.config.retention_interval:
            return
        self._last_retention = now
        for stream in sorted(self._owned):
            count = self.partitions(stream)
            for target in [stream] if count <= 1 else [partition_stream(stream, i) for i in range(count)]:
                self.trim(target)

    def trim(self, stream: str) -> int:
        """Trim ``stream`` behind its consumers and groups (and to the hard cap, if set); return entries removed
        (see :func:`unilog.retention.trim`)."""
        return retention.trim(self._engine(), stream, self.config.max_len)

    def _sources(self, conn: psycopg.Connection[Any]) -> Iterable[str]:
        sources = store.staged_sources(conn)
        conn.commit()
        wanted = self.config.streams
        if wanted is None:
            return sources
        return [s for s in sources if (s or self.settings.stream) in wanted]

    def owns(self, conn: psycopg.Connection[Any], stream: str) -> bool:
        """Whether this streamer publishes ``stream`` (its lock taken now if free)."""
        if stream in self._owned:
            return True
        got = store.try_stream_lock(conn, stream)
        conn.commit()
        if got and (old := self._engine().legacy_keys(stream)):
            raise ConfigurationError(  # retention must see every registration: none may hide under an old name
                f"stream {stream!r} has Redis keys in the layout before hash tags ({', '.join(old[:3])}): stop "
                f"its consumers and run `unilog stream relayout {stream}` (README, Redis keys)"
            )
        self._standby = not got
        if got:
            self._owned.add(stream)
            metrics.STREAM_LOCK.labels(stream).set(1)
            log.info("stream lock acquired", stream=stream, streamer=self.name)
        return got

    def _publish_batch(self, conn: psycopg.Connection[Any], source: str, stream: str) -> int:
        """Publish up to ``pipeline_batches`` batches of ``source`` back to back; return the records published.

        While Redis appends batch *i* (in a helper thread), this thread deletes batch *i-1*, which Redis already
        confirmed, and fetches batch *i+1*. Positions of batch *i* follow those of *i-1* before *i-1*'s delete
        commits; that is safe because they are fixed by the (xid, id) order: if the delete fails, every batch not
        deleted is re-sent later with the same positions, and the broker drops the ones it already has. Every
        batch published in a pass is deleted (or the pass raises) before it returns.
        """
        partitions = self.partitions(stream)  # here: the helper thread must be the only user of the Redis client
        batch = self._fetch(conn, source, stream, partitions, self._after.get(source, store.START))
        if batch is None:
            return 0
        identity = self._identity
        assert identity is not None
        epoch = identity.epoch
        self._engine()  # connect (and check) here, not in the helper thread
        planned: dict[str, int] = {}  # target -> last position assigned in this pass
        sent: _Sent | None = None
        published = 0
        try:
            for _ in range(self.config.pipeline_batches):
                started = time.perf_counter()
                targets = batch.targets
                first = {t: planned[t] + 1 if t in planned else self.next_seq(conn, t, epoch) for t in targets}
                last = {t: first[t] + payload.count - 1 for t, payload in targets.items()}
                planned.update(last)
                ahead: _Batch | None = None
                if sent is None and batch.count < self.config.batch_size:  # nothing to overlap: no thread hop
                    appended = self.send_all(targets, identity, first)
                else:
                    appended, ahead, done = self._overlapped(
                        conn, source, stream, partitions, batch, identity, first, sent
                    )
                    published += done
                self.faults.crash("streamer.crash_after_publish")
                sent = _Sent(source, stream, batch, last, appended, started)
                if ahead is None:
                    break
                batch = ahead
            assert sent is not None
            published += self._delete_sent(conn, sent)
        except BaseException:
            self.forget_positions()
            raise
        return published

    def _fetch(
        self, conn: psycopg.Connection[Any], source: str, stream: str, partitions: int, after: tuple[str, int]
    ) -> _Batch | None:
        """The next batch of ``source`` after ``after``, or None. An unpartitioned stream's batch comes from Postgres
        already encoded for Redis; a partitioned one is read as rows and split by key here."""
        limit = self.config.batch_size
        if partitions <= 1 and self._packed_fetch:
            count, body, last, parents = store.fetch_packed(conn, source, limit, after)
            if not count:
                return None
            packed = engine.Packed(count, body, 7 if parents else 5)
            return _Batch(count, after, last, {stream: packed}, engine.first_created_ms(body), tuple(parents))
        rows, last = store.fetch_visible(conn, source, limit, after)
        if not rows:
            return None
        traced = tuple(row[6] for row in rows if row[6])
        return _Batch(len(rows), after, last, routing.split(stream, partitions, rows), rows[0][5], traced)

    def _overlapped(
        self,
        conn: psycopg.Connection[Any],
        source: str,
        stream: str,
        partitions: int,
        batch: _Batch,
        identity: store.ProducerIdentity,
        first: dict[str, int],
        sent: _Sent | None,
    ) -> tuple[int, _Batch | None, int]:
        """Send ``batch`` in the helper thread while deleting the previous one and fetching the next here; return
        (entries appended, the next batch, records deleted). Waits for the send whatever happens here, so the Redis
        client is never used by two threads."""
        if self._helper is None:
            self._helper = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"unilog-{self.name}-redis")
        future = self._helper.submit(self.send_all, batch.targets, identity, first)
        try:
            deleted = self._delete_sent(conn, sent) if sent is not None else 0
            ahead = self._fetch(conn, source, stream, partitions, batch.last)
        except BaseException:
            concurrent.futures.wait([future])
            raise
        return future.result(), ahead, deleted

    def send_all(
        self, targets: dict[str, engine.Packed], identity: store.ProducerIdentity, first: dict[str, int]
    ) -> int:
        appended = 0
        for target, payload in targets.items():
            appended += self._send(target, identity, first[target], payload, dedupe=True).appended
            if self.faults.fires("streamer.double_send"):
                self._send(target, identity, first[target], payload, dedupe=False)
        return appended

    def _delete_sent(self, conn: psycopg.Connection[Any], sent: _Sent) -> int:
        """Delete a batch Redis confirmed and advance its streams' positions, in one commit."""
        identity = self._identity
        assert identity is not None
        for target in sent.last_seqs:
            self._last_seq.pop(target, None)  # re-read from Postgres unless this commit succeeds
        batch = sent.batch
        deleted = store.delete_published(
            conn, sent.source, batch.after, batch.last, batch.count, identity.epoch, sent.last_seqs
        )
        if deleted != batch.count:
            conn.rollback()
            raise PublishError(  # retried: the records are re-sent and deduplicated by position
                f"deleted {deleted} of {batch.count} published records on {sent.stream}: another streamer is "
                "publishing the same stream without the lock; the records will be re-sent and deduplicated by position"
            )
        conn.commit()
        self._last_seq.update(sent.last_seqs)
        self._after[sent.source] = batch.last
        self.published_total += batch.count
        metrics.batch_published(sent.stream, batch.count, time.perf_counter() - sent.started, batch.first_created_ms)
        if tracing.ENABLED:
            ended = time.time_ns()
            began = ended - int((time.perf_counter() - sent.started) * 1e9)
            tracing.record_publish(sent.stream, batch.count, batch.traceparents, began, ended)
        log.info(
            "batch streamed",
            stream=sent.stream,
            records=batch.count,
            appended=sent.appended,
            targets=len(sent.last_seqs),
            last_seq=sent.last_seqs.get(sent.stream),
            ms=round((time.perf_counter() - sent.started) * 1000, 2),
        )
        return batch.count

    def identity(self) -> store.ProducerIdentity:
        """This database's producer identity, as resolved when the Postgres session opened."""
        assert self._identity is not None, "connect first"
        return self._identity

    def forget_positions(self) -> None:
        """Positions past the last commit are read from Postgres again (a pass failed after assigning some)."""
        self._last_seq.clear()

    def remember_positions(self, last_seqs: dict[str, int]) -> None:
        """Positions just committed with their batch's delete."""
        self._last_seq.update(last_seqs)

    def next_seq(self, conn: psycopg.Connection[Any], target: str, epoch: int) -> int:
        """The position the next record published on ``target`` gets."""
        if target not in self._last_seq:
            self._last_seq[target] = store.last_published_seq(conn, target, epoch)
        return self._last_seq[target] + 1

    def partitions(self, stream: str) -> int:
        """The stream's partition count, from Redis (``unilog stream partition``): cached for good once set (it
        cannot change), and re-read every ``PARTITION_RECHECK`` seconds while the stream is unpartitioned."""
        count, checked = self._partition_counts.get(stream, (1, -PARTITION_RECHECK))
        if count > 1 or time.monotonic() - checked < PARTITION_RECHECK:
            return count
        count = self._engine().partitions(stream)
        self._partition_counts[stream] = (count, time.monotonic())
        return count

    def _send(
        self, stream: str, identity: store.ProducerIdentity, first_seq: int, payload: engine.Packed, *, dedupe: bool
    ) -> engine.PublishResult:
        config = self.config
        return sending.send(
            self._engine(), stream, identity, first_seq, payload, dedupe, config.wait_replicas, config.wait_timeout_ms
        )

    # -- the loop ----------------------------------------------------------------------------------------------------

    def idle(self, result: BatchResult, stop_event: threading.Event) -> None:
        """Between passes of :meth:`run`: go on at once after publishing; poll with a growing delay while committed
        records wait behind an open transaction; else sleep on ``LISTEN`` so a producer's commit wakes the streamer
        within milliseconds, with a poll fallback. A standby (it holds no stream, another streamer does) polls for
        the lock instead: no commit can make it publish, and asleep it would make every producer notify."""
        if self._standby and not self._owned and self._wal is None:
            self._listener.close()  # its NOTIFYs would only pile up
            stop_event.wait(self.config.poll_interval)
            return
        if not (result.published or result.waiting or self._wal is not None):
            self._horizon_delay = self.config.horizon_poll
            self._horizon.clear()
            self._listener.wait(stop_event, self.config.poll_interval)
            return
        self._listener.wake()  # busy again: producers need not notify
        if result.published:
            self._horizon_delay = self.config.horizon_poll
            self._horizon.clear()
        elif self._wal is not None:  # the slot's stream is the wake-up: a commit arrives on it
            deadline = time.monotonic() + (self._horizon_delay if result.waiting else self.config.poll_interval)
            while not stop_event.is_set() and (remaining := deadline - time.monotonic()) > 0:
                self._wal.wait(min(remaining, 0.25))
                if self._wal.has_pending:
                    return
        elif result.waiting:
            self._horizon.check(self._held_report, warn_after=self.config.horizon_warn_after)
            stop_event.wait(self._horizon_delay)
            self._horizon_delay = min(self._horizon_delay * 2, self.config.horizon_poll_max)

    def recover(self) -> None:
        """After a failed pass: roll back or drop the Postgres session, and drop the Redis client (it reconnects)."""
        pg = self.links.pg_open
        if pg is not None and not pg.broken:
            with contextlib.suppress(psycopg.Error):
                pg.rollback()
        self.links.discard_failed_transaction()
        self.links.drop_redis()
        self._after.clear()
        if self._wal is not None:
            self._wal.reset()
