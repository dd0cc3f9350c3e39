"""Table mode over many sources (:data:`unilog.stream.capture_table.SPREAD_FROM` or more, or a few that may send
to one stream): a batch is claimed across every owned source in one statement, published in one
pipelined round trip per Redis node, and deleted with its positions in one statement, so a backlog spread over ten
thousand streams costs what the same records on one stream cost, not a claim, a send and a delete per stream.

Guarantees (the arguments are in :mod:`unilog.store.spread`; :class:`~unilog.stream.capture_table.TableCapture`
hands it its passes over more than one source):

* **Per source, commit order.** A claim takes the lowest-id committed rows of the sources, none of them in a saved
  claim: the saved claims of every owned source are re-sent and deleted first, and each batch is deleted before the
  next batch of any of its sources is claimed.
* **Nothing is deleted before Redis confirmed it.** The claims (one per source) are committed before anything of them
  is sent; they are deleted with their rows in the transaction that advances the positions, which commits after Redis
  confirmed every script call of the batch (a refused one fails the batch: nothing of it is deleted). A large batch
  goes in pieces, each piece's claims deleted in that transaction while Redis appends the next.
* **Claimed while Redis appends.** Over many sources a pass claims a share of them at a time (``SHARES``, disjoint),
  the next share's batch committed while Redis appends the one before: no row is in two batches in flight. The
  second share's batch is read in a side session while the first is claimed, and saved here
  (:mod:`unilog.stream.side_reads`).
* **A re-send is the same batch.** Claims are sent in claim order, each in id order, from the last committed
  positions; after a crash, saved claims are re-sent the same way, so each record gets the position it had, and the
  publish script (:mod:`unilog.engine.publish`) skips what Redis already holds, a command redis-py or the network
  repeated included.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog

from .. import engine, routing, store, tracing
from ..errors import ClaimIncomplete, PublishError
from .publisher import Publisher
from .side_reads import SideReads
from .spread_parts import Helper, Ready, Send, Sending, pieces_of, root_of

log = structlog.get_logger(__name__)

# A batch across streams claims up to this many batches' worth of records, at most a batch's worth of each stream,
# sent in script calls of a batch's worth each (one round trip). What such a batch costs follows the streams it spans
# as much as its records (a claim row, a position and a script's checks per stream): over ten thousand streams a batch
# of 5,000 records spans 5,000 streams, one record each; eight times deeper, the same streams carry eight times the
# records for about the same cost (bench/RESULTS.md, issue 46). Redis still serves other clients between calls.
DEPTH = 16

# A pass over this many sources or more cuts them in SHARES disjoint shares (in name order) and claims the next share's
# batch while Redis appends the one before (the claim's commit first): Postgres's part of a batch (the claim, the
# biggest) no longer waits for Redis's, nor Redis's for it. A share's sources are none of another's, so no claim takes
# a row of another's batch, and each source's records still go in claim order. From ten sources: 50,000 records over
# 10 and 100 streams drained at 0.83x and 0.79x of one stream's rate in shares, 0.68x and 0.71x in one (medians of
# three rounds, bench/RESULTS.md); over fewer, a share is a source or two, and the second claim gained nothing.
SHARES = 2
SHARED_FROM = 10

# Seconds a batch's delete waits for a row another session holds locked before it looks for whose rows they are and
# publishes the other streams (their claims are deleted; the held streams' wait for a later pass)
LOCK_WAIT = 1.0


def lock_wait(pass_seconds: float | None) -> float:
    """Seconds a delete waits for held rows: :data:`LOCK_WAIT`, well within a pass's share of the deadline."""
    return min(LOCK_WAIT, pass_seconds or LOCK_WAIT)


def one_target_each(sources: list[str], stream_of: Callable[[str], str]) -> bool:
    """Whether no two of ``sources`` may send to one target stream (as :func:`_shares` groups them: a row staged with
    no stream and one naming the default stream; a stream ``x`` and one named like a partition of it, ``x.p1``)."""
    roots = [root_of(stream_of(source)) for source in sources]
    return len(set(roots)) == len(roots)


