"""Commit-order capture: the streamer's WAL mode, and switching a database between table and WAL mode.

In WAL mode producers still insert into ``staged_log_records`` in their own transaction; the streamer reads the
committed inserts from a logical replication slot (Postgres's ``pgoutput``), in commit order, so an open or idle
transaction delays only its own records. Guarantees, as in table mode:

* **Dense positions in commit order.** Each target stream's records get ``seq`` 1, 2, 3, ... in the order their
  transactions committed.
* **Nothing deleted before Redis confirmed; nothing confirmed to the slot before it is deleted.** A batch is
  published, then its staged rows are deleted by id with the positions advanced in one transaction, then its end LSN
  is confirmed to the slot. A crash before the delete re-reads the same transactions from the slot and re-sends the
  records with the same positions (the broker drops them); a crash after it re-reads records whose rows are gone,
  and skips them.
* **A row exists until its record is published**, in either mode, so switching modes neither loses nor repeats:
  ``unilog capture wal`` records ``from_xid`` after creating the slot; rows of lower xids (they may have committed
  before the slot existed) are published by a table-mode pass first, and the WAL skips any record it delivers whose
  row is already gone. ``unilog capture table`` drops the slot; table mode publishes whatever rows remain.
* **A switch never renumbers a batch in flight.** The modes number records in different orders (commit order,
  (xid, id) order), so a batch Redis has but Postgres has not deleted must be re-sent by the mode that sent it. A
  switch therefore runs only while no streamer runs on the database (one line otherwise), first settles such
  batches in the current mode (:func:`settle`), and streamers read the mode when their Postgres session opens.
* **A lost slot is never skipped silently**: :class:`~unilog.errors.CaptureLost` stops the streamer, naming the
  recovery (``unilog capture wal --recreate``), and the unpublished records are still staged.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

import psycopg
import structlog

from . import metrics, routing, store
from .config import Settings
from .errors import ConfigurationError, PublishError
from .store.pgoutput import Decoder, WalRow, WalTransaction
from .store.wal import CaptureSlot, ReplicationStream, SlotBusy

if TYPE_CHECKING:
    from .streamer import BatchResult, Streamer

log = structlog.get_logger(__name__)

MAX_MESSAGES = 50_000  # messages taken from the socket per read: bounds a pass's memory on a large backlog


class WalCapture:
    """The WAL pass of one :class:`~unilog.streamer.Streamer` for its database's slot. Not thread-safe."""

    def __init__(self, streamer: Streamer, slot: CaptureSlot) -> None:
        if streamer.config.streams is not None:
            raise ConfigurationError(
                "this database is in WAL capture mode, where one streamer publishes every stream of the database "
                "from its slot: drop --streams (or switch back with `unilog capture table`)"
            )
        # a proxy: the streamer owns this pass, and a strong reference back would make a cycle that keeps a dropped
        # streamer's sessions (its stream locks, its slot) until the garbage collector ran
        self.streamer: Streamer = weakref.proxy(streamer)
        self.slot = slot
        self._reader: ReplicationStream | None = None
        self._decoder = Decoder()
        self._pending: deque[WalTransaction] = deque()  # received whole, not yet published
        self._pending_rows = 0
        self._head_offset = 0  # rows of the first pending transaction already published (a split transaction)
        self._predrained = False

    # -- one pass ----------------------------------------------------------------------------------------------------

    def run_once(self, conn: psycopg.Connection[Any]) -> BatchResult:
        """Publish one batch of whole committed transactions from the slot (first, once: the rows that may predate
        the slot, by a table-mode pass)."""
        from .streamer import BatchResult

        if not self._predrained:
            if store.staged_before(conn, self.slot.from_xid):
                conn.commit()
                return self.streamer.table_pass(conn)
            self._predrained = True
        try:
            reader = self._open()
        except SlotBusy:
            conn.commit()
            return BatchResult(blocked=True)  # another streamer streams this database's slot
        self._receive(reader, wait=0)
        if not self._pending:
            self._confirm_idle(reader)
            waiting = store.any_staged(conn)
            conn.commit()
            return BatchResult(waiting=waiting)
        return self._publish(conn, reader)

    def _open(self) -> ReplicationStream:
        if self._reader is None:
            self._reader = ReplicationStream(
                self.streamer.settings.conninfo,
                self.slot,
                application_name=f"unilog-{self.streamer.name}-wal",
                timeout=self.streamer.config.pg_timeout,
            )
            log.info("streaming from the WAL", slot=self.slot.slot, streamer=self.streamer.name)
        return self._reader

    def _receive(self, reader: ReplicationStream, wait: float) -> None:
        """Move what arrived into whole transactions, until a batch's worth is pending."""
        limit = self.streamer.config.batch_size
        while self._pending_rows < limit:
            messages = reader.read(MAX_MESSAGES, wait)
            if not messages:
                return
            wait = 0
            for message in messages:
                done = self._decoder.feed(message)
                if done is not None:
                    self._pending.append(done)
                    self._pending_rows += len(done.rows)

    def _confirm_idle(self, reader: ReplicationStream) -> None:
        """Nothing pending and no transaction half-read: everything the server sent is handled, so its position
        can be confirmed (the slot then holds no WAL, and a shutting-down server need not wait for us)."""
        if not self._decoder.in_transaction:
            reader.confirm(reader.received_end)

    def _take_batch(self) -> tuple[list[WalRow], int | None, int, list[int]]:
        """Up to ``batch_size`` rows in commit order, a large transaction split across batches; returns (rows, the
        end LSN of the last transaction finished by them or None, transactions finished, their transactions' xids)."""
        rows: list[WalRow] = []
        xids: list[int] = []
        confirm, finished = None, 0
        room = self.streamer.config.batch_size
        while self._pending and room > 0:
            head = self._pending[0]
            xids.append(head.xid)
            part = head.rows[self._head_offset : self._head_offset + room]
            rows.extend(part)
            room -= len(part)
            self._head_offset += len(part)
            if self._head_offset >= len(head.rows):  # the whole transaction is in this batch or was before
                self._pending.popleft()
                self._head_offset = 0
                confirm, finished = head.end_lsn, finished + 1
        self._pending_rows -= len(rows)
        return rows, confirm, finished, xids

    def _publish(self, conn: psycopg.Connection[Any], reader: ReplicationStream) -> BatchResult:
        """Publish the next whole transactions' records whose rows exist, delete those rows, confirm the slot."""
        from .streamer import BatchResult

        streamer = self.streamer
        started = time.perf_counter()
        rows, confirm, finished, xids = self._take_batch()
        existing = store.existing_ids(conn, [r.row[0] for r in rows], xids) if rows else set()
        fresh = [r for r in rows if r.row[0] in existing]
        by_stream: dict[str, list[store.StagedRow]] = {}
        for r in fresh:
            by_stream.setdefault(r.stream or streamer.settings.stream, []).append(r.row)
        if not all(streamer.owns(conn, stream) for stream in by_stream):
            self.reset()  # a table-mode streamer still holds one: read these again once it let go
            return BatchResult(blocked=True)
        try:
            last_seqs = self._send(conn, by_stream)
            self._delete(conn, [r.row[0] for r in fresh], last_seqs)
        except BaseException:
            streamer.forget_positions()
            self.reset()
            raise
        streamer.faults.crash("streamer.crash_before_confirm")
        if confirm is not None:  # a transaction split across batches is confirmed once its last part is deleted
            reader.confirm(confirm)
        for stream, stream_rows in by_stream.items():
            metrics.batch_published(stream, len(stream_rows), time.perf_counter() - started, stream_rows[0][5])
        streamer.published_total += len(fresh)
        log.info(
            "batch streamed",
            source="wal",
            records=len(fresh),
            skipped=len(rows) - len(fresh),
            transactions=finished,
            streams=len(by_stream),
            ms=round((time.perf_counter() - started) * 1000, 2),
        )
        # a batch of records published before (their rows gone) made progress too: the caller goes on at once
        return BatchResult(published=len(fresh), waiting=not fresh)

    def _send(self, conn: psycopg.Connection[Any], by_stream: dict[str, list[store.StagedRow]]) -> dict[str, int]:
        streamer = self.streamer
        identity = streamer.identity()
        targets: dict[str, Any] = {}
        for stream, stream_rows in by_stream.items():
            targets |= routing.split(stream, streamer.partitions(stream), stream_rows)
        first = {t: streamer.next_seq(conn, t, identity.epoch) for t in targets}
        streamer.send_all(targets, identity, first)
        streamer.faults.crash("streamer.crash_after_publish")
        return {t: first[t] + payload.count - 1 for t, payload in targets.items()}

    def _delete(self, conn: psycopg.Connection[Any], ids: list[int], last_seqs: dict[str, int]) -> None:
        streamer = self.streamer
        if not ids:
            conn.commit()
            return
        deleted = store.delete_ids(conn, ids, streamer.identity().epoch, last_seqs)
        if deleted != len(ids):
            conn.rollback()
            raise PublishError(
                f"deleted {deleted} of {len(ids)} published records: another streamer deleted staged rows meanwhile; "
                "the records will be read again and deduplicated by position"
            )
        conn.commit()
        streamer.remember_positions(last_seqs)

    # -- waiting and resetting ---------------------------------------------------------------------------------------

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def wait(self, timeout: float) -> None:
        """Sleep until the slot sends something (a commit to publish) or ``timeout`` passes."""
        if self._reader is None:
            time.sleep(min(timeout, 0.05))
            return
        self._receive(self._reader, wait=timeout)

    def reset(self) -> None:
        """Drop the stream and what was read from it: the next pass restarts at the slot's confirmed position."""
        if self._reader is not None:
            self._reader.close()
        self._reader = None
        self._decoder = Decoder()
        self._pending.clear()
        self._pending_rows = self._head_offset = 0

    def close(self) -> None:
        self.reset()


