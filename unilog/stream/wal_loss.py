"""What WAL mode does when its slot is lost (:func:`after_loss`): producers switched to rows at once, the record
messages the slot had not delivered recovered from the WAL where it still holds them, a batch in doubt settled from
Redis, the slot re-created, and the log goes on. Split from :mod:`unilog.stream.capture_wal`, whose
:class:`~unilog.stream.capture_wal.WalCapture` calls it when its replication stream reports the loss."""

from __future__ import annotations

import re
import time
from typing import Any, Protocol

import psycopg
import structlog

from .. import store
from ..errors import CaptureLost, CaptureRecreated, ConfigurationError, PublishError, UnilogError
from ..store.wal import CaptureSlot
from .publisher import Publisher, settle_unsaved

log = structlog.get_logger(__name__)

NOTHING_LOST = "nothing is lost"  # how a lost slot's line begins when the loss cost nothing


class WalCapture(Protocol):
    """What of :class:`~unilog.stream.capture_wal.WalCapture` a loss is handled with."""

    slot: CaptureSlot
    conninfo: str
    publisher: Publisher
    losses: list[store.Recovery]


def after_loss(capture: WalCapture, conn: psycopg.Connection[Any], exc: CaptureLost) -> UnilogError:
    """The slot is gone: producers to rows at once; then, unless a batch is in doubt (sent to Redis, not yet
    saved: only the lost slot knew its order, so the streamer stops with exit 12 naming the recovery), the
    record messages the slot had not delivered are recovered from the WAL as rows (:func:`store.recover_lost_slot`;
    none are waiting if producers were held to rows before and every message before was published or rescued),
    the slot is re-created, and the streamer goes on: a loss never stops the log. What could not be recovered is
    recorded and logged as an error; the error returned (:class:`CaptureRecreated`) makes the loop reconnect."""
    # one streamer handles a loss: the slot's streaming lock for the whole of it (a second streamer that found
    # the slot lost too comes back to a re-created slot, and reads the capture again)
    deadline = time.monotonic() + 5.0  # the refused replication session's backend may not have ended yet
    while not store.try_slot_lock(conn, capture.slot.slot):
        if time.monotonic() > deadline:
            return PublishError(f"another streamer is replacing the lost slot {capture.slot.slot!r}: tried again")
        time.sleep(0.05)
    try:
        current = store.capture_slot(conn)
        conn.commit()
        if current is not None and current != capture.slot:
            return CaptureRecreated(f"{exc}; another streamer re-created it: the capture is read again")
        return _replace_lost(capture, conn, exc)
    finally:
        store.release_slot_lock(conn, capture.slot.slot)


def _replace_lost(capture: WalCapture, conn: psycopg.Connection[Any], exc: CaptureLost) -> UnilogError:
    """:func:`after_loss`, with the slot's streaming lock held."""
    lost = _stop_messages_after_loss(conn)
    recovery = None
    if not lost.startswith(NOTHING_LOST):
        try:
            others = store.other_capture_databases(conn, capture.conninfo)
            conn.commit()
            recovery = store.recover_lost_slot(conn, capture.slot.slot, others)
        except psycopg.errors.LockNotAvailable:
            conn.rollback()
            return PublishError(
                "the capture slot is lost and a transaction writing record messages did not end within 2 s: "
                "producers stage rows now; the recovery of the messages the slot had not delivered is tried again"
            )
    if (doubtful := capture.publisher.in_doubt(conn)) and not _settle_in_doubt(capture, conn, doubtful):
        return CaptureLost(f"{exc}; {lost}")
    crash = capture.publisher.faults.crash  # what `capture wal --recreate` does, done here
    store.recreate_slot(
        capture.conninfo, capture.slot, locked=True, created=lambda: crash("streamer.crash_recreating_slot")
    )
    if recovery is None:
        return CaptureRecreated(f"{exc}; {lost}: the slot is re-created")
    capture.losses.append(recovery)
    say = log.warning if recovery.complete else log.error
    say("capture slot lost: " + recovery.line(), slot=capture.slot.slot, loss=recovery.loss_id)
    return CaptureRecreated(f"{exc}; {recovery.line()}; the slot is re-created")


def _settle_in_doubt(capture: WalCapture, conn: psycopg.Connection[Any], doubtful: list[str]) -> bool:
    """A batch was in Redis, not saved, when the slot went (a primary killed mid-batch): settle it from what
    Redis has (:func:`unilog.stream.publisher.settle_unsaved`); False if it cannot be."""
    default = capture.publisher.default_stream
    sources = {}
    for target in doubtful:
        base = (
            re.sub(r"\.p\d+$", "", target)
            if capture.publisher.partitions(re.sub(r"\.p\d+$", "", target)) > 1
            else target
        )
        sources[target] = [base, ""] if base == default else [base]
    settled = settle_unsaved(capture.publisher.connect(), conn, capture.publisher.identity(), sources)
    log.warning(
        "a batch in flight when the slot was lost: " + ("settled from Redis" if settled else "cannot be settled"),
        streams=doubtful,
    )
    return settled


def _stop_messages_after_loss(conn: psycopg.Connection[Any]) -> str:
    """The slot is gone or lost: producers must stop writing record messages no slot will read. Switch them to rows
    (which any capture finds again) at once; return what the loss cost, for the error's line: nothing, if they were
    held to rows before it and every message before the hold was published or rescued, else the WAL range whose
    record messages the slot had not delivered are gone."""
    kept = "records staged as rows are kept and will be published"
    try:
        store.lock_capture(conn)  # a hold's release in flight ends first, and none starts until this commits
        reason, saved, held_at = store.rows_held(conn)
        mark, now = store.message_mark(conn), store.wal_insert_lsn(conn)
        messages = store.emit_messages(conn)
        if messages:
            store.set_emit_messages(conn, False, wait=False)
        conn.commit()
        switched = "producers now stage rows" if messages else "producers stage rows"
    except (psycopg.Error, ConfigurationError) as exc:
        conn.rollback()
        return f"{kept}; producers could not be switched to rows ({exc}): `unilog capture table` does it"
    if not messages and reason is not None and saved:
        return f"{NOTHING_LOST}: producers were held to rows before ({reason}), every record message before was " + (
            f"published or rescued as a row, and {kept}"
        )
    upto = held_at if not messages and held_at is not None else now
    # counted only where pg_walinspect can be called: a call that fails leaves an ERROR line in the server's log
    count = store.count_record_messages(conn, mark[0], upto) if store.walinspect_usable(conn) is None else None
    conn.commit()
    how_many = "(how many: unknown, pg_walinspect cannot read that WAL here)" if count is None else f"({count} at most)"
    return (
        f"{kept}, but records written as logical messages committed from {store.lsn_text(mark[0])} (the last one "
        f"published) to {store.lsn_text(upto)} that the slot had not delivered are lost with it {how_many} "
        f"({switched}; docs/guides/wal-capture.md, 'a lost slot')"
    )