def _shares(sources: list[str], stream_of: Callable[[str], str]) -> list[list[str]]:
    """``sources`` in :data:`SHARES` disjoint shares when there are :data:`SHARED_FROM` or more (else one): a share's
    batch is claimed while Redis appends the one before, its positions read before the one before saved its own, so
    no target may be in two shares. Sources that may send to one target stay in one share: a row staged with no
    stream and one naming the default stream (the same stream), and a stream ``x`` with one named like a partition of
    it (``x.p1``, where ``x``'s partition 1 goes). In two shares, their positions were reused and records lost."""
    if len(sources) < SHARED_FROM:
        return [sources]
    root = {source: root_of(stream_of(source)) for source in sources}
    roots = sorted(set(root.values()))
    size = -(-len(roots) // SHARES)
    share_of = {name: k // size for k, name in enumerate(roots)}
    shares: list[list[str]] = [[] for _ in range(-(-len(roots) // size))]
    for source in sources:
        shares[share_of[root[source]]].append(source)
    return shares


@dataclass(frozen=True)
class Spread:
    """What a pass over many sources did: records published, whether more is ready now, the sources (of those it
    was given) with saved claims still to re-send."""

    published: int
    waiting: bool
    saved: set[str]


class SpreadPasses:
    """Passes of table mode over many sources for one streamer: up to ``pipeline_batches`` batches of
    :data:`DEPTH` times ``batch_size`` records (``batch_size`` of a source at most), each across all the sources,
    sent in script calls of about ``batch_size`` records, while the pass is within ``pass_seconds``. ``before``
    limits it to rows of transaction ids below it (WAL mode's table passes); ``packed`` whether Postgres encodes
    batches for Redis (a UTF8 database; else each source's rows are read as rows)."""

    def __init__(
        self,
        publisher: Publisher,
        *,
        batch_size: int,
        pipeline_batches: int,
        before: str | None,
        pass_seconds: float | None,
        helper: Helper,
        side: SideReads | None = None,
    ) -> None:
        self.publisher, self.helper, self.side = publisher, helper, side
        self.batch_size, self.pipeline_batches = batch_size, pipeline_batches
        self.limit = DEPTH * batch_size  # records a batch claims at most
        self.before, self.pass_seconds = before, pass_seconds
        self._held: set[str] = set()  # streams whose rows another session held locked at the last delete
        self._ahead: Ready | None = None  # the next share's batch, sent while the batch before it is deleted
        self._partitions: dict[str, int] = {}  # the shares' streams' partition counts, read at the pass's start
        self._turn = 0  # passes that cut their sources in shares: the share a pass starts at
        self._beside: tuple[list[str], concurrent.futures.Future[store.Read | None]] | None = None  # share, its read

    def run(self, conn: psycopg.Connection[Any], sources: list[str], saved: set[str], *, packed: bool) -> Spread:
        """One pass over ``sources`` (owned: their streams' buckets held), ``saved`` those with saved claims. One batch
        of saved claims is re-sent first; then new batches are claimed across the sources of streams without saved
        claims (a stream's new records follow its saved ones). Commits; on failure, raises with the claims saved
        (the caller reads them again)."""
        started, published, more_saved = time.monotonic(), 0, False
        kept: set[str] = set()
        if saved:
            published, kept, more_saved = self._resend(conn, sources, packed=packed)
        waiting = {self._root(s) for s in kept}
        fresh = [s for s in sources if self._root(s) not in waiting] if waiting else sources
        shares = _shares(fresh, self.publisher.stream_of) if self.pipeline_batches > 1 else [fresh]
        if len(shares) > 1:
            # each pass starts at the next share: a late pass claims its first share only, and the same first share
            # each pass kept the others waiting for as long as it had records
            turn = self._turn % len(shares)
            shares, self._turn = shares[turn:] + shares[:turn], self._turn + 1
        try:
            batch = self._first_claim(conn, shares, fresh)
            published, full = self._batches(conn, batch, shares, fresh, waiting, kept, packed, started, published)
        finally:
            self._halt()  # a batch sent ahead and not settled (the pass failed): its claims stay saved
            self._beside = None  # a read not saved: nothing of it is claimed
        # more is ready when a batch was full or saved claims are left behind the batch re-sent (those held
        # by another session's row locks wait for the next pass, after a poll interval), or a share was not claimed
        return Spread(published, full or more_saved or bool(shares), kept)

    def _batches(
        self,
        conn: psycopg.Connection[Any],
        batch: store.Across,
        shares: list[list[str]],
        fresh: list[str],
        waiting: set[str],
        kept: set[str],
        packed: bool,
        started: float,
        published: int,
    ) -> tuple[int, bool]:
        """:meth:`run`'s batches, from the first one claimed (``shares``: the shares not claimed yet, consumed;
        ``waiting`` and ``kept`` grow with the streams held). Returns the records published in all and whether a
        batch was full."""
        full = False  # a batch since the last claim across every source took all it could: more may be waiting
        for i in range(self.pipeline_batches):
            while not batch.claims and shares and (i == 0 or not self._late(started)):
                batch = self._claim_beside(conn, shares.pop(0))
                conn.commit()
            claims = batch.claims
            if not claims:
                break
            ready, self._ahead = self._ahead, None
            if ready is None:  # not made ready and sent while the batch before it was deleted
                self.publisher.faults.crash("streamer.crash_after_claim")
                ready = self._ready(conn, claims, packed)
            # full: the claim took all it could (records or bytes), or a source its most (more may be waiting)
            full = full or (batch.cut or batch.filled or any(c.count >= self.batch_size for c in claims))
            go_on = i + 1 < self.pipeline_batches and not self._late(started)
            beside = shares.pop(0) if shares and go_on else None
            again = go_on and full and not shares and beside is None
            done, stuck, batch = self._publish(conn, ready, packed=packed, then=fresh if again else None, beside=beside)
            full = full and not again
            published += done
            kept |= stuck
            if stuck:
                waiting |= {self._root(s) for s in stuck}
                fresh = [s for s in fresh if self._root(s) not in waiting]
        return published, full

    def _first_claim(self, conn: psycopg.Connection[Any], shares: list[list[str]], fresh: list[str]) -> store.Across:
        """The first share's batch, claimed and committed (the claims are saved before anything of them reaches
        Redis). Over several shares, the streams' partition counts are read now (a share made ready while the helper
        thread sends may not call Redis), in the helper thread while Postgres claims: over ten thousand new streams
        that read was 30 ms of a drain's start, with Redis idle. The helper is idle then (a pass's sends ended with
        the pass before), and this thread waits for the read whatever the claim does."""
        reading = None
        if len(shares) > 1 and self.side is not None and self.pipeline_batches > 1:
            self._beside = (shares[1], self.side.submit(shares[1], self.limit, self.before, self.batch_size))
        if len(shares) > 1:
            self.publisher.connect()  # connected (and checked) in this thread, not the helper's
            streams = {self.publisher.stream_of(s) for s in fresh}
            reading = self.helper.get().submit(self.publisher.partitions_of, streams)
        try:
            batch = self._claim(conn, shares.pop(0))
            conn.commit()
        finally:
            if reading is not None:
                concurrent.futures.wait([reading])
        if reading is not None:
            self._partitions = reading.result()
        return batch

    def _claim(self, conn: psycopg.Connection[Any], fresh: list[str]) -> store.Across:
        """A new batch across ``fresh``, in the caller's transaction (none without sources)."""
        return store.claim_across(conn, fresh, self.limit, self.before, self.batch_size) if fresh else store.Across([])

    def _claim_beside(self, conn: psycopg.Connection[Any], fresh: list[str]) -> store.Across:
        """The next share's batch (``fresh``), saved from the side session's read when that read this very share
        (none of its sources left out since), else claimed here; a read of another share is dropped."""
        beside, self._beside = self._beside, None
        read = None
        if beside is not None and beside[0] is fresh and self.side is not None:
            if not beside[1].done():  # this session may have written (deletes): it waits idle in its transaction
                store.open_while_sending(conn)
            read = self.side.result(beside[1])
        del beside
        saved = store.save_read(conn, read) if read is not None else None  # None: read on another server
        return saved if saved is not None else self._claim(conn, fresh)

    def _root(self, source: str) -> str:
        """What rows held keep back with ``source``'s (:func:`root_of` its stream): every source that may send to a
        target of its. Keyed by stream, a stream ``x.p1`` held let ``x``'s claims of the batch be deleted and its
        positions on ``x.p1`` saved past the held records', which a later pass re-sent under new positions: twice."""
        return root_of(self.publisher.stream_of(source))

    def _late(self, started: float) -> bool:
        """Whether the pass used its share of the deadline: it claims no more (the next pass goes on at once)."""
        return self.pass_seconds is not None and time.monotonic() - started > self.pass_seconds

    def _resend(self, conn: psycopg.Connection[Any], sources: list[str], *, packed: bool) -> tuple[int, set[str], bool]:
        """Re-send the oldest saved claims of ``sources``, about a batch's records of them, in claim order; claims
        whose rows are all gone were published and deleted by another streamer (a partitioned session's) and are
        dropped; one with some rows gone stops the streamer. Returns the records published, the sources with saved
        claims left, and whether some were left behind the batch (not held)."""
        pending = store.pending_across(conn, sources)
        take: list[int] = []
        records = 0
        for claim, _source, count in pending:
            if take and records + count > self.limit:
                break
            take.append(claim)
            records += count
        got = store.reclaim_across(conn, take)
        source_of = {claim: source for claim, source, _count in pending}
        for claim in sorted(set(take) - {c.claim for c in got}):
            store.drop_claim(conn, claim)
            self.publisher.settle_dropped(conn, self.publisher.stream_of(source_of[claim]))
            log.warning("a saved claim's records were published by another streamer", claim=claim)
        for c in got:
            if c.count != c.saved:
                raise ClaimIncomplete(
                    f"claim {c.claim} of {self.publisher.stream_of(c.source)} was saved with {c.saved} records and "
                    f"{c.count} are left: re-sent, they would take positions Redis already has; the streamer stops "
                    "rather than skip records (docs/guides/delivery-guarantees.md)"
                )
        published, stuck = 0, set[str]()
        if got:
            log.info("re-sending saved claims", claims=len(got), sources=len({c.source for c in got}))
            published, stuck, _ = self._publish(conn, self._ready(conn, got, packed), packed=packed, then=None)
        conn.commit()
        behind = {source for claim, source, _count in pending if claim not in take}
        return published, behind | stuck, bool(behind)

    def _targets(
        self,
        conn: psycopg.Connection[Any],
        claims: list[store.SourceClaim],
        packed: bool,
        partitions: dict[str, int] | None = None,
    ) -> list[tuple[int, str, engine.Packed]]:
        """Each claim's payloads per target stream, in claim order: ``(claim, target, payload)``. A partitioned
        stream's claim (or any, without ``packed``) is read again as rows and split by key. ``partitions``: the
        streams' partition counts, read before (no Redis call here: the helper thread may be sending)."""
        publisher = self.publisher
        if partitions is None:
            partitions = publisher.partitions_of({publisher.stream_of(c.source) for c in claims})
        out: list[tuple[int, str, engine.Packed]] = []
        for c in claims:
            stream = publisher.stream_of(c.source)
            if packed and partitions[stream] <= 1:
                out.append((c.claim, stream, engine.Packed(c.count, c.body, c.stride)))
                continue
            got = store.reclaim_rows(conn, c.claim)
            if got is None or got.count != c.count:  # retried: the claim is read again
                raise PublishError(
                    f"claim {c.claim} of {stream} changed while it was read: another streamer is "
                    "publishing the stream without its lock"
                )
            out += [(c.claim, t, payload) for t, payload in routing.split(stream, partitions[stream], got.rows).items()]
        return out

    def _ready(
        self,
        conn: psycopg.Connection[Any],
        claims: list[store.SourceClaim],
        packed: bool,
        partitions: dict[str, int] | None = None,
    ) -> Ready:
        """``claims`` (saved and committed) made ready to send: their payloads per target, from the last positions
        (read here, committed); ``partitions`` as :meth:`_targets` takes them."""
        publisher, began = self.publisher, time.perf_counter()
        identity = publisher.identity()
        targets = self._targets(conn, claims, packed, partitions)
        position = publisher.next_seqs(conn, {t for _c, t, _p in targets}, identity.epoch)
        sends: list[Send] = []
        for claim, target, payload in targets:
            sends.append(Send(claim, target, position[target], payload))
            position[target] += payload.count
        conn.commit()  # the claims' positions are read; a batch in pieces is deleted while Redis appends
        last = {t: p - 1 for t, p in position.items()}
        return Ready(claims, sends, last, identity, pieces_of(claims, sends, self.batch_size), began)

    def _start(self, ready: Ready) -> None:
        """Hand ``ready``'s pieces to the helper thread (after what it sends now)."""
        self.publisher.connect()  # connect (and check) here, not in the helper thread
        confirmed: queue.SimpleQueue[Any] = queue.SimpleQueue()
        stop = threading.Event()
        future = self.helper.get().submit(self._send_pieces, ready.pieces, ready.identity, confirmed, stop)
        ready.sending = Sending(future, confirmed, stop)

    def _halt(self) -> None:
        """Stop the batch sent ahead, if any (after its piece in flight: never two threads on one client); its claims
        stay saved, for a later pass to re-send under the same positions."""
        ready, self._ahead = self._ahead, None
        if ready is None or ready.sending is None:
            return
        sending, ready.sending = ready.sending, None
        error = sending.end()
        if error is not None:
            log.warning("sending a batch ahead failed too", error=str(error))

    def _publish(
        self,
        conn: psycopg.Connection[Any],
        ready: Ready,
        *,
        packed: bool,
        then: list[str] | None,
        beside: list[str] | None = None,
    ) -> tuple[int, set[str], store.Across]:
        """Send ``ready`` in one pipelined round trip per Redis node (or in pieces), from the last committed
        positions; then, in one transaction, delete its claims with their rows, save the positions and, with
        ``then``, claim the next batch of those sources (with ``beside``, the next share's batch is claimed while this
        one is sent). A stream with rows another session holds locked keeps its claims of the batch and its
        positions (its claims are re-sent, under the same positions, by a later pass); the others go on. Returns the
        records deleted, the sources of the claims kept, and the next batch (empty: none)."""
        publisher, claims, last, began = self.publisher, ready.claims, ready.last, ready.began
        try:
            appended, done, kept, ahead = self._send_and_delete(conn, ready, beside, packed)
            if ahead is None:  # not claimed while Redis appended
                held = {self._root(s) for s in kept}  # a held stream's new records wait behind its claims
                fresh = [s for s in beside or then or () if self._root(s) not in held] if held else beside or then or []
                ahead = self._claim_beside(conn, fresh)
            conn.commit()
        except BaseException:
            publisher.forget_positions()
            raise
        publisher.remember_positions({t: q for t, q in last.items() if t in done})
        self._counted([c for c in claims if c.source not in kept], began, appended, len(done))
        return sum(c.count for c in claims if c.source not in kept), kept, ahead

    def _send_and_delete(
        self, conn: psycopg.Connection[Any], ready: Ready, beside: list[str] | None, packed: bool
    ) -> tuple[int, set[str], set[str], store.Across | None]:
        """Send the batch and delete what Redis confirmed, with the positions, in the caller's transaction (left open):
        returns the entries appended, the targets saved and the sources kept (held). In pieces (:data:`PIECES`) when
        the batch holds two batches' worth or more and no stream of it was held at the last delete: each piece's
        claims are deleted here while Redis appends the next, and a piece is sent only after every piece before it
        was confirmed (a refused one ends the sending: nothing after it reaches Redis out of order). On any failure
        the transaction is rolled back (nothing deleted) after the sends ended: never two threads on one client."""
        publisher, claims, sends, last, pieces = self.publisher, ready.claims, ready.sends, ready.last, ready.pieces
        identity, epoch = ready.identity, ready.identity.epoch
        if ready.sending is not None or (len(pieces) > 1 and not self._held & {self._root(c.source) for c in claims}):
            try:
                appended, whole, ahead = self._overlapped(conn, ready, beside, packed)
                publisher.faults.crash("streamer.crash_after_publish")
            except BaseException:
                with contextlib.suppress(psycopg.Error):
                    conn.rollback()
                raise
            publisher.forget_positions(last)  # re-read from Postgres unless this commit succeeds
            if whole:
                self._held = set()
                return appended, set(last), set(), ahead
        else:
            ahead = None
            batches = [(s.target, s.first, s.payload) for s in sends]
            appended = publisher.send_batches(batches, identity, self.batch_size)
            publisher.faults.crash("streamer.crash_after_publish")
            publisher.forget_positions(last)
        targets = [(s.claim, s.target, s.payload) for s in sends]
        done, kept = self._delete_confirmed(conn, claims, targets, last, epoch, wait_first=len(pieces) == 1)
        return appended, done, kept, ahead

    def _overlapped(
        self, conn: psycopg.Connection[Any], ready: Ready, beside: list[str] | None, packed: bool
    ) -> tuple[int, bool, store.Across | None]:
        """Send ``pieces`` in the helper thread, one after another, and delete each piece's claims here once Redis
        confirmed it, then save the positions (one statement: rows locked in name order, as every writer of them
        does). Returns the entries appended and whether every piece was deleted (False: a delete met rows another
        session holds locked and rolled the transaction back; the caller settles the batch as
        :meth:`_delete_confirmed` does). The deletes share one lock wait, as one delete did. Raises what the sends
        raised, after they ended."""
        if ready.sending is None:
            self._start(ready)
        assert ready.sending is not None
        pieces, identity = ready.pieces, ready.identity
        confirmed, stop, future = ready.sending.confirmed, ready.sending.stop, ready.sending.future
        ready.sending = None  # the error a send raises is held by its future: no cycle through the batch
        appended, whole, upto, refused, ahead = 0, True, dict[str, int](), None, None
        try:
            if beside is not None:  # the next share's claim, saved (committed) before anything of it is sent
                ahead = self._claim_beside(conn, beside)
                conn.commit()
                self._send_ahead(conn, ahead, packed)
            store.open_while_sending(conn)
            until = time.monotonic() + lock_wait(self.pass_seconds)
            for piece in pieces:
                got = confirmed.get()
                if isinstance(got, BaseException):
                    refused = got
                    break
                appended += got
                whole = whole and self._delete_piece(conn, piece, until - time.monotonic())
                for s in piece:
                    upto[s.target] = s.first + s.payload.count - 1
        except BaseException:
            # what is left is not sent: it would be re-sent anyway
            error = Sending(future, confirmed, stop).end()
            if error is not None:
                log.warning("sending a piece of a batch failed too", error=str(error))
            del error
            raise
        concurrent.futures.wait([future])
        if refused is not None:
            self._halt()
            try:
                raise refused  # nothing after the refused piece was sent
            finally:
                del refused, got, future  # each holds the error, whose traceback holds this frame: a cycle
        future.result()
        if whole:
            store.save_positions(conn, identity.epoch, upto)
        return appended, whole, ahead

    def _send_ahead(self, conn: psycopg.Connection[Any], ahead: store.Across, packed: bool) -> None:
        """Make the next share's batch (just claimed, committed) ready and, in pieces, hand it to the helper thread to
        send after the batch it sends now: Redis appends it while this thread deletes the batch before (its streams
        are none of that batch's)."""
        if not ahead.claims:
            return
        self.publisher.faults.crash("streamer.crash_after_claim")
        # every share's streams were read with the first share's claim: a stream missing there is a defect, never
        # taken as unpartitioned (its records would go to the stream, not its partitions)
        ready = self._ready(conn, ahead.claims, packed, self._partitions)
        if len(ready.pieces) > 1 and not self._held & {self._root(c.source) for c in ready.claims}:
            self._start(ready)
        self._ahead = ready

    def _send_pieces(
        self,
        pieces: list[list[Send]],
        identity: store.ProducerIdentity,
        confirmed: queue.SimpleQueue[Any],
        stop: threading.Event,
    ) -> None:
        """The helper thread's part: each piece in one pipelined round trip, in order, its appended entries put in
        ``confirmed``; the first failure is put there too, re-raised, and ends the sending (as ``stop`` does)."""
        for piece in pieces:
            if stop.is_set():
                return
            try:
                batches = [(s.target, s.first, s.payload) for s in piece]
                confirmed.put(self.publisher.send_batches(batches, identity, self.batch_size))
            except BaseException as exc:
                confirmed.put(exc)
                raise

    def _delete_piece(self, conn: psycopg.Connection[Any], piece: list[Send], wait: float) -> bool:
        """Delete a confirmed piece's claims with their rows in the open transaction, waiting ``wait`` seconds at most
        for rows another session holds locked; False when some are held (the transaction rolled back)."""
        claims = sorted({s.claim for s in piece})
        records = sum(s.payload.count for s in piece)
        deleted = store.delete_across(conn, claims, lock_wait=max(wait, 0.001))
        if deleted is None:
            return False
        if deleted != records:
            conn.rollback()
            raise PublishError(  # retried: the records are re-sent and deduplicated by position
                f"deleted {deleted} of {records} published records: another streamer is publishing the same "
                "streams without their locks; the records will be re-sent and deduplicated by position"
            )
        return True

    def _delete_confirmed(
        self,
        conn: psycopg.Connection[Any],
        claims: list[store.SourceClaim],
        targets: list[tuple[int, str, engine.Packed]],
        last: dict[str, int],
        epoch: int,
        *,
        wait_first: bool = True,
    ) -> tuple[set[str], set[str]]:
        """Delete the claims Redis confirmed, with their rows, and save their targets' positions, in the caller's
        transaction; a stream whose rows are not all locked here (another session holds some) keeps all of its
        claims of the batch and its positions, and so does every stream that may share a target with it
        (:meth:`_root`). Returns the targets saved and the sources kept. Without ``wait_first``
        (a delete waited already), the rows are locked at once, skipping those held."""
        records = sum(c.count for c in claims)
        streams = {self._root(c.source) for c in claims}
        deleted = None
        # a stream held at the last look is looked at again at once, not waited for
        if wait_first and not self._held & streams:
            deleted = store.delete_across(conn, [c.claim for c in claims], lock_wait=lock_wait(self.pass_seconds))
        held, stuck = set[str](), set[str]()
        if deleted is None:  # rows another session holds locked: find whose, and let the other streams go on
            locked = store.lock_across(conn, [c.claim for c in claims])
            claimed: dict[str, int] = {}
            for c in claims:
                claimed[c.source] = claimed.get(c.source, 0) + c.count
            stuck = {self.publisher.stream_of(s) for s, count in claimed.items() if locked.get(s, 0) != count}
            held = {root_of(s) for s in stuck}
            settled = [c for c in claims if self._root(c.source) not in held]
            records = sum(c.count for c in settled)
            deleted = store.delete_across(conn, [c.claim for c in settled]) if settled else 0
        if deleted != records:
            conn.rollback()
            raise PublishError(  # retried: the records are re-sent and deduplicated by position
                f"deleted {deleted} of {records} published records: another streamer is publishing the same "
                "streams without their locks; the records will be re-sent and deduplicated by position"
            )
        kept = {c.source for c in claims if self._root(c.source) in held}
        self._held = held
        source_of = {c.claim: c.source for c in claims}
        done = {t for claim, t, _p in targets if source_of[claim] not in kept}
        store.save_positions(conn, epoch, {t: q for t, q in last.items() if t in done})
        if held:
            log.warning(  # the streams whose rows are held (each with those sharing a target, counted in claims)
                "staged rows locked by another session: their streams wait",
                streams=len(stuck),
                first=min(stuck),
                claims=sum(1 for c in claims if c.source in kept),
            )
        return done, kept

    def _counted(self, claims: list[store.SourceClaim], began: float, appended: int, targets: int) -> None:
        """A batch's delete committed: its records counted per stream, the batch observed once, and one log line
        for it (not one per stream)."""
        publisher = self.publisher
        records: dict[str, int] = {}
        for c in claims:
            stream = publisher.stream_of(c.source)
            records[stream] = records.get(stream, 0) + c.count
        created = [c.first_created_ms for c in claims if c.first_created_ms is not None]
        publisher.counted_many(records, began, min(created, default=None))
        if tracing.ENABLED:  # a span per stream with traced records (linked to them), not per stream of the batch
            ended = time.time_ns()
            start = ended - int((time.perf_counter() - began) * 1e9)
            for c in claims:
                if c.parents:
                    tracing.record_publish(publisher.stream_of(c.source), c.count, c.parents, start, ended)
        log.info(
            "batch streamed",
            records=sum(records.values()),
            streams=len(records),
            appended=appended,
            targets=targets,
            ms=round((time.perf_counter() - began) * 1000, 2),
        )