# -- switching modes ---------------------------------------------------------------------------------------------------


def settle(settings: Settings, timeout: float = 60.0) -> None:
    """Re-send, in the current mode, any batch Redis confirmed but Postgres did not delete (a streamer died between
    the two), so that no batch is in flight across a switch; refuses while a streamer runs."""
    from .streamer import Streamer, StreamerConfig

    with Streamer(settings, StreamerConfig(restart_after_crash=False), name="capture-settle") as streamer:
        conn = streamer.links.pg()
        _refuse_running(conn)
        deadline = time.monotonic() + timeout
        while doubtful := in_doubt(streamer, conn):
            if time.monotonic() > deadline:
                raise ConfigurationError(f"could not settle the batches in flight on {', '.join(doubtful)}: try again")
            streamer.run_once()
            time.sleep(0.02)


def in_doubt(streamer: Streamer, conn: psycopg.Connection[Any]) -> list[str]:
    """Streams where Redis holds positions of this producer that Postgres has not committed (a batch in flight)."""
    identity = streamer.identity()
    positions = store.published_positions(conn)
    conn.commit()
    api = streamer.links.redis()
    doubtful = []
    for stream, epoch, last_seq in positions:
        mark = api.high_water(stream, identity.producer_id)
        if epoch == identity.epoch and mark is not None and mark > (epoch, last_seq):
            doubtful.append(stream)
    return doubtful


