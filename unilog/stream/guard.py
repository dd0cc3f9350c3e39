"""The WAL capture's guard: producers write records as logical messages only while the capture slot cannot be lost.

A record written as a logical message exists only in the WAL until a streamer publishes it, so a slot lost before
then loses it: a promotion of a standby that has no copy of the slot (Postgres before 17, or a slot made without
``failover``), or ``max_slot_wal_keep_size`` invalidating a slot that fell behind. The guard runs in every running
streamer in WAL mode (each :data:`GUARD_INTERVAL`) and in each scrape of ``unilog metrics``; when the slot runs such
a risk it holds producers to rows (:func:`unilog.store.hold_rows`), which any capture finds again, rescuing first,
as rows, the messages no streamer has read when none streams from the slot, so the slot may then go at no cost.
When the risk has passed and the slot is ``reserved`` (the standby gone or the slot a failover slot, its WAL within
``max_wal_size``), it lets them write messages again; never while a mode switch runs. ``wal_status`` turns
``extended`` when a limit is set well before the slot is ``lost``: that margin is what the guard acts in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import structlog

from .. import store

GUARD_INTERVAL = 2.0  # seconds between a streamer's checks of its slot

log = structlog.get_logger(__name__)


def guard(
    conn: psycopg.Connection[Any],
    *,
    streaming: bool,
    in_doubt: Callable[[], bool] | None = None,
    conninfos: Sequence[str] = (),
) -> str | None:
    """Hold producers to rows while the capture slot runs a risk, release them when it has passed; return why they
    are held (None: they are not, or the database is in table mode). ``streaming``: the caller streams from the
    slot itself (a streamer), so it reads the messages already written and no rescue is needed (nor possible: a
    peek needs the slot free). ``in_doubt``: whether a batch was sent to Redis and not yet saved (then no rescue: a
    rescued row would be a second record of it); without it, no rescue either. ``conninfos``: where the standbys'
    copies of a failover slot are read (:func:`unilog.store.failover_readiness`): a standby whose copy is not
    verified there is a risk. Also keeps the slot's restart position, where a recovery reads the WAL from if the
    slot is lost. ``conn``: not autocommit; each of its transactions is ended here. A hold that cannot be made now
    is logged and tried again at the next call; a change of the slot's risk is logged once."""
    current = store.capture_slot(conn)
    if current is None:
        conn.commit()
        return None
    safety = store.slot_safety(conn, current.slot, conninfos)
    reason, _saved, _lsn = store.rows_held(conn)
    messages = store.emit_messages(conn)
    state = store.slot_state(conn, current.slot)
    store.record_restart_lsn(conn, current.slot)
    conn.commit()
    _say_changes(current.slot, safety)
    if safety.streamer_is_sync_standby:
        log.warning(
            "the WAL streamer is a synchronous standby: every commit waits for it; name the standbys in "
            "synchronous_standby_names instead of '*' (docs/guides/high-availability.md)",
            slot=current.slot,
        )
    if safety.risk is not None:
        if messages:
            rescue = _can_rescue(state, streaming) and in_doubt is not None and not in_doubt()
            hold(conn, current.slot, safety.risk, rescue=rescue)
        return safety.risk
    if reason is not None and store.release_rows(conn):
        log.info("producers write record messages again", slot=current.slot, was=reason)
        return None
    return reason


_SAID: dict[str, tuple[str | None, str | None]] = {}  # slot -> (risk, held back) last logged by this process


def _say_changes(slot: str, safety: store.SlotSafety) -> None:
    """Log the slot's risk and a hold-back of logical decoding when they change (not at every check)."""
    held_back = safety.readiness.held_back if safety.readiness is not None else None
    now = (safety.risk, held_back)
    if _SAID.get(slot) == now:
        return
    before = _SAID.get(slot, (None, None))
    _SAID[slot] = now
    if held_back != before[1]:
        if held_back:
            log.error("logical decoding is held back: nothing is streamed", slot=slot, why=held_back)
        else:
            log.info("logical decoding is no longer held back", slot=slot)
    if safety.risk != before[0]:
        if safety.risk:
            log.warning("the capture slot is at risk: producers stage rows", slot=slot, why=safety.risk)
        elif safety.readiness is not None and safety.readiness.copies:
            log.info("failover ready: every standby holds a synchronised copy of the slot", slot=slot)


def _can_rescue(state: dict[str, Any] | None, streaming: bool) -> bool:
    return not streaming and state is not None and state["active_pid"] is None and state["wal_status"] != "lost"


def hold(conn: psycopg.Connection[Any], slot: str, risk: str, *, rescue: bool) -> None:
    """:func:`unilog.store.hold_rows`, committed; a rescue that fails (a long transaction holds the emit lock, the
    rescue's time ran out, a privilege or the slot's WAL missing) falls back to a hold without one, so producers
    are on rows whatever happens. ``conn``: not autocommit."""
    try:
        rescued = store.hold_rows(conn, slot, risk, rescue=rescue)
        conn.commit()
    except psycopg.Error as exc:
        conn.rollback()
        if not rescue:
            log.warning("could not hold producers to rows yet", slot=slot, risk=risk, error=str(exc).strip())
            return
        log.warning("no rescue of the unread record messages", slot=slot, risk=risk, error=str(exc).strip())
        hold(conn, slot, risk, rescue=False)
        return
    log.warning("producers stage rows: the capture slot is at risk", slot=slot, risk=risk, rescued=rescued)
