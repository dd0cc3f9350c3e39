"""WAL capture across failovers: failover slots, the risks a slot runs, and the hold that keeps producers on rows
while it runs one.

A logical slot lives on one server. Before Postgres 17 a promoted standby has no copy of it; from 17 a slot
created with ``failover`` is copied to standbys that run ``sync_replication_slots``. A slot is also invalidated when
it retains more WAL than ``max_slot_wal_keep_size``. Records written as logical messages that a lost slot had not
delivered exist nowhere else, so while a slot runs either risk producers are *held* to rows (which any capture finds
again), and the record messages the slot has not delivered yet are *rescued*: turned into rows, in one transaction
that new emitters wait for (:func:`hold_rows`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ..errors import PublishError, UnilogError
from .connection import connect
from .pgoutput import Decoder, WalRow
from .readiness import Readiness, failover_readiness, hosts_of
from .wal import RECREATING, CaptureSlot, drop_slot, lsn_text, record_capture

FAILOVER_SLOTS_SINCE = 170000  # server_version_num of the first Postgres with failover slots
EMIT_LOCK = "unilog.emit_mode"  # unilog_stage's advisory lock, shared by every emitting transaction


def failover_slots(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server can copy a logical slot to its standbys (Postgres 17+)."""
    return conn.info.server_version >= FAILOVER_SLOTS_SINCE


def create_slot(conn: psycopg.Connection[Any], slot: str, *, failover: bool) -> None:
    """Create the logical slot, as a failover slot when ``failover`` and the server has them (autocommit: Postgres
    refuses it in a transaction that wrote)."""
    if failover and failover_slots(conn):
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, false, true)", (slot,))
    else:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))


def standbys(conn: psycopg.Connection[Any]) -> list[str]:
    """Physical standbys of this server: each streaming one (by application name), and each physical slot no one
    streams from now (a standby that is away keeps its slot, and may still be promoted)."""
    rows = conn.execute(
        """
        SELECT coalesce(nullif(r.application_name, ''), 'pid ' || r.pid) FROM pg_stat_replication r
        JOIN pg_stat_activity a ON a.pid = r.pid WHERE a.datid IS NULL
        UNION ALL
        SELECT 'slot ' || slot_name FROM pg_replication_slots WHERE slot_type = 'physical' AND NOT active
        """
    ).fetchall()
    return [str(r[0]) for r in rows]


@dataclass(frozen=True)
class SlotSafety:
    """What a failover or the WAL limit could do to the capture slot now. ``risk``: why records written as
    messages could be lost (None: they cannot); ``failover``: the slot is a failover slot; ``protected``:
    ``synchronized_standby_slots`` is set, so the streamer never gets ahead of a standby; ``wal_status``: as
    ``pg_replication_slots`` says (None: no such slot); ``readiness``: for a failover slot, whether every standby
    holds a copy that survives a promotion, verified on the standbys (:mod:`unilog.store.readiness`)."""

    risk: str | None
    failover: bool
    protected: bool
    standbys: tuple[str, ...]
    wal_status: str | None
    streamer_is_sync_standby: bool = False  # synchronous_standby_names matched the streamer's walsender ('*')
    readiness: Readiness | None = None


def slot_safety(conn: psycopg.Connection[Any], slot: str, conninfos: Sequence[str] = ()) -> SlotSafety:
    """The slot's :class:`SlotSafety`. ``conninfos``: where the standbys' copies of a failover slot are read (the
    hosts of ``DATABASE_URL`` and ``UNILOG_STANDBY_URLS``); a standby attached whose copy is not read there, or not
    ready, is a risk: the slot's ``failover`` flag alone says nothing about a standby's configuration."""
    newer = failover_slots(conn)
    row = conn.execute(
        sql.SQL("SELECT wal_status, safe_wal_size, {} FROM pg_replication_slots WHERE slot_name = %s").format(
            sql.SQL("failover" if newer else "false")
        ),
        (slot,),
    ).fetchone()
    attached = tuple(standbys(conn))
    protected = newer and bool(_setting(conn, "synchronized_standby_slots"))
    if row is None:
        return SlotSafety(f"slot {slot!r} does not exist", False, protected, attached, None)
    status, safe, failover = row
    sync = conn.execute(_SYNC_WALSENDER, (slot,)).fetchone() is not None
    readiness = failover_readiness(conn, slot, conninfos) if failover else None
    risk = None
    if status in ("lost", "unreserved") or (status == "extended" and safe is not None):
        risk = f"slot {slot!r} is near max_slot_wal_keep_size (wal_status {status})"
    elif attached and not failover:
        why = f"Postgres {conn.info.server_version // 10000} has no failover slots" if not newer else "created so"
        risk = f"a standby is attached ({', '.join(attached)}) and slot {slot!r} is not a failover slot ({why})"
    elif readiness is not None and not readiness.ready:
        risk = readiness.reason
    return SlotSafety(risk, bool(failover), protected, attached, status, sync, readiness)


