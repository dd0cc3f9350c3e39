"""Table mode, the streamer's default capture: staged rows read below the transaction-visibility horizon, in
(xid, id) order, published, then deleted.

Guarantees (with :class:`unilog.stream.publisher.Publisher`, which holds the stream locks and positions):

* **Nothing committed is skipped.** Records are read only below the transaction-visibility horizon, in (xid, id)
  order (see :func:`unilog.store.fetch_visible`), so a transaction that commits late is published after, never
  lost behind, records already streamed.
* **Nothing is deleted before Redis confirmed it.** A batch is deleted after Redis confirmed it, as exactly the rows
  fetched (the (xid, id) range they span, which no other row can enter: see :func:`unilog.store.delete_published`),
  in the transaction that also advances the stream's position. A crash anywhere before that commit leaves the
  records staged; they are re-sent with the *same* positions, which consumers deduplicate.
* **Dense, monotone positions.** Each stream's records carry ``seq`` numbers 1, 2, 3, ... per (producer, epoch),
  assigned in (xid, id) order; a re-send after a crash assigns the same numbers to the same records.
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog

from .. import engine, routing, store, tracing
from ..errors import PublishError
from .publisher import BatchResult, Publisher

log = structlog.get_logger(__name__)


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


class TableCapture:
    """Table mode's passes for one streamer (a :class:`~unilog.stream.publisher.Capture`): at most one batch per owned
    source per pass, up to ``pipeline_batches`` of them back to back on a backlog. ``streams`` limits it to these
    target streams (None: every stream with staged records). Not thread-safe: it uses one helper thread of its own
    for Redis while a large backlog drains."""

    wakes_itself = False  # the streamer's LISTEN (and its horizon polls) wake it

    def __init__(
        self, publisher: Publisher, *, batch_size: int, pipeline_batches: int, streams: tuple[str, ...] | None
    ) -> None:
        self.publisher = publisher
        self.batch_size, self.pipeline_batches, self.streams = batch_size, pipeline_batches, streams
        self._after: dict[str, tuple[str, int]] = {}  # (xid, id) last published per source: valid like positions
        self._helper: concurrent.futures.ThreadPoolExecutor | None = None  # Redis, while a backlog drains
        self._packed_fetch = False  # whether Postgres can encode batches for Redis (a UTF8 database)

    def session_opened(self, conn: psycopg.Connection[Any]) -> None:
        """A new Postgres session: the cursor starts again; whether Postgres can encode batches (UTF8)."""
        self._after.clear()
        self._packed_fetch = store.packed_fetch_supported(conn)

    def sources(self, conn: psycopg.Connection[Any]) -> list[str]:
        """The sources (``stream`` column values) with staged rows that this streamer publishes. The transaction it
        begins is not committed here: the pass's fetch follows in it (READ COMMITTED: each statement sees the
        commits before it), one round trip less between a producer's commit and its XADD."""
        sources = store.staged_sources(conn)
        if self.streams is None:
            return sources
        return [s for s in sources if self.publisher.stream_of(s) in self.streams]

    def run_once(self, conn: psycopg.Connection[Any]) -> BatchResult:
        """At most one batch per owned source, read below the visibility horizon."""
        published, waiting, blocked = 0, False, False
        for source in self.sources(conn):
            stream = self.publisher.stream_of(source)
            if not self.publisher.owns(conn, stream):
                blocked = True  # another session publishes it (or is about to release it)
                continue
            n = self._publish_batch(conn, source, stream)
            published += n
            if n == 0:
                waiting = waiting or store.has_staged(conn, source)
                conn.commit()
        return BatchResult(published, waiting, blocked)

    def wait(self, timeout: float) -> bool:
        """No wake-up of its own (the streamer sleeps on LISTEN): sleeps ``timeout``."""
        time.sleep(timeout)
        return False

    def reset(self) -> None:
        """Forget the cursor: the next pass reads each source from its first staged row."""
        self._after.clear()

    def close(self) -> None:
        """Stop the helper thread (idle here: a pass waits for its sends before it returns or raises)."""
        if self._helper is not None:
            self._helper.shutdown(wait=True)
            self._helper = None

    # -- one source's batches ----------------------------------------------------------------------------------------

    def _publish_batch(self, conn: psycopg.Connection[Any], source: str, stream: str) -> int:
        """Publish up to ``pipeline_batches`` batches of ``source`` back to back; return the records published.

        While Redis appends batch *i* (in a helper thread), this thread deletes batch *i-1*, which Redis already
        confirmed, and fetches batch *i+1*. Positions of batch *i* follow those of *i-1* before *i-1*'s delete
        commits; that is safe because they are fixed by the (xid, id) order: if the delete fails, every batch not
        deleted is re-sent later with the same positions, and the broker drops the ones it already has. Every
        batch published in a pass is deleted (or the pass raises) before it returns.
        """
        publisher = self.publisher
        partitions = publisher.partitions(stream)  # here: the helper thread must be the only user of the Redis client
        batch = self._fetch(conn, source, stream, partitions, self._after.get(source, store.START))
        if batch is None:
            return 0
        identity = publisher.identity()
        epoch = identity.epoch
        publisher.connect()  # connect (and check) here, not in the helper thread
        planned: dict[str, int] = {}  # target -> last position assigned in this pass
        sent: _Sent | None = None
        published = 0
        try:
            for _ in range(self.pipeline_batches):
                started = time.perf_counter()
                targets = batch.targets
                first = {t: planned[t] + 1 if t in planned else publisher.next_seq(conn, t, epoch) for t in targets}
                last = {t: first[t] + payload.count - 1 for t, payload in targets.items()}
                planned.update(last)
                ahead: _Batch | None = None
                if sent is None and batch.count < self.batch_size:  # nothing to overlap: no thread hop
                    appended = publisher.send_all(targets, identity, first)
                else:
                    appended, ahead, done = self._overlapped(
                        conn, source, stream, partitions, batch, identity, first, sent
                    )
                    published += done
                publisher.faults.crash("streamer.crash_after_publish")
                sent = _Sent(source, stream, batch, last, appended, started)
                if ahead is None:
                    break
                batch = ahead
            assert sent is not None
            published += self._delete_sent(conn, sent)
        except BaseException:
            publisher.forget_positions()
            raise
        return published

    def _fetch(
        self, conn: psycopg.Connection[Any], source: str, stream: str, partitions: int, after: tuple[str, int]
    ) -> _Batch | None:
        """The next batch of ``source`` after ``after``, or None. An unpartitioned stream's batch comes from Postgres
        already encoded for Redis; a partitioned one is read as rows and split by key here."""
        limit = self.batch_size
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
            name = f"unilog-{self.publisher.name}-redis"
            self._helper = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name)
        future = self._helper.submit(self.publisher.send_all, batch.targets, identity, first)
        try:
            deleted = self._delete_sent(conn, sent) if sent is not None else 0
            ahead = self._fetch(conn, source, stream, partitions, batch.last)
        except BaseException:
            concurrent.futures.wait([future])
            raise
        return future.result(), ahead, deleted

    def _delete_sent(self, conn: psycopg.Connection[Any], sent: _Sent) -> int:
        """Delete a batch Redis confirmed and advance its streams' positions, in one commit."""
        publisher = self.publisher
        epoch = publisher.identity().epoch
        publisher.forget_positions(sent.last_seqs)  # re-read from Postgres unless this commit succeeds
        batch = sent.batch
        deleted = store.delete_published(conn, sent.source, batch.after, batch.last, batch.count, epoch, sent.last_seqs)
        if deleted != batch.count:
            conn.rollback()
            raise PublishError(  # retried: the records are re-sent and deduplicated by position
                f"deleted {deleted} of {batch.count} published records on {sent.stream}: another streamer is "
                "publishing the same stream without the lock; the records will be re-sent and deduplicated by position"
            )
        conn.commit()
        publisher.remember_positions(sent.last_seqs)
        self._after[sent.source] = batch.last
        publisher.counted(sent.stream, batch.count, sent.started, batch.first_created_ms)
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