def _refuse_unsettled(settings: Settings) -> None:
    from .streamer import Streamer

    with Streamer(settings, name="capture-settle") as streamer:
        conn = streamer.links.pg()
        _refuse_running(conn)
        if doubtful := in_doubt(streamer, conn):
            raise ConfigurationError(
                f"a batch on {', '.join(doubtful)} was in Redis but not yet deleted from the staging table when the "
                "slot was lost, and only the lost slot knew its order: see README, WAL capture, 'slot lost mid-batch'"
            )


def _refuse_running(conn: psycopg.Connection[Any]) -> None:
    running = [s for s, _e, _q in store.published_positions(conn) if store.stream_lock_holders(conn, s)]
    current = store.capture_slot(conn)
    state = store.slot_state(conn, current.slot) if current else None
    conn.commit()
    if running or (state and state["active_pid"]):
        raise ConfigurationError(
            f"streamers are running on this database ({', '.join(running) or 'the WAL slot'}): stop them, switch the "
            "capture mode, then start them (a batch in flight must be settled by the mode that sent it)"
        )


def enable_wal(settings: Settings, *, slot: str | None = None, recreate: bool = False) -> CaptureSlot:
    """Put the database in WAL capture mode (idempotent): the publication, the slot (created, or re-created when
    ``recreate`` or when it is missing or lost), the capture row, and the NOTIFY trigger off. Settles batches in
    flight first; refuses while a streamer runs on the database."""
    with store.connect(settings.conninfo, autocommit=True, application_name="unilog-capture") as conn:
        level = store.wal_level(conn)
        if level != "logical":
            raise store.wal_capture_unavailable(level)
        current = store.capture_slot(conn)
        state = store.slot_state(conn, current.slot) if current else None
        if current is None or (state is not None and state["wal_status"] != "lost" and not recreate):
            settle(settings)
        else:
            _refuse_unsettled(settings)  # a lost slot cannot re-send its batch in flight
        name = slot or (current.slot if current else store.default_slot_name(conn))
        publication = current.publication if current else store.PUBLICATION
        store.ensure_publication(conn, publication)
        state = store.slot_state(conn, name)
        fresh = state is None or recreate or state["wal_status"] == "lost" or current is None
        if fresh:
            if state is not None:
                store.drop_slot(conn, name)
            store.create_slot(conn, name)
            store.record_capture(conn, name, publication)
        store.set_notify_trigger(conn, False)
        captured = store.capture_slot(conn)
        assert captured is not None
        _fit_read_index(conn, captured)
        log.info("WAL capture on", slot=name, publication=publication, new_slot=fresh)
        return captured