# The slot's walsender chosen as a synchronous standby: then every commit waits for the streamer's confirmation.
_SYNC_WALSENDER = """
    SELECT 1 FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid
    WHERE s.slot_name = %s AND r.sync_state IN ('sync', 'quorum')
"""


def _setting(conn: psycopg.Connection[Any], name: str) -> str:
    row = conn.execute("SELECT current_setting(%s, true)", (name,)).fetchone()
    return str(row[0] or "") if row else ""


def rows_held(conn: psycopg.Connection[Any]) -> tuple[str | None, bool, int | None]:
    """(why producers are held to rows, None if they are not; whether every message before the hold was delivered
    or rescued; the WAL position when they were switched, None without a hold)."""
    row = conn.execute("SELECT held_reason, held_saved, (held_lsn - '0/0')::bigint FROM unilog_capture").fetchone()
    return (row[0], bool(row[1]), None if row[2] is None else int(row[2])) if row else (None, False, None)


def hold_rows(
    conn: psycopg.Connection[Any],
    slot: str,
    reason: str,
    *,
    rescue: bool,
    saved: bool = False,
    lock_timeout: float = 2.0,
) -> int | None:
    """Hold producers to rows, in the transaction ``conn`` is in (the caller commits), and return the messages
    rescued (None: no rescue was tried or it could not be made; then ``held_saved`` is ``saved``: true only where
    the caller knows no record message can be waiting in the slot, as for a slot just created with messages off).

    The mode is a sequence, which no rollback undoes: a failure after the switch leaves producers on rows, which is
    safe, and the caller's retry without a rescue (:func:`unilog.stream.guard.hold`) writes the hold.

    With ``rescue``, the transaction takes the slot's streaming lock (the one a streamer takes before it reads the
    saved mark and opens the slot: while the rescue holds it no streamer can start, and if a streamer holds it there
    is no rescue) and the emit lock exclusively: it waits for every open transaction that may write a record
    message (up to ``lock_timeout``; then ``psycopg.errors.LockNotAvailable``), each one that starts meanwhile waits
    for it, and the whole rescue is bounded by ``statement_timeout`` (10 s, then an error: nothing rescued, the
    caller holds without). Once the WAL written so far is flushed (an asynchronous commit's message must be in what
    the peek reads), every record message the slot has not delivered and no streamer published (at or before the
    saved mark) is staged again as a row, in commit order, and the mark moves past them, so a streamer that reads
    them later skips them; the rows are captured in this transaction's commit, before any row a held producer
    stages after it, so each key keeps its order. Run it only when no batch is in doubt (sent to Redis, not yet
    saved): a rescued row would be a second record of it."""
    # the rescue first: its flush check waits for the WAL written so far, which must not include this transaction's
    messages = _rescue(conn, slot, lock_timeout) if rescue else None
    conn.execute(
        "UPDATE unilog_capture SET held_reason = %s, held_lsn = pg_current_wal_insert_lsn(), held_saved = %s",
        (reason, saved),
    )
    conn.execute("SELECT setval('unilog_emit_mode', 0)")
    for stream, _row, _mark, body, trace in messages or []:
        data, action, obj, created, key = _fields(body)
        parent, state, typed = (*_fields(trace), "", "", "")[:3]
        conn.execute(
            _RESCUE, (stream, data, action, obj, created, key or None, parent or None, state or None, typed or None)
        )
    if messages:
        last = messages[-1][2]
        assert last is not None
        conn.execute("UPDATE unilog_capture SET message_lsn = '0/0'::pg_lsn + %s::numeric, message_ordinal = %s", last)
    if messages is not None:
        conn.execute("UPDATE unilog_capture SET held_saved = true, held_lsn = pg_current_wal_insert_lsn()")
    return None if messages is None else len(messages)


def _rescue(conn: psycopg.Connection[Any], slot: str, lock_timeout: float) -> list[WalRow] | None:
    """The locks and the flush :func:`hold_rows` needs, then the undelivered messages; None if a streamer holds
    the slot or the WAL was not flushed within the time."""
    if not conn.execute(_TRY_SLOT_LOCK, (f"unilog.slot:{slot}",)).fetchone()[0]:  # type: ignore[index]
        return None
    conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{int(lock_timeout * 1000)}ms")))
    conn.execute("SET LOCAL statement_timeout = '10s'")
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (EMIT_LOCK,))
    target = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]  # type: ignore[index]
    deadline = time.monotonic() + 2.0
    while not conn.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (target,)).fetchone()[0]:  # type: ignore[index]
        if time.monotonic() > deadline:  # the WAL writer flushes asynchronous commits within 3 wal_writer_delay
            return None
        time.sleep(0.01)
    return _undelivered(conn, slot)


