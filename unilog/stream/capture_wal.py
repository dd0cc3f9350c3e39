"""WAL mode, the streamer's commit-order capture: records read from the database's logical replication slot
(Postgres's ``pgoutput``) as they commit, published, saved, then confirmed to the slot.

Producers' ``emit`` writes each record as a transactional logical message (``unilog_stage``: nothing to delete or
vacuum); rows that other producers insert into ``staged_log_records`` are read from the same slot, and deleted by id
once published. An open or idle transaction delays only its own records. Guarantees, as in table mode (the mode
switches are :mod:`unilog.stream.modes`'s):

* **Dense positions in commit order.** Each target stream's records get ``seq`` 1, 2, 3, ... in the order their
  transactions committed.
* **Nothing saved before Redis confirmed; nothing confirmed to the slot before it is saved.** A batch is published,
  then saved in one transaction (its staged rows deleted by id, the positions advanced, and the (commit LSN,
  ordinal) mark of its last record message), then its end LSN is confirmed to the slot. A crash before the save
  re-reads the same transactions from the slot and re-sends the records with the same positions (the broker drops
  them); a crash after it re-reads records whose rows are gone, or messages at or before the mark, and skips them.
  On a backlog, Redis appends a batch while the one before is saved and confirmed: the same order per batch.
* **Memory does not grow with a transaction.** The slot's stream sends a transaction only once it has committed, so a
  large one is decoded, published and saved a batch at a time as it arrives; the slot is confirmed past it once
  its last part is saved. At most two batches of decoded rows are held besides the one being sent
  (:attr:`WalCapture.held_peak`): ``batch_size`` rows each, or up to :data:`WAL_DEPTH` times that while batches are
  spread over many streams with few records each.
* **Rows that may predate the slot go first**, by table-mode passes, while any row below the slot's ``from_xid``
  is staged.
* **A lost slot is never skipped silently**: :class:`~unilog.errors.CaptureLost` (raised by the replication stream)
  stops the streamer, naming the recovery; staged rows are kept, producers are switched to rows at once, and the
  record messages the slot had not delivered are lost with it (the error says so).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import psycopg
import structlog

from .. import routing, store
from ..errors import CaptureLost, CaptureRecreated, ConfigurationError, PublishError
from ..store.pgoutput import Decoder, WalRow, WalTransaction
from ..store.wal import CaptureSlot, ReplicationStream, SlotBusy, SlotReplaced
from . import wal_loss
from .capture import BatchResult
from .capture_table import TableCapture
from .guard import GUARD_INTERVAL, guard
from .publisher import Publisher
from .wal_batch import Caps, records_by_stream, spread, staged_ids

log = structlog.get_logger(__name__)

MAX_MESSAGES = 50_000  # messages taken from the socket per read (fewer when decoded rows would pass two batches)
# A batch spread over many streams (few records each) costs a position, a script section and a metric child per
# stream, not per record: a backlog whose next ``batch_size`` records are spread so, or that follows a spread batch,
# is taken up to this many times ``batch_size`` records a batch (at most ``batch_size`` of any one stream, as a
# stream's part goes whole in one script call; the calls carry about a batch each), so those costs are paid once for
# a stream's records of several batches' worth. It multiplies the rows held then (see the module's docstring). 16,
# as table mode's claims: 50,000 records over 10,000 streams took three batches touching 20,000 streams at 8 (the
# first one not deep), one batch at 16.
WAL_DEPTH = 16
PIECES = 4  # parts a deep batch's streams are encoded and sent in (each a batch's worth of records at least)
ARRIVING = 0.5  # seconds a stream just opened waits for a backlog that is arriving, at most


@dataclass(frozen=True, slots=True)
class _Batch:
    """A batch of the slot's records on its way: taken (``rows`` of them, ``fresh`` not published before), encoded
    per target stream, sent, then saved (rows deleted, positions and mark committed) and confirmed to the slot."""

    started: float
    rows: int
    fresh: int
    by_stream: dict[str, list[WalRow]]
    ids: list[int]  # the staged rows among them, to delete
    mark: tuple[int, int] | None  # of its last record message
    confirm: int | None  # the end LSN of the last transaction it finishes
    finished: int  # transactions it finishes
    markers: list[str]  # mode switch markers of those transactions
    identity: store.ProducerIdentity
    partitions: dict[str, int]  # stream -> its partition count
    plain: bool  # every record an untraced message
    planned: dict[str, int]  # the positions of the batch sent before it, maybe not saved yet: its follow them
    # filled as its streams are encoded (_targets), piece by piece: target stream -> its packed records, the
    # position of its first record, and of its last
    targets: dict[str, Any] = field(default_factory=dict)
    first: dict[str, int] = field(default_factory=dict)
    last_seqs: dict[str, int] = field(default_factory=dict)


class WalCapture:
    """WAL mode's passes for one streamer over its database's slot (a :class:`~unilog.stream.capture.Capture`).
    ``predrain`` is the table-mode capture that publishes the rows staged before the slot existed; ``conninfo``
    and ``timeout`` open the slot's replication session. Not thread-safe."""

    wakes_itself = True  # the slot's stream: a commit arrives on it

    def __init__(
        self,
        publisher: Publisher,
        slot: CaptureSlot,
        predrain: TableCapture,
        *,
        conninfo: str,
        batch_size: int,
        timeout: float | None,
        pipeline_batches: int,
        streams: tuple[str, ...] | None = None,
        standbys: tuple[str, ...] = (),
        losses: list[store.Recovery] | None = None,
    ) -> None:
        if streams is not None:
            raise ConfigurationError(
                "this database is in WAL capture mode, where one streamer publishes every stream of the database "
                "from its slot: drop --streams (or switch back with `unilog capture table`)"
            )
        self.publisher = publisher
        self.slot = slot
        self.predrain = predrain
        self.conninfo, self.batch_size, self.timeout = conninfo, batch_size, timeout
        self.standbys = standbys or (conninfo,)  # where the standbys' copies of the slot are read
        # lost slots recovered from (records lost or not), the streamer's list: a re-created slot is a new capture
        self.losses: list[store.Recovery] = [] if losses is None else losses
        self.pipeline_batches = pipeline_batches
        self._reader: ReplicationStream | None = None
        self._decoder = Decoder(part_rows=batch_size)
        self._pending: deque[WalTransaction] = deque()  # transactions and parts of one received, not yet published
        self._pending_rows = 0
        self._head_offset = 0  # rows of the first pending part already published (split across batches)
        self._room = batch_size  # rows the next batch may hold (more while batches are spread: WAL_DEPTH)
        self._predrained = False
        self._helper: concurrent.futures.ThreadPoolExecutor | None = None  # Redis, while the next batch decodes
        self._written: _Batch | None = None  # the batch whose rows and positions the open transaction holds
        self._mark = (0, -1)  # the last record message published: (commit LSN, ordinal); ones at or before it skip
        self.markers: set[str] = set()  # switch markers whose transaction was confirmed to the slot
        self.held_peak = 0  # the most decoded rows held at once (pending, and the decoder's open part)
        self._guard_at = 0.0  # when the slot's safety is checked next (unilog.stream.guard)

    @property
    def held_rows(self) -> int:
        """Decoded rows held now: pending publication, and read of a transaction but in no part yet."""
        return self._pending_rows + self._decoder.open_rows

    # -- one pass ----------------------------------------------------------------------------------------------------

    def run_once(self, conn: psycopg.Connection[Any]) -> BatchResult:
        """Publish one batch of whole committed transactions from the slot (first, once: the rows that may predate
        the slot, by a table-mode pass)."""
        if not self._predrained:
            if store.staged_before(conn, self.slot.from_xid):
                conn.commit()
                result = self.predrain.run_once(conn)
                if result.published or result.waiting or result.blocked or self._publishable_before(conn):
                    return result
            self._predrained = True
        opening = self._reader is None
        try:
            reader = self._open(conn)
        except SlotBusy:  # another streamer streams this database's slot: it needs every stream this one holds
            conn.commit()
            self.publisher.let_go(conn)
            return BatchResult(blocked=True)
        if time.monotonic() >= self._guard_at:
            self._guard_at = time.monotonic() + GUARD_INTERVAL
            guard(conn, streaming=True, conninfos=self.standbys)
        self._receive(reader, wait=0)
        if opening or self.batch_size // 10 <= self._pending_rows < self._room:  # a backlog may be arriving
            self._arriving(reader, judge=True)
        if not self._pending:
            self._confirm_idle(reader)
            # rows staged since the slot (those before it are the table-mode passes', done: what is left of them
            # names an invalid stream), or WAL the slot's stream has not reached: a record message may be in it
            waiting = store.any_staged(conn, self.slot.from_xid) or reader.received_end < store.wal_insert_lsn(conn)
            conn.commit()
            return BatchResult(waiting=waiting)
        return self._publish(conn, reader)

    def _publishable_before(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether a row staged before the slot that a table-mode pass may still publish is left (one held by another
        session's lock, say): streaming waits for it. Rows naming an invalid stream stay staged for good (one line
        says so); waiting for them would stop the log."""
        sources = store.sources_before(conn, self.slot.from_xid)
        conn.commit()
        return any(self.predrain.valid(source) for source in sources)

    def _open(self, conn: psycopg.Connection[Any]) -> ReplicationStream:
        if self._reader is None:
            name = self.publisher.name
            self._mark = store.message_mark(conn)  # where the slot's stream restarts, the last saved is the truth
            conn.commit()
            if self.slot.from_xid == store.RECREATING:  # a process died replacing the lost slot: replace it again
                unfinished = CaptureLost(f"the re-creation of slot {self.slot.slot!r} did not finish")
                raise wal_loss.after_loss(self, conn, unfinished)
            try:
                self._reader = ReplicationStream(
                    self.conninfo, self.slot, application_name=f"unilog-{name}-wal", timeout=self.timeout
                )
            except CaptureLost as exc:
                raise wal_loss.after_loss(self, conn, exc) from None
            except SlotReplaced as exc:  # a new session reads the capture again: its rows before from_xid first
                raise CaptureRecreated(str(exc)) from None
            log.info("streaming from the WAL", slot=self.slot.slot, streamer=name)
        return self._reader

    def _receive(self, reader: ReplicationStream, wait: float) -> None:
        """Decode what arrived into transactions and parts of a large one, until a batch's worth is pending. A read
        takes no more messages than there is room for rows within two batches (less than one is pending, the
        decoder's open part is at most one), so that bounds the rows held, whatever a transaction's size."""
        while self._pending_rows < self._room:
            messages = reader.read(min(MAX_MESSAGES, 2 * self._room - self.held_rows), wait)
            if not messages:
                return
            wait = 0
            for done in self._decoder.feed_all(messages):
                self._pending.append(done)
                self._pending_rows += len(done.rows)
            self.held_peak = max(self.held_peak, self.held_rows)

    def _spread_so_far(self) -> bool:
        """Whether the records pending are spread over many streams (:func:`spread`), or too few yet to tell."""
        return self._pending_rows < self.batch_size // 10 or spread(*self._streams_ahead())

    def _streams_ahead(self) -> tuple[int, int]:
        """The streams among the next ``batch_size`` pending rows (at most), and those rows."""
        streams: set[str | None] = set()
        seen, offset = 0, self._head_offset
        for part in self._pending:
            rows = part.rows[offset : offset + self.batch_size - seen]
            offset = 0
            if part.plain is not None:  # one stream, whatever its rows
                streams.add(part.plain)
            else:
                streams.update(row[0] for row in rows)
            seen += len(rows)
            if seen >= self.batch_size:
                break
        return len(streams), seen

    def _arriving(self, reader: ReplicationStream, *, judge: bool = False) -> None:
        """Take what the server sends while it sends fast (at least a tenth of a batch each 20 ms, for
        :data:`ARRIVING` seconds at most), until there is room for no more: on a stream just opened, or with a tenth
        of a batch pending, so that a backlog's first batch is taken as deep as its spread calls for
        (:meth:`_deepen`), and for a deep batch, so that it holds the backlog rather than what the server had
        decoded by then (50,000 records over 10,000 streams went in a batch of 6,000-8,000 streams first, then one
        touching them all again: a third of the drain). A slower stream (records committed as they come) is not
        waited for: 20 ms once, after a burst of a tenth of a batch. ``judge``: only while what is pending is spread
        (a backlog on one stream gains nothing from a deeper first batch, and its first send would wait)."""
        if self._written is not None:  # its transaction holds its rows and the capture's row: no waiting now
            self._receive(reader, wait=0)
            return
        until = time.monotonic() + ARRIVING
        while self._pending_rows < self._room and time.monotonic() < until:
            if judge and not self._spread_so_far():
                return  # a backlog on few streams goes in batches as it comes, the first one sent at once
            held = self.held_rows
            self._receive(reader, wait=0.02)
            if self.held_rows - held < self.batch_size // 10:
                return

    def _confirm_idle(self, reader: ReplicationStream) -> None:
        """Nothing pending and no transaction half-read: everything the server sent is handled, so its position
        can be confirmed (the slot then holds no WAL, and a shutting-down server need not wait for us)."""
        if not self._decoder.in_transaction:
            reader.confirm(reader.received_end)

    def _take_batch(self) -> tuple[list[WalRow], int | None, int, list[int], str | None, list[str]]:
        """Up to ``batch_size`` rows in commit order (more, at most ``batch_size`` of a stream, while spread:
        :data:`WAL_DEPTH`), a large transaction split across batches; returns (rows, the
        end LSN of the last transaction finished by them or None, transactions finished, their transactions' xids,
        the one stream of them all when each is an untraced message, else None: see WalTransaction.plain, and the
        switch markers of the transactions they finish)."""
        rows: list[WalRow] = []
        xids: list[int] = []
        markers: list[str] = []
        confirm, finished = None, 0
        room = self._room
        caps = Caps(self.batch_size, self.publisher.stream_of(""), rows) if room > self.batch_size else None
        plains: set[str | None] = set()
        while self._pending and room > 0:
            head = self._pending[0]
            part = head.rows[self._head_offset : self._head_offset + room]
            whole = len(part)
            if caps is not None and whole:
                part = caps.capped(part)
                if not part:
                    break  # its first row's stream has batch_size records in the batch already
            if not xids or xids[-1] != head.xid:
                xids.append(head.xid)
            if part:
                plains.add(head.plain)
            rows.extend(part)
            room -= len(part)
            self._head_offset += len(part)
            if self._head_offset >= len(head.rows):  # the whole part is in this batch or was before
                self._pending.popleft()
                self._head_offset = 0
                if head.end_lsn is not None:  # a transaction's last part: the slot may go past its commit
                    confirm, finished = head.end_lsn, finished + 1
                    if head.marker is not None:
                        markers.append(head.marker)
            if len(part) < whole:
                break  # a stream reached batch_size records
        self._pending_rows -= len(rows)
        return rows, confirm, finished, xids, (plains.pop() if len(plains) == 1 else None), markers

    def _deepen(self, reader: ReplicationStream) -> None:
        """A backlog spread over many streams is taken :data:`WAL_DEPTH` batches deep from its first batch, not from
        the one after a ``batch_size`` batch: its costs per stream are paid once for all of its records that fit
        (50,000 records over 10,000 streams: one batch, not three touching 20,000 streams). Looks at the next
        ``batch_size`` pending rows only while batches are not deep, and once a batch's worth is pending."""
        if self._room > self.batch_size or self._pending_rows < self.batch_size:
            return
        streams, seen = self._streams_ahead()
        if spread(streams, seen):
            self._room = self.batch_size * WAL_DEPTH
            self._arriving(reader)

    def _publish(self, conn: psycopg.Connection[Any], reader: ReplicationStream) -> BatchResult:
        """Publish up to ``pipeline_batches`` batches of whole committed transactions' records not published yet.
        While Redis appends batch *i* (in the helper thread), this thread saves batch *i-1* (its rows deleted, its
        positions and mark committed), confirms it to the slot, and reads and decodes what comes next. Positions of
        *i* follow those of *i-1* before *i-1* is saved: if that save fails, both are read from the slot again and
        sent with the same positions, which Redis deduplicates. Every batch sent in a pass is saved (or the pass
        raises) before it returns."""
        published, sent = 0, None
        try:
            for _ in range(self.pipeline_batches):
                self._deepen(reader)
                batch = self._prepare(conn, sent)
                if batch is None:  # a table-mode streamer still holds a stream: read these again once it let go
                    if sent is not None:
                        self._save(conn, reader, sent)
                    self._rewind()
                    return BatchResult(published, blocked=True)
                self._send(conn, reader, batch, sent)
                published, sent = published + batch.fresh, batch
                if not self._pending:
                    break
            if sent is not None:
                self._save(conn, reader, sent)
        except BaseException:
            if self._written is not None:  # rows deleted and positions written for a batch Redis may not have
                self._written = None
                with contextlib.suppress(psycopg.Error):
                    conn.rollback()
            self.publisher.forget_positions()
            self._rewind()
            raise
        # a batch of records published before (their rows gone) made progress too: the caller goes on at once
        return BatchResult(published=published, waiting=not published)

    def _prepare(self, conn: psycopg.Connection[Any], before: _Batch | None) -> _Batch | None:
        """The next batch, encoded per target stream, its positions following ``before``'s (sent, maybe not saved);
        None if a stream of it is not this streamer's to publish."""
        publisher = self.publisher
        started = time.perf_counter()
        rows, confirm, finished, xids, plain, markers = self._take_batch()
        fresh, mark = self._fresh(conn, rows, xids, plain)
        by_stream = (
            {publisher.stream_of(plain): fresh} if plain is not None and fresh else records_by_stream(publisher, fresh)
        )
        self._room = self.batch_size * (WAL_DEPTH if spread(len(by_stream), len(fresh)) else 1)
        if publisher.owns_all(conn, by_stream) != set(by_stream):  # one statement for the batch's new buckets
            return None
        partitions = publisher.partitions_of(by_stream)  # one round trip for the streams due for a look
        ids = [] if plain is not None else staged_ids(fresh)
        planned = before.last_seqs if before is not None else {}
        return _Batch(
            started, len(rows), len(fresh), by_stream, ids, mark, confirm, finished, markers, publisher.identity(),
            partitions, plain is not None, planned,
        )  # fmt: skip

    def _targets(self, conn: psycopg.Connection[Any], batch: _Batch, streams: list[str]) -> dict[str, Any]:
        """``streams``' part of ``batch`` encoded per target stream, each given its positions (in one statement for
        those not known), all recorded in the batch; returns the part's targets."""
        targets: dict[str, Any] = {}
        for stream in streams:
            targets |= routing.split_wal(stream, batch.partitions[stream], batch.by_stream[stream], batch.plain)
        planned = batch.planned
        first = self.publisher.next_seqs(conn, [t for t in targets if t not in planned], batch.identity.epoch)
        first |= {t: planned[t] + 1 for t in targets if t in planned}
        batch.targets.update(targets)
        batch.first.update(first)
        batch.last_seqs.update({t: first[t] + payload.count - 1 for t, payload in targets.items()})
        return targets

    def _pieces(self, batch: _Batch) -> list[list[str]]:
        """``batch``'s streams in up to :data:`PIECES` parts of about equal records, a part a batch's worth at least:
        a deep batch over many streams is encoded a part at a time while Redis appends the part before (encoding it
        whole first was a fifth of a drain over ten thousand streams, Redis idle meanwhile)."""
        count = min(PIECES, batch.fresh // self.batch_size)
        if count <= 1:
            return [list(batch.by_stream)]
        pieces: list[list[str]] = [[]]
        size, records = batch.fresh / count, 0
        for stream, stream_rows in batch.by_stream.items():
            if records >= size * len(pieces) and len(pieces) < count:
                pieces.append([])
            pieces[-1].append(stream)
            records += len(stream_rows)
        return pieces

    def _fresh(
        self, conn: psycopg.Connection[Any], rows: list[WalRow], xids: list[int], plain: str | None = None
    ) -> tuple[list[WalRow], tuple[int, int] | None]:
        """The records of a batch not published yet, and the mark of its last record message (None: it has none).
        A row is fresh while it is still staged (looked up by id); a message while it comes after the saved mark."""
        ids = [] if plain is not None else staged_ids(rows)
        if not ids and rows and rows[0][2] is not None and rows[0][2] > self._mark:  # messages only, all new: the
            return rows, rows[-1][2]  # usual batch (each message has a mark, and marks only grow along a batch)
        existing = store.existing_ids(conn, ids, xids) if ids else set()
        fresh = [r for r in rows if (r[1][0] in existing if r[1] is not None else (r[2] or (0, -1)) > self._mark)]
        last_mark = next((mark for _s, _r, mark, *_ in reversed(fresh) if mark is not None), None)
        return fresh, last_mark

    def _send(
        self, conn: psycopg.Connection[Any], reader: ReplicationStream, batch: _Batch, before: _Batch | None
    ) -> None:
        """Send ``batch``, saving ``before`` meanwhile. A full batch is sent from the helper thread while this one
        saves ``before`` and reads and decodes the next (a batch's worth at most: with the one in flight, three
        batches of decoded records are held at most); the helper is then the only user of the Redis client, and
        this thread waits for it whatever happens here. A smaller batch (caught up: nothing to decode meanwhile,
        and a thread's hand-off costs latency) is sent from this thread."""
        if batch.fresh < self.batch_size:
            if before is not None:
                self._save(conn, reader, before)
            targets = self._targets(conn, batch, list(batch.by_stream))
            conn.commit()  # its reads' transaction is not left idle while Redis appends (the server may end it)
            self._send_piece(batch, targets, None)
            self.publisher.faults.crash("streamer.crash_after_publish")
            return
        if self._helper is None:
            name = f"unilog-{self.publisher.name}-redis"
            self._helper = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name)
        futures, refused = [], threading.Event()
        try:
            store.open_while_sending(conn)  # the positions' reads may idle while later pieces are encoded
            for streams in self._pieces(batch):
                targets = self._targets(conn, batch, streams)
                futures.append(self._helper.submit(self._send_piece, batch, targets, refused))
            if before is not None:
                self._save(conn, reader, before)
            self._receive(reader, wait=0)
            # its rows deleted and positions written now, committed once Redis confirmed it (_save): a batch over
            # ten thousand streams wrote them for 50-200 ms after the send, as long as a tenth of its drain
            self._write(conn, batch, sending=True)
        finally:
            concurrent.futures.wait(futures)
        error = next((e for e in (f.exception() for f in futures) if e is not None), None)
        del futures  # a refusal's traceback holds this frame: the futures, holding the refusal, made a cycle
        if error is not None:
            try:
                raise error
            finally:
                del error
        self.publisher.faults.crash("streamer.crash_after_publish")

    def _send_piece(self, batch: _Batch, targets: dict[str, Any], refused: threading.Event | None) -> None:
        """Append a part of ``batch`` (a deeper batch, WAL_DEPTH, in script calls of a batch's records each, as table
        mode sends its batches); none after a part Redis refused (``refused``)."""
        if refused is not None and refused.is_set():
            return  # the batch fails whatever this part does: it is read from the slot again and re-sent
        try:
            self.publisher.send_all(targets, batch.identity, {t: batch.first[t] for t in targets}, self.batch_size)
        except BaseException:
            if refused is not None:
                refused.set()
            raise

    def _save(self, conn: psycopg.Connection[Any], reader: ReplicationStream, batch: _Batch) -> None:
        """After Redis confirmed ``batch``: delete its rows and commit its positions and mark (written already
        while it was sent, if it was sent from the helper), then confirm it to the slot (a transaction split across
        batches is confirmed once its last part is saved)."""
        if self._written is not batch:
            self._write(conn, batch)
        self._written = None
        conn.commit()
        self.publisher.remember_positions(batch.last_seqs)
        if batch.mark is not None:
            self._mark = batch.mark
        self.publisher.faults.crash("streamer.crash_before_confirm")
        if batch.confirm is not None:
            reader.confirm(batch.confirm)
        self.markers.update(batch.markers)
        if len(batch.by_stream) == 1:
            [(stream, stream_rows)] = batch.by_stream.items()
            self.publisher.counted(stream, len(stream_rows), batch.started, routing.created_ms(stream_rows[0]))
        elif batch.by_stream:  # observed once for the batch, not once per stream
            records = {stream: len(stream_rows) for stream, stream_rows in batch.by_stream.items()}
            # the batch's first record (its first stream's first, streams in order of first appearance), as a stream's
            # batch is timed by its first: reading every stream's first record's time cost more than the metric
            first = routing.created_ms(next(iter(batch.by_stream.values()))[0])
            self.publisher.counted_many(records, batch.started, first)
        log.info(
            "batch streamed",
            source="wal",
            records=batch.fresh,
            skipped=batch.rows - batch.fresh,
            transactions=batch.finished,
            streams=len(batch.by_stream),
            ms=round((time.perf_counter() - batch.started) * 1000, 2),
        )

    def _write(self, conn: psycopg.Connection[Any], batch: _Batch, *, sending: bool = False) -> None:
        """Delete ``batch``'s rows and write its positions and mark in a transaction left open (:meth:`_save`
        commits it; a failed pass rolls it back). ``sending``: Redis has not confirmed it yet, so the transaction
        may stay idle for as long as the send takes."""
        self._written = batch
        if not batch.ids and batch.mark is None:
            return
        if sending:
            store.open_while_sending(conn)
        deleted = store.delete_ids(conn, batch.ids, self.publisher.identity().epoch, batch.last_seqs, batch.mark)
        if deleted != len(batch.ids):
            self._written = None
            conn.rollback()
            raise PublishError(
                f"deleted {deleted} of {len(batch.ids)} published records: another streamer deleted staged rows "
                "meanwhile; the records will be read again and deduplicated by position"
            )

    # -- waiting and resetting ---------------------------------------------------------------------------------------

    def wait(self, timeout: float) -> bool:
        """Sleep until the slot sends something (a commit to publish) or ``timeout`` passes; return whether a
        transaction, or a part of a large one, is pending."""
        if self._reader is None:
            time.sleep(min(timeout, 0.05))
        else:
            self._receive(self._reader, wait=timeout)
        return bool(self._pending)

    def reset(self) -> None:
        """After a failed pass: the slot's stream is read again from its confirmed position, and the table-mode
        passes from their first row."""
        self._rewind()
        self.predrain.reset()

    def _rewind(self) -> None:
        """Drop the stream and what was read from it: the next pass restarts at the slot's confirmed position."""
        if self._reader is not None:
            self._reader.close()
        self._reader = None
        self._decoder = Decoder(part_rows=self.batch_size)
        self._pending.clear()
        self._pending_rows = self._head_offset = 0
        self._room = self.batch_size

    def close(self) -> None:
        """Close the slot's replication session, the helper thread, and the table-mode capture that publishes the
        rows predating the slot (its own, made for this slot)."""
        self._rewind()
        if self._helper is not None:
            self._helper.shutdown(wait=True)
            self._helper = None
        self.predrain.close()