def _fit_read_index(conn: psycopg.Connection[Any], captured: CaptureSlot) -> None:
    """Table mode's read index exactly while rows staged before the slot are left (a first switch, or a slot
    re-created after an outage: then every staged row predates it). Table-mode passes publish those, reading by
    the index (without it each batch scans the table); after them WAL mode has no use for it, and producers pay
    its update. ``unilog capture wal`` again, once they are published, drops it."""
    needed = store.staged_before(conn, captured.from_xid)
    if needed == store.has_read_index(conn):
        return
    if needed:
        store.set_read_index(conn, True)  # ConfigurationError (one line, exit 3) if it cannot: run the command again
        log.info("table-mode index built: rows staged before the slot go out through table-mode passes first")
        return
    try:
        store.set_read_index(conn, False)
    except ConfigurationError as exc:  # WAL capture is on and works; the index only costs producers until dropped
        log.warning("table-mode index kept", reason=str(exc))


def disable_wal(settings: Settings) -> None:
    """Back to table mode: the capture row and the slot go, the NOTIFY trigger comes back; rows still staged are
    published by table-mode passes."""
    settle(settings)
    with store.connect(settings.conninfo, autocommit=True, application_name="unilog-capture") as conn:
        current = store.capture_slot(conn)
        # the table first (each change may give up behind a long transaction): a switch that fails then leaves WAL
        # mode whole, with its slot, rather than table mode with no wake-up and a slot retaining WAL for nobody
        store.set_read_index(conn, True)  # before table-mode passes start: they read by it
        store.set_notify_trigger(conn, True)
        store.forget_capture(conn)
        if current is not None:
            store.drop_slot(conn, current.slot)
        log.info("table mode", dropped_slot=current.slot if current else None)


def capture_status(settings: Settings) -> dict[str, Any]:
    """The database's capture mode, and in WAL mode its slot's state (owner, WAL status, confirmed position,
    WAL retained)."""
    with store.connect(settings.conninfo, autocommit=True, application_name="unilog-capture") as conn:
        current = store.capture_slot(conn)
        report: dict[str, Any] = {"mode": "wal" if current else "table", "wal_level": store.wal_level(conn)}
        report["read_index"] = store.has_read_index(conn)
        if current is not None:
            report |= {"slot": current.slot, "publication": current.publication, "from_xid": current.from_xid}
            report["slot_state"] = store.slot_state(conn, current.slot)
        return report