# The lock a streamer's replication session takes (unilog.store.wal.ReplicationStream._claim), here for the
# rescue's transaction only.
_TRY_SLOT_LOCK = "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))"
SWITCH_LOCK = "unilog.capture_switch"  # held by a mode switch for its whole run: no hold is released meanwhile


def release_rows(conn: psycopg.Connection[Any]) -> bool:
    """End a hold (producers back to messages), in one transaction of ``conn``; False if there was none, a mode
    switch is running (it owns the mode), or the slot's WAL is at risk (``extended`` under a limit, or worse): all
    re-checked under the
    capture row's lock, which a lost slot's switch to rows (:func:`lock_capture`) takes too."""
    free = conn.execute("SELECT pg_try_advisory_xact_lock_shared(hashtextextended(%s, 0))", (SWITCH_LOCK,)).fetchone()
    if not (free and free[0]):
        conn.commit()
        return False
    row = conn.execute(
        """
        SELECT 1 FROM unilog_capture c JOIN pg_replication_slots s ON s.slot_name = c.slot_name
        WHERE c.held_reason IS NOT NULL
          AND (s.wal_status = 'reserved' OR (s.wal_status = 'extended' AND s.safe_wal_size IS NULL))
        FOR UPDATE OF c
        """
    ).fetchone()
    if row is not None:
        conn.execute("UPDATE unilog_capture SET held_reason = NULL, held_lsn = NULL, held_saved = false")
        conn.execute("SELECT setval('unilog_emit_mode', 1)")
    conn.commit()
    return row is not None


def lock_capture(conn: psycopg.Connection[Any]) -> None:
    """Lock the capture row in ``conn``'s transaction: a release in flight finishes first, and none starts."""
    conn.execute("SELECT 1 FROM unilog_capture FOR UPDATE")


def take_switch_lock(conn: psycopg.Connection[Any]) -> None:
    """A mode switch's session lock (``conn``: the switch's own session, held until it closes): no hold is
    released while a switch runs."""
    conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (SWITCH_LOCK,))


def clear_rows_hold(conn: psycopg.Connection[Any]) -> None:
    """Forget a hold without touching the mode (a mode switch owns the mode from here; it waits for a release in
    flight through the row lock)."""
    conn.execute("UPDATE unilog_capture SET held_reason = NULL, held_lsn = NULL, held_saved = false")


def _undelivered(conn: psycopg.Connection[Any], slot: str) -> list[WalRow]:
    """The record messages in the slot past the saved mark, in commit order (a peek: the slot does not move)."""
    mark_row = conn.execute("SELECT (message_lsn - '0/0')::bigint, message_ordinal FROM unilog_capture").fetchone()
    mark = (int(mark_row[0]), int(mark_row[1])) if mark_row else (0, -1)
    publication = conn.execute("SELECT publication FROM unilog_capture").fetchone()
    decoder = Decoder()
    found: list[WalRow] = []
    with conn.cursor(name="unilog_rescue") as changes:  # a server-side cursor: the backlog may be large
        changes.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1', "
            "'publication_names', %s, 'messages', 'true')",
            (slot, publication[0] if publication else "unilog_staged"),
        )
        for (data,) in changes:
            done = decoder.feed(bytes(data))
            if done is not None:
                found.extend(r for r in done.rows if r[1] is None and r[2] is not None and r[2] > mark)
    return found


def _fields(resp: bytes) -> tuple[str, ...]:
    """The bulk strings of ``resp`` (``$len CRLF bytes CRLF`` each), as text."""
    out: list[str] = []
    pos = 0
    while pos < len(resp):
        eol = resp.index(b"\r\n", pos)
        size = int(resp[pos + 1 : eol])
        value = resp[eol + 2 : eol + 2 + size]
        out.append(value.decode())
        pos = eol + 4 + size
    return tuple(out)


# A record message's five publish arguments (data, action, object, created in ms, key), then its tail: its trace
# context's two and its type, each maybe absent.
_RESCUE = """
    INSERT INTO staged_log_records (stream, data, action, object, created_at, key, traceparent, tracestate,
                                    record_type)
    VALUES (%s, %s::jsonb, %s, %s, to_timestamp(%s::bigint / 1000.0), %s, %s, %s, %s)
"""


class SlotBusyError(PublishError):
    """The slot's streaming lock stayed taken while a lost slot was being replaced: retried by the loop."""


