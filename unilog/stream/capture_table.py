"""Table mode, the streamer's default capture: committed staged rows claimed in id order, the claim saved, published,
then deleted with the claim.

Guarantees (with :class:`unilog.stream.publisher.Publisher`, which holds the stream locks and positions; the
arguments are in :mod:`unilog.store.claims`):

* **Per row, commit order.** Two records whose producers' transactions conflict on a row (an ``UPDATE``, a
  ``SELECT ... FOR UPDATE`` before the emit) reach the stream in the order their transactions committed: ids are
  taken at emit, under the row's lock, and claims are made from snapshots, each in id order.
* **Nothing waits for someone else's transaction.** A claim takes every committed row not yet published, whatever
  is open elsewhere in the cluster; rows of transactions still open at a claim are found by the next claims once
  they commit (only a transaction's own records wait for it).
* **Nothing is deleted before Redis confirmed it.** A batch is claimed (saved in ``unilog_claims``, committed), sent,
  then deleted with its claim in the transaction that advances the stream's position. A crash anywhere before that
  commit leaves the claim and its records; the claim is re-sent with the *same* records in the *same* order under the
  *same* positions, which Redis and consumers deduplicate, before anything new is claimed.
* **Dense, monotone positions.** Each stream's records carry ``seq`` numbers 1, 2, 3, ... per (producer, epoch), in
  claim order and within a claim in id order.
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog

from .. import engine, routing, store, tracing
from ..config import STREAM_NAME_RE
from ..errors import ClaimIncomplete, PublishError, RowsHeld
from ..store.claims import Claim, Cursor
from .capture import BatchResult
from .capture_spread import SpreadPasses, lock_wait, one_target_each
from .publisher import Publisher
from .side_reads import SideReads
from .spread_parts import Helper

# A pass over this many sources or more claims its batches across them (:class:`~unilog.stream.capture_spread.
# SpreadPasses`: one claim, send and delete a batch, whatever the number of streams); over fewer, each source's batches
# go as one stream's do (claimed by its own index range, the next claimed while Redis appends the one before), a
# source whose rows another session holds waiting while the others go on. 50,000 records over 2 and 4 streams drained
# at 0.86x and 0.75x of one stream's rate so, at 0.56x and 0.61x across them (a claim across sources costs twice a
# source's claim a record, and nothing overlapped it); over 8, both about 0.5-0.65x.
SPREAD_FROM = 8

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class _Batch:
    """One claim of one source, packed per target stream."""

    claim: int
    count: int
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
    """Table mode's passes for one streamer (a :class:`~unilog.stream.capture.Capture`): at most one batch per owned
    source per pass, up to ``pipeline_batches`` of them back to back on a backlog. ``streams`` limits it to these
    target streams (None: every stream with staged records); ``before`` to rows of transaction ids below it (WAL
    mode publishes the rows that may predate its slot with one). Not thread-safe: it uses one helper thread of its
    own for Redis while a large backlog drains."""

    wakes_itself = False  # the streamer's LISTEN wakes it

    def __init__(
        self,
        publisher: Publisher,
        *,
        batch_size: int,
        pipeline_batches: int,
        streams: tuple[str, ...] | None,
        before: str | None = None,
        pass_seconds: float | None = None,
        side: SideReads | None = None,
    ) -> None:
        self.publisher = publisher
        self.pass_seconds = pass_seconds  # a pass starts no new source after this long (a share of its deadline)
        self.batch_size, self.pipeline_batches, self.streams = batch_size, pipeline_batches, streams
        self.before = before
        self._cursors: dict[str, Cursor] = {}  # per source, valid while its stream lock is held
        self._refused: set[str] = set()  # invalid source names already logged
        self._pending: dict[str, list[int]] = {}  # per source: claims saved before this cursor, to re-send first
        self._helper = Helper(f"unilog-{publisher.name}-redis")  # Redis, while a backlog drains
        self._packed_fetch: bool | None = None  # whether Postgres can encode batches for Redis (a UTF8 database)
        self._saved: set[str] | None = None  # sources with saved claims not re-sent yet (None: read them again)
        self._lock_wait: float | None = None  # how long a delete waits for rows another session holds (None: no limit)
        self._held: set[str] = set()  # sources whose rows another session held at their last delete
        self._spread = SpreadPasses(  # passes over SPREAD_FROM sources or more
            publisher,
            batch_size=batch_size,
            pipeline_batches=pipeline_batches,
            before=before,
            pass_seconds=pass_seconds,
            helper=self._helper,
            side=side,
        )
        self._side = side  # reads a share's batch while this session claims the share before it

    def session_opened(self, conn: psycopg.Connection[Any]) -> None:
        """A new Postgres session: claims are read again from the table, cursors start over."""
        self.reset()
        self._packed_fetch = store.packed_fetch_supported(conn)

    def sources(self, conn: psycopg.Connection[Any]) -> list[str]:
        """The sources (``stream`` column values) with staged rows that this streamer publishes. The transaction it
        begins is not committed here: the pass's claim follows in it (READ COMMITTED: each statement sees the
        commits before it), one round trip less between a producer's commit and its XADD."""
        sources = [s for s in store.staged_sources(conn) if self.valid(s)]
        if self.streams is None:
            return sources
        return [s for s in sources if self.publisher.stream_of(s) in self.streams]

    def valid(self, source: str) -> bool:
        """Whether ``source`` is a stream name (or '', the default stream). A row staged by raw SQL with another name
        (a space, say: batches across streams pass names space-separated) stays staged, never published under
        another stream's name; one line says so, once per name."""
        if source == "" or STREAM_NAME_RE.fullmatch(source):
            return True
        if source not in self._refused:
            self._refused.add(source)
            log.error("staged records name an invalid stream; they stay staged", stream=source)
        return False

    def run_once(self, conn: psycopg.Connection[Any]) -> BatchResult:
        """Publish what is staged: over many sources (:data:`SPREAD_FROM`), or a few that may send to one stream,
        batches across them all (:class:`~unilog.stream.capture_spread.SpreadPasses`: one claim, one send and one
        delete a batch, whatever the number of streams); over fewer, each source's batches pipelined (saved claims
        first, then new ones), a source whose rows another session holds waiting while the others go on. A pass is
        bounded (``pipeline_batches`` batches a source, and a share of its deadline), so its Postgres calls end well
        within the deadline."""
        if self._packed_fetch is None:
            self._packed_fetch = store.packed_fetch_supported(conn)
        ordered = self._ordered(conn)
        if len(ordered) >= SPREAD_FROM or not one_target_each(ordered, self.publisher.stream_of):
            # sources that may send to one stream go across: its saved claims are re-sent in the order they were made,
            # whichever source made them, and no other batch of it is claimed meanwhile (positions never reused)
            return self._spread_pass(conn, ordered)
        if not ordered:
            return BatchResult(0, False, False)
        publisher = self.publisher
        streams = {publisher.stream_of(s) for s in ordered}
        was = {s for s in ordered if publisher.stream_of(s) in publisher.owned}
        owned = publisher.owns_all(conn, streams)  # one statement for their buckets
        # over several sources a source whose rows another session holds waits (its claim saved) while the others go
        # on; alone, its delete waits as long as the deadline lets it
        self._lock_wait = lock_wait(self.pass_seconds) if len(ordered) > 1 else None
        started, published, full = time.monotonic(), 0, False
        ordered = [s for s in ordered if s not in self._held] + [s for s in ordered if s in self._held]  # held last
        for i, source in enumerate(ordered):
            stream = publisher.stream_of(source)
            if stream not in owned:
                continue  # another session publishes it (or is about to release it)
            if source not in was:  # just taken over: the last holder's claims go first, the cursor starts over
                self._forget(source)
            done = self._source_pass(conn, source, stream)
            published += done
            full = full or done >= self.batch_size * self.pipeline_batches
            if len(ordered) > 1 and self.pass_seconds is not None and time.monotonic() - started > self.pass_seconds:
                # the rest go on in the next pass, at once unless they are all held (then after a poll interval)
                full = full or any(s not in self._held for s in ordered[i + 1 :])
                break
        if published == 0:
            conn.commit()
        return BatchResult(published, full, len(owned) < len(streams))

    def _source_pass(self, conn: psycopg.Connection[Any], source: str, stream: str) -> int:
        """One source's batches of a pass (:meth:`_publish_batch`); returns the records published. A source whose rows
        another session holds keeps the held batch's claim saved and stops there this pass, counting the batches
        deleted before it (a line says so once, until it publishes again)."""
        try:
            done = self._publish_batch(conn, source, stream)
        except RowsHeld as held:
            if source not in self._held:
                self._held.add(source)
                log.warning("staged rows held by another session; the stream waits", stream=stream)
            if self._saved is not None:
                self._saved.add(source)
            return held.published  # its batches deleted before the held one
        self._held.discard(source)
        if not self._pending.get(source) and self._saved is not None:
            self._saved.discard(source)
        return done

    def _spread_pass(self, conn: psycopg.Connection[Any], ordered: list[str]) -> BatchResult:
        """A pass over many sources: ownership taken for all their streams at once (their buckets' locks), the
        saved claims of those owned read from the table (a bucket just taken over brings its last holder's), then
        one batch of them re-sent, or new batches claimed across all of them."""
        publisher = self.publisher
        owned = publisher.owns_all(conn, {publisher.stream_of(s) for s in ordered})
        mine = [s for s in ordered if publisher.stream_of(s) in owned]
        self._cursors.clear()  # the spread claims take rows of these sources: a cursor would start over anyway
        self._pending.clear()
        pending = {
            s for s in store.any_pending_claims(conn) if self.streams is None or publisher.stream_of(s) in self.streams
        }
        try:
            done = self._spread.run(conn, mine, pending & set(mine), packed=bool(self._packed_fetch))
        except BaseException:
            self._saved = None  # the claims in the table are the truth: read them again
            raise
        self._saved = (pending - set(mine)) | done.saved
        return BatchResult(done.published, done.waiting, len(mine) < len(ordered))

    def _ordered(self, conn: psycopg.Connection[Any]) -> list[str]:
        """This pass's sources, in name order. After a reset, the sources with saved claims are included, those
        without rows left too."""
        sources = set(self.sources(conn))
        if self._saved is None:
            self._saved = {
                s
                for s in store.any_pending_claims(conn)
                if self.streams is None or self.publisher.stream_of(s) in self.streams
            }
        return sorted(sources | self._saved)

    def wait(self, timeout: float) -> bool:
        """No wake-up of its own (the streamer sleeps on LISTEN): sleeps ``timeout``."""
        time.sleep(timeout)
        return False

    def reset(self) -> None:
        """Forget cursors and claims: the next pass reads the saved claims again, then each source from its first
        staged row."""
        self._cursors.clear()
        self._pending.clear()
        self._saved = None

    def _forget(self, source: str) -> None:
        self._cursors.pop(source, None)
        self._pending.pop(source, None)

    def close(self) -> None:
        """Stop the helper thread (idle here: a pass waits for its sends before it returns or raises)."""
        self._helper.shutdown()
        if self._side is not None:
            self._side.close()

    # -- one source's batches ----------------------------------------------------------------------------------------

    def _publish_batch(self, conn: psycopg.Connection[Any], source: str, stream: str) -> int:
        """Publish up to ``pipeline_batches`` batches of ``source`` back to back; return the records published.

        Each batch's claim is committed before it is sent. While Redis appends batch *i* (in a helper thread), this
        thread deletes batch *i-1*, which Redis already confirmed, and claims batch *i+1*, in one commit. Positions of
        batch *i* follow those of *i-1* before *i-1*'s delete commits; that is safe because claims are re-sent in
        the order they were made, from the last committed positions: if the delete fails, every claim not deleted is
        re-sent later under the same positions, and the broker drops the ones it already has. Every batch published
        in a pass is deleted (or the pass raises) before it returns.
        """
        publisher = self.publisher
        partitions = publisher.partitions(stream)  # here: the helper thread must be the only user of the Redis client
        try:
            batch = self._next(conn, source, stream, partitions, busy=False)
            if batch is not None:
                conn.commit()  # the claim is saved before anything of it reaches Redis
        except BaseException:
            self._forget(source)
            raise
        if batch is None:
            return 0
        publisher.faults.crash("streamer.crash_after_claim")
        identity = publisher.identity()
        epoch = identity.epoch
        planned: dict[str, int] = {}  # target -> last position assigned in this pass
        sent: _Sent | None = None
        published = 0
        try:
            publisher.connect()  # connect (and check) here, not in the helper thread
            for i in range(self.pipeline_batches):
                started = time.perf_counter()
                targets = batch.targets
                first = {t: planned[t] + 1 if t in planned else publisher.next_seq(conn, t, epoch) for t in targets}
                last = {t: first[t] + payload.count - 1 for t, payload in targets.items()}
                planned.update(last)
                ahead: _Batch | None = None
                if sent is None and batch.count < self.batch_size:  # nothing to overlap: no thread hop
                    appended = publisher.send_all(targets, identity, first)
                else:
                    more = i + 1 < self.pipeline_batches  # the pass's last batch claims none: it would wait unsent
                    appended, ahead, done = self._overlapped(
                        conn, source, stream, partitions, batch, identity, first, sent, more
                    )
                    published += done
                publisher.faults.crash("streamer.crash_after_publish")
                sent = _Sent(source, stream, batch, last, appended, started)
                if ahead is None:
                    break
                batch = ahead
            assert sent is not None
            published += self._delete_sent(conn, sent)
            conn.commit()
            self._deleted(sent)
        except BaseException as exc:
            publisher.forget_positions()
            self._forget(source)  # the claims in the table are the truth: read them again
            if isinstance(exc, RowsHeld):
                exc.published = published  # committed before it
            raise
        return published

    def _next(
        self, conn: psycopg.Connection[Any], source: str, stream: str, partitions: int, *, busy: bool
    ) -> _Batch | None:
        """The next batch of ``source``: a saved claim not yet deleted (oldest first), else a new claim. A cursor
        starts only when no batch of the source is in flight (``busy``): the claims saved before it are not deleted
        until then, and a new cursor would take their rows again."""
        packed = partitions <= 1 and bool(self._packed_fetch)
        pending = self._pending.get(source)
        if pending is None:
            pending = self._pending[source] = store.pending_claims(conn, source)
            if pending:
                log.info("re-sending saved claims", source=source, claims=len(pending), streamer=self.publisher.name)
        cursor = self._cursors.get(source)
        while pending:
            claim = pending.pop(0)
            got = store.reclaim_packed(conn, claim) if packed else store.reclaim_rows(conn, claim)
            if got is not None and got.count != got.saved:
                raise ClaimIncomplete(
                    f"claim {claim} of {stream} was saved with {got.saved} records and {got.count} are left: re-sent, "
                    "they would take positions Redis already has; the streamer stops rather than skip records "
                    "(docs/guides/delivery-guarantees.md)"
                )
            if got is not None:
                return self._batch(got, stream, partitions)
            # its rows are gone, deleted only after Redis confirmed them: a streamer that believed it held the lock
            # (a partitioned session) published the same records under the same positions and deleted them
            store.drop_claim(conn, claim)
            self.publisher.settle_dropped(conn, stream)
            log.warning("a saved claim's records were published by another streamer", stream=stream, claim=claim)
        if cursor is None:
            if busy:
                return None  # a re-sent claim is not deleted yet: the next pass starts the cursor
            cursor = self._cursors[source] = Cursor()
        elif busy and cursor.cut:
            return None  # the batch in flight was cut among older rows, which match again until it is deleted
        if packed:
            got = store.claim_packed(conn, source, self.batch_size, cursor, self.before)
        else:
            got = store.claim_rows(conn, source, self.batch_size, cursor, self.before)
        if got is None:
            return None
        cursor.advance(got.last, got.count, self.batch_size, got.xip, got.xmax)
        return self._batch(got, stream, partitions)

    def _batch(self, got: Claim, stream: str, partitions: int) -> _Batch:
        if got.rows:
            rows = got.rows
            traced = tuple(row[6] for row in rows if row[6])
            return _Batch(got.claim, got.count, routing.split(stream, partitions, rows), rows[0][5], traced)
        packed = engine.Packed(got.count, got.body, got.stride)
        return _Batch(got.claim, got.count, {stream: packed}, engine.first_created_ms(got.body), got.parents)

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
        more: bool,
    ) -> tuple[int, _Batch | None, int]:
        """Send ``batch`` in the helper thread while deleting the previous one and claiming the next here (if
        ``more``), in one commit; return (entries appended, the next batch, records deleted). Waits for the send
        whatever happens here, so the Redis client is never used by two threads."""
        future = self._helper.get().submit(self.publisher.send_all, batch.targets, identity, first)
        try:
            deleted = self._delete_sent(conn, sent) if sent is not None else 0
            ahead = self._next(conn, source, stream, partitions, busy=True) if more else None
            conn.commit()
        except BaseException:
            concurrent.futures.wait([future])
            raise
        if sent is not None:
            self._deleted(sent)
        return future.result(), ahead, deleted

    def _delete_sent(self, conn: psycopg.Connection[Any], sent: _Sent) -> int:
        """Delete a batch Redis confirmed with its claim, and advance its streams' positions, in the caller's
        transaction (committed by the caller, then :meth:`_deleted`)."""
        publisher = self.publisher
        epoch = publisher.identity().epoch
        publisher.forget_positions(sent.last_seqs)  # re-read from Postgres unless this commit succeeds
        batch = sent.batch
        deleted = store.delete_claimed(conn, batch.claim, epoch, sent.last_seqs, lock_wait=self._lock_wait)
        if deleted is None:  # rolled back: its claim stays saved, re-sent by a later pass
            raise RowsHeld(sent.stream)
        if deleted != batch.count:
            conn.rollback()
            raise PublishError(  # retried: the records are re-sent and deduplicated by position
                f"deleted {deleted} of {batch.count} published records on {sent.stream}: another streamer is "
                "publishing the same stream without the lock; the records will be re-sent and deduplicated by position"
            )
        return batch.count

    def _deleted(self, sent: _Sent) -> None:
        """A batch's delete committed: its positions are known, its records counted."""
        publisher, batch = self.publisher, sent.batch
        publisher.remember_positions(sent.last_seqs)
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
