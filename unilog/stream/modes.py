"""Capture modes: switching a database between the streamer's table mode and its WAL mode, and reading the
mode's state. The WAL pass itself is :class:`unilog.stream.capture_wal.WalCapture` (re-exported here), table mode's
:class:`unilog.stream.capture_table.TableCapture`.

In WAL mode producers write each record as a transactional logical message (``pg_logical_emit_message``, through
``unilog_stage``) in their own transaction, and rows other producers insert into ``staged_log_records`` are still
captured; the streamer reads both from a logical replication slot (Postgres's ``pgoutput``), in commit order, so an
open or idle transaction delays only its own records. Guarantees, as in table mode (the first two kept by
``WalCapture``):

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
* **No record message is committed that no slot will read, and no producer waits for a switch.** Producers read
  the mode without a lock (:func:`unilog.store.set_emit_messages`): ``unilog capture wal`` turns messages on only
  once the slot exists; ``unilog capture table`` turns them off, waits for every transaction open at that moment to
  end, commits a marker after them, and publishes through the marker before it drops the slot
  (:func:`_drain_messages`).
* **A lost slot is never skipped silently**: :class:`~unilog.errors.CaptureLost` stops the streamer, naming the
  recovery (``unilog capture wal --recreate``) and what the loss cost: nothing where producers were held to rows
  before it (:mod:`unilog.stream.guard`), else the WAL range whose record messages the slot had not delivered.
* **Failover slots.** On Postgres 17+ the slot is created with ``failover``, so standbys that synchronise slots keep
  a copy a promotion makes usable; before 17 a standby attached is refused unless ``--no-failover-slot``, and then
  producers stage rows while one is.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import psycopg
import structlog

from .. import store
from ..config import Settings
from ..errors import ConfigurationError
from ..store.wal import CaptureSlot
from .capture_wal import WalCapture
from .streamer import Streamer, StreamerConfig

__all__ = ["WalCapture", "capture_status", "disable_wal", "enable_wal", "in_doubt", "settle", "slot_report"]

log = structlog.get_logger(__name__)


# -- switching modes ---------------------------------------------------------------------------------------------------


def settle(settings: Settings, timeout: float = 60.0) -> None:
    """Re-send, in the current mode, any batch Redis confirmed but Postgres did not delete (a streamer died between
    the two), so that no batch is in flight across a switch; refuses while a streamer runs."""
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
    """:meth:`Publisher.in_doubt <unilog.stream.publisher.Publisher.in_doubt>` of ``streamer``."""
    streamer.links.redis()  # connected and checked
    return streamer.publisher.in_doubt(conn)


def _refuse_unsettled(settings: Settings) -> None:
    with Streamer(settings, name="capture-settle") as streamer:
        conn = streamer.links.pg()
        _refuse_running(conn)
        if doubtful := in_doubt(streamer, conn):
            raise ConfigurationError(
                f"a batch on {', '.join(doubtful)} was in Redis but not yet deleted from the staging table when the "
                "slot was lost, and only the lost slot knew its order: see docs/guides/wal-capture.md, "
                "'slot lost mid-batch'"
            )


def _refuse_running(conn: psycopg.Connection[Any], exiting: float = 5.0) -> None:
    # a streamer that has just stopped leaves its walsender exiting for a moment (longer on a loaded machine): the slot
    # alone still active, with no stream lock held, is waited out for ``exiting`` seconds before it counts as running
    deadline = time.monotonic() + exiting
    while True:
        published = sorted({stream for stream, _e, _q in store.published_positions(conn)})
        holders = store.stream_lock_holders_many(conn, published)  # one statement, not one per stream
        running = [stream for stream in published if holders[stream]]
        current = store.capture_slot(conn)
        state = store.slot_state(conn, current.slot) if current else None
        conn.commit()
        if running or not (state and state["active_pid"]) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if running or (state and state["active_pid"]):
        held = ", ".join(running[:3]) + (f" and {len(running) - 3:,} more streams" if len(running) > 3 else "")
        raise ConfigurationError(
            f"streamers are running on this database ({held or 'the WAL slot'}): stop them, switch the capture mode, "
            "then start them (a batch in flight must be settled by the mode that sent it)"
        )


def enable_wal(
    settings: Settings, *, slot: str | None = None, recreate: bool = False, failover_slot: bool = True
) -> CaptureSlot:
    """Put the database in WAL capture mode (idempotent): the publication, the slot (created, or re-created when
    ``recreate`` or when it is missing or lost; a failover slot on Postgres 17+ unless ``failover_slot`` is False),
    the capture row, and the NOTIFY trigger off. Settles batches in flight first; refuses while a streamer runs on
    the database, and, where a standby is attached to a server without failover slots, unless ``failover_slot`` is
    False (then producers stage rows while a standby is attached: :mod:`unilog.stream.guard`)."""
    with store.connect(settings.conninfo, autocommit=True, application_name="unilog-capture") as conn:
        store.take_switch_lock(conn)  # no hold is released while the switch runs (its drain may turn them off)
        level = store.wal_level(conn)
        if level != "logical":
            raise store.wal_capture_unavailable(level)
        if failover_slot and not store.failover_slots(conn) and (attached := store.standbys(conn)):
            raise ConfigurationError(
                f"Postgres {conn.info.server_version // 10000} has no failover slots, and a standby is attached "
                f"({', '.join(attached)}): a promotion would lose the slot and every record written as a logical "
                "message it had not delivered; pass --no-failover-slot to capture from the WAL with producers "
                "staging rows while a standby is attached (nothing is lost; after a failover run `unilog capture "
                "wal --recreate`), or upgrade to Postgres 17+"
            )
        current = store.capture_slot(conn)
        state = store.slot_state(conn, current.slot) if current else None
        healthy = state is not None and state["wal_status"] != "lost"
        if current is None or (healthy and not recreate):
            settle(settings)
        elif healthy:  # re-created on request: what its messages hold is published before it goes
            settle(settings)
            _drain_messages(settings, conn)
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
            store.create_slot(conn, name, failover=failover_slot)
            store.record_capture(conn, name, publication)
        store.set_notify_trigger(conn, False)
        captured = store.capture_slot(conn)
        assert captured is not None
        _fit_read_index(conn, captured)
        if not store.install_walinspect(conn):  # a lost slot's messages are recovered from the WAL with it
            log.warning(
                "pg_walinspect is not installed (it needs a superuser): a capture slot lost without a ready copy on "
                "the promoted standby cannot be recovered from the WAL",
                why=store.walinspect_ready(conn),
            )
        _turn_messages_on(conn, name, fresh=fresh, conninfos=settings.standby_conninfos)
        log.info("WAL capture on", slot=name, publication=publication, new_slot=fresh)
        return captured


def _turn_messages_on(
    conn: psycopg.Connection[Any], slot: str, *, fresh: bool, conninfos: tuple[str, ...] = ()
) -> None:
    """Producers to record messages, only now that the slot exists (it reads every message from here on), unless the
    slot runs a risk now (then they are held to rows until it has passed) or the database is not UTF8 (a message's
    RESP lengths are server-encoding bytes: right only in UTF8). ``conn``: autocommit."""
    if not store.packed_fetch_supported(conn):
        log.warning("producers keep staging rows: record messages need a UTF8 database", encoding="not UTF8")
        return
    risk = store.slot_safety(conn, slot, conninfos).risk
    if risk is None:
        with conn.transaction():
            store.clear_rows_hold(conn)
            store.set_emit_messages(conn, True)
        return
    # a slot made now, with messages off, holds no record message: the hold is saved; on a kept slot messages may
    # have been on (a capture wal again): the streamers read them from it, and a hold already there stays as it is
    if not fresh and store.rows_held(conn)[0] is not None:
        return
    with conn.transaction():
        store.hold_rows(conn, slot, risk, rescue=False, saved=fresh)
    log.warning("producers stage rows while the slot is at risk", slot=slot, risk=risk)


def _drain_messages(settings: Settings, conn: psycopg.Connection[Any], timeout: float = 120.0) -> None:
    """Switch producers to rows and publish every record message committed before the switch, so the slot can go:
    the switch waits for every transaction that could have written a message and commits a marker after them; a
    WAL-mode pass that has confirmed the marker's transaction has published all of them. ``conn``: autocommit.
    Run only while no streamer runs (the caller refused otherwise)."""
    marker = uuid.uuid4().hex
    store.set_emit_messages(conn, False, marker=marker)
    with Streamer(settings, StreamerConfig(restart_after_crash=False), name="capture-drain") as streamer:
        deadline = time.monotonic() + timeout
        while True:
            streamer.run_once()
            capture = streamer.capture
            if isinstance(capture, WalCapture) and marker in capture.markers:
                return
            if time.monotonic() > deadline:
                raise ConfigurationError(
                    "could not publish the record messages committed before the switch within "
                    f"{timeout:g} s: the slot is kept and producers stage rows; run the command again"
                )


def _fit_read_index(conn: psycopg.Connection[Any], captured: CaptureSlot) -> None:
    """Table mode's read index exactly while rows staged before the slot are left (a first switch, or a slot
    re-created after an outage: then every staged row predates it). Table-mode passes publish those, reading by
    the index (without it each batch scans the table); after them WAL mode has no use for it, and producers pay
    its update. ``unilog capture wal`` again, once they are published, drops it (and an invalid one, left by an
    interrupted build or drop, in either case: dropped, or rebuilt)."""
    needed = store.staged_before(conn, captured.from_xid)
    state = store.read_index_state(conn)
    if needed:
        if state != "valid":
            store.set_read_index(conn, True)  # ConfigurationError (one line, exit 3) if it cannot: run it again
            log.info("table-mode index built: rows staged before the slot go out through table-mode passes first")
        return
    if state is None:
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
        store.take_switch_lock(conn)  # from here the switch owns the mode: no guard turns messages back on
        current = store.capture_slot(conn)
        store.clear_rows_hold(conn)
        # producers to rows first, and the slot's messages out: WAL mode captures rows too, so a switch that gives
        # up after this leaves WAL mode whole, as does one that gives up on the table (each change may, behind a
        # long transaction), rather than table mode with no wake-up and a slot retaining WAL for nobody
        if current is not None:
            state = store.slot_state(conn, current.slot)
            if state is not None and state["wal_status"] != "lost":
                _drain_messages(settings, conn)  # producers stage rows from here; the slot's messages go out first
            else:
                store.set_emit_messages(conn, False, wait=False)  # a lost slot: nothing left to drain
        store.set_read_index(conn, True)  # before table-mode passes start: they read by it (built concurrently)
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
        report["records_as"] = "messages" if store.emit_messages(conn) else "rows"
        index = store.read_index_state(conn)
        report["read_index"], report["read_index_valid"] = index is not None, index == "valid"
        if current is not None:
            report |= {"slot": current.slot, "publication": current.publication, "from_xid": current.from_xid}
            report["slot_state"] = store.slot_state(conn, current.slot)
            report["safety"] = slot_report(conn, settings.standby_conninfos, current.slot)
        return report


def slot_report(conn: psycopg.Connection[Any], conninfos: tuple[str, ...], slot: str) -> dict[str, Any]:
    """Whether a failover keeps the slot: a failover slot, protected by ``synchronized_standby_slots``, the standbys
    attached, each one's copy of the slot as read on the standbys among the hosts of ``conninfos`` (Postgres 17+),
    whether failover is ready (every standby holds a copy that survives a promotion) and why not, whether logical
    decoding is held back, the hold to rows, and the losses of earlier slots not yet acknowledged."""
    safety = store.slot_safety(conn, slot, conninfos)
    reason, saved, _lsn = store.rows_held(conn)
    readiness = safety.readiness
    copies = [
        {"standby": c.standby, "host": c.host, "synced": c.ready, "why": c.why, "lag_bytes": c.lag_bytes}
        for c in (readiness.copies if readiness is not None else ())
    ]
    losses = store.capture_losses(conn, unacknowledged=True)
    return {
        "failover_ready": readiness.ready if readiness is not None else not safety.standbys,
        "failover_not_ready": readiness.reason if readiness is not None else None,
        "held_back": readiness.held_back if readiness is not None else None,
        "losses": losses,
        "walinspect": store.walinspect_ready(conn) or "ready",
        "failover": safety.failover,
        "protected": safety.protected,
        "standbys": list(safety.standbys),
        "risk": safety.risk,
        "copies": copies,
        "held_reason": reason,
        "held_saved": saved,
        "streamer_is_sync_standby": safety.streamer_is_sync_standby,
    }