def try_slot_lock(conn: psycopg.Connection[Any], slot: str) -> bool:
    """Take the slot's streaming lock for ``conn``'s session (the one a streamer's replication session holds while it
    streams), committed; False if another session holds it. Released by :func:`release_slot_lock` or the session's
    end. While it is held no streamer opens the slot."""
    row = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (f"unilog.slot:{slot}",)).fetchone()
    conn.commit()
    return bool(row and row[0])


def _try_lock(conn: psycopg.Connection[Any], key: str) -> bool:
    row = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (key,)).fetchone()
    return bool(row and row[0])


def release_slot_lock(conn: psycopg.Connection[Any], slot: str) -> None:
    """Release :func:`try_slot_lock`'s lock, committed."""
    conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (f"unilog.slot:{slot}",))
    conn.commit()


def recreate_slot(
    conninfo: str, capture: CaptureSlot, *, locked: bool = False, created: Callable[[], None] | None = None
) -> None:
    """Replace a lost capture slot by a new one of the same name (a failover slot where the server has them), and
    take ``from_xid`` again: every row staged before it is then published by table-mode passes first, as after
    ``unilog capture wal --recreate``. For a streamer that found its slot lost at no cost (producers were held to
    rows, every record message before published or rescued) and no batch in doubt."""
    with connect(conninfo, autocommit=True, application_name="unilog-capture") as conn:
        # the slot's streaming lock for the whole replacement (released with this session): another streamer cannot
        # open the new slot before its from_xid is recorded, which would skip the rows staged before it
        # (``locked``: the caller's session holds it already)
        key = f"unilog.slot:{capture.slot}"
        deadline = time.monotonic() + 10.0
        while not locked and not _try_lock(conn, key):
            if time.monotonic() > deadline:
                raise SlotBusyError(f"another session holds slot {capture.slot!r}'s streaming lock: tried again later")
            time.sleep(0.05)
        # from_xid goes to RECREATING first: a process that dies before the new slot's own from_xid is recorded
        # leaves a capture no streamer streams (it re-creates the slot again), never a new slot under the old
        # from_xid, whose rows staged before the new slot (above the old from_xid) no pass would publish
        conn.execute("UPDATE unilog_capture SET from_xid = %s::xid8", (RECREATING,))
        if conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (capture.slot,)).fetchone():
            drop_slot(conn, capture.slot)
        create_slot(conn, capture.slot, failover=True)
        if created is not None:
            created()
        record_capture(conn, capture.slot, capture.publication)


def count_record_messages(conn: psycopg.Connection[Any], start: int, end: int) -> int | None:
    """How many logical messages other than switch markers the WAL holds between ``start`` and ``end`` (an upper
    bound on the record messages of that range a lost slot had not delivered: some may belong to transactions that
    rolled back), read with ``pg_walinspect`` where it is installed and the WAL is still on disk; None otherwise
    (Postgres 15's description of a message does not name its prefix: markers are counted there too)."""
    try:
        with conn.transaction():
            row = conn.execute(_MESSAGES_BETWEEN, (lsn_text(start), lsn_text(end))).fetchone()
    except psycopg.Error:
        return None
    return int(row[0]) if row else None


_MESSAGES_BETWEEN = """
    SELECT count(*) FROM pg_get_wal_records_info(%s::pg_lsn, least(%s::pg_lsn, pg_current_wal_flush_lsn()))
    WHERE resource_manager = 'LogicalMessage' AND description NOT LIKE '%%prefix "unilog-switch"%%'
"""


def standby_copies(conninfo: str, slot: str, timeout: float = 3.0) -> list[dict[str, Any]]:
    """The copies of ``slot`` on the standbys among ``conninfo``'s hosts (a multi-host URL names them): for each
    host that is a standby now, whether its copy is ready to take over (Postgres 17+'s ``synced``, no longer
    ``temporary``, not invalidated: a copy stays temporary until the primary's slot moves on after it was made, and a
    promotion drops a temporary copy) and its confirmed position. Hosts that cannot be reached, and primaries, are
    left out."""
    copies = []
    for host, single in hosts_of(conninfo):
        try:
            conn = connect(single, autocommit=True, application_name="unilog-status", timeout=timeout, standby=True)
        except UnilogError:
            continue
        with conn:
            if conn.info.parameter_status("in_hot_standby") != "on" or not failover_slots(conn):
                continue
            row = conn.execute(
                "SELECT synced AND NOT temporary AND invalidation_reason IS NULL, confirmed_flush_lsn::text "
                "FROM pg_replication_slots "
                "WHERE slot_name = %s",
                (slot,),
            ).fetchone()
            copies.append(
                {"host": host, "synced": bool(row and row[0]), "confirmed_flush_lsn": row[1] if row else None}
            )
    return copies
