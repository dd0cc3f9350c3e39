"""WAL capture's Postgres side: the replication stream of one logical slot, and the SQL that manages capture.

A database is in WAL capture mode when ``unilog_capture`` has its row (``unilog capture wal``): a publication on
``staged_log_records`` (inserts only) and a logical replication slot with Postgres's own ``pgoutput`` plugin. The
streamer then reads committed inserts in commit order over the streaming replication protocol (``COPY BOTH`` on a
``replication=database`` session, driven through psycopg's libpq wrapper) and confirms a transaction's end LSN to
the slot only after its records are in Redis and their staged rows deleted. A staged row exists exactly until its
record was published, so a record the WAL delivers again (a crash before the slot's confirmation) or one also
published by a table-mode pass (a switch of modes) is recognised by its row being gone.
"""

from __future__ import annotations

import select
import struct
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq, sql

from ..config import redact_url
from ..errors import CaptureLost, ConfigurationError
from .connection import connect_options, deadline, next_result, standby_refusal, unreachable
from .positions import save_positions

PUBLICATION = "unilog_staged"
# table mode finds by it the rows of transactions that were open at a claim; WAL mode drops it
READ_INDEX = "staged_log_records_stream_xid_id"
DDL_LOCK_TIMEOUT = 5.0  # seconds a mode switch's DDL waits for a lock or for older transactions
STATUS_INTERVAL = 10.0  # seconds between status updates while idle (the server's wal_sender_timeout is 60 s)
_PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in microseconds since the Unix epoch
_XLOG_HEADER = struct.Struct("!cQQQ")
_KEEPALIVE = struct.Struct("!cQQ?")
_STATUS = struct.Struct("!cQQQQ?")


@dataclass(frozen=True)
class CaptureSlot:
    """A database's WAL capture: its slot, its publication, and ``from_xid``: rows with a lower xid may have
    committed before the slot existed, so a table-mode pass publishes those first."""

    slot: str
    publication: str
    from_xid: str


# The capture's from_xid while a lost slot's replacement is made (unilog.store.failover.recreate_slot): no xid is 0,
# so no streamer opens the slot under it; one that finds it left by a process that died re-creates the slot again
RECREATING = "0"


def capture_slot(conn: psycopg.Connection[Any]) -> CaptureSlot | None:
    """The database's WAL capture, or None in table mode."""
    row = conn.execute("SELECT slot_name, publication, from_xid::text FROM unilog_capture").fetchone()
    return CaptureSlot(*row) if row else None


def wal_level(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT current_setting('wal_level')").fetchone()
    return str(row[0]) if row else ""


def default_slot_name(conn: psycopg.Connection[Any]) -> str:
    """``unilog_<database oid>``: slot names are cluster-wide, so one per database."""
    row = conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()
    assert row is not None
    return f"unilog_{row[0]}"


def slot_state(conn: psycopg.Connection[Any], slot: str) -> dict[str, Any] | None:
    """The slot as ``pg_replication_slots`` shows it, or None if it does not exist: its streamer's pid (None: no
    session streams from it), its WAL status, and two distances in bytes from the current WAL position:
    ``retained_bytes`` (to ``restart_lsn``: the WAL the server keeps on disk for the slot) and
    ``confirmed_lag_bytes`` (to ``confirmed_flush_lsn``: what the streamer has not confirmed yet), None where the
    slot has no such position (a lost slot has no ``restart_lsn``)."""
    row = conn.execute(
        """
        SELECT active_pid, wal_status, confirmed_flush_lsn::text, restart_lsn::text,
               pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint,
               pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint
        FROM pg_replication_slots WHERE slot_name = %s
        """,
        (slot,),
    ).fetchone()
    if row is None:
        return None
    keys = ("active_pid", "wal_status", "confirmed_flush_lsn", "restart_lsn", "retained_bytes", "confirmed_lag_bytes")
    return dict(zip(keys, row, strict=True))


def ensure_publication(conn: psycopg.Connection[Any], publication: str) -> None:
    if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)).fetchone() is None:
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE staged_log_records WITH (publish = 'insert')").format(
                sql.Identifier(publication)
            )
        )


def drop_slot(conn: psycopg.Connection[Any], slot: str, timeout: float = 10.0) -> None:
    """Drop the slot (autocommit). A streamer that just closed its replication session (a mode switch's own drain)
    leaves a walsender that lets go of the slot a moment later: wait for it, up to ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            )
            return
        except psycopg.errors.ObjectInUse:
            if time.monotonic() > deadline:
                raise ConfigurationError(
                    f"replication slot {slot!r} is still in use by a streaming session (see pg_stat_replication): "
                    "stop the streamer and run the command again"
                ) from None
            time.sleep(0.05)


def record_capture(conn: psycopg.Connection[Any], slot: str, publication: str) -> None:
    """Put the database in WAL capture mode with ``from_xid`` taken now (after the slot was created): every
    transaction that takes an xid from here on commits after the slot's consistent point, so it is in the WAL."""
    conn.execute(
        """
        INSERT INTO unilog_capture (slot_name, publication, from_xid, restart_lsn)
        VALUES (%s, %s, pg_snapshot_xmax(pg_current_snapshot()),
                (SELECT restart_lsn FROM pg_replication_slots WHERE slot_name = %s))
        ON CONFLICT (singleton) DO UPDATE SET slot_name = excluded.slot_name, publication = excluded.publication,
            from_xid = excluded.from_xid, enabled_at = now(), message_lsn = '0/0', message_ordinal = -1,
            restart_lsn = excluded.restart_lsn
        """,
        (slot, publication, slot),
    )


def emit_messages(conn: psycopg.Connection[Any]) -> bool:
    """Whether producers write records as logical messages now (WAL capture mode) rather than rows."""
    row = conn.execute("SELECT last_value = 1 FROM unilog_emit_mode").fetchone()
    return bool(row and row[0])


def set_emit_messages(
    conn: psycopg.Connection[Any], messages: bool, *, marker: str | None = None, wait: bool = True
) -> int | None:
    """Switch how producers stage records (``unilog_stage`` reads the mode, a sequence, as it is now whatever the
    producer's snapshot): logical messages, or rows. No lock is taken, so no producer ever waits for a switch.

    Turning messages off with ``wait``, then waits (polling, queueing for no lock) until every transaction that
    holds the message writers' shared lock has ended: a producer writes a message only after taking it and reading
    the mode again under it, so one that takes it after the switch looked writes a row, and from then on no record
    message will ever be committed. With ``marker``, it then commits a marker message, after all of them: a WAL
    reader that has passed it has read every record message. Returns the marker's LSN (None without one). A
    transaction still open after DDL_LOCK_TIMEOUT raises :class:`ConfigurationError` (producers stage rows
    already; the slot is kept, and the command can be run again). ``conn``: autocommit, for the wait and the
    marker."""
    conn.execute("SELECT setval('unilog_emit_mode', %s)", (1 if messages else 0,))
    if messages or not wait:
        return None
    _wait_for_open_transactions(conn, DDL_LOCK_TIMEOUT)
    if marker is None:
        return None
    row = conn.execute(
        "SELECT (pg_logical_emit_message(true, 'unilog-switch', %s) - '0/0')::bigint", (marker,)
    ).fetchone()
    return int(row[0]) if row else None


def _wait_for_open_transactions(conn: psycopg.Connection[Any], timeout: float) -> None:
    """Wait until every transaction that holds the message writers' lock now has ended; each also holds the lock on
    its own virtual transaction id until it ends, so their set is read from ``pg_locks`` once and polled."""
    row = conn.execute(_OPEN_TRANSACTIONS).fetchone()
    open_now = list(row[0] or []) if row else []
    deadline = time.monotonic() + timeout
    while open_now:
        row = conn.execute(_STILL_OPEN, (open_now,)).fetchone()
        still = list(row[0] or []) if row else []
        if not still:
            return
        if time.monotonic() > deadline:
            raise ConfigurationError(
                f"producers now stage rows, but a transaction that may have written a record message is still open "
                f"after {timeout:g} s (pid {', '.join(map(str, still))}: see pg_stat_activity): end it and run the "
                "command again"
            )
        time.sleep(0.01)


# Holders of unilog_stage's advisory lock on 'unilog.emit_mode' (a bigint key: its high half in classid, its low
# half in objid, objsubid 1) in this database.
_OPEN_TRANSACTIONS = """
    WITH k AS (SELECT hashtextextended('unilog.emit_mode', 0) AS key)
    SELECT array_agg(l.virtualtransaction) FROM pg_locks l, k
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid::text::bigint = (k.key >> 32) & 4294967295 AND l.objid::text::bigint = k.key & 4294967295
"""
_STILL_OPEN = """
    SELECT array_agg(DISTINCT pid) FROM pg_locks
    WHERE locktype = 'virtualxid' AND granted AND virtualxid = ANY(%s)
"""


def message_mark(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """The (commit LSN, ordinal) of the last record message published from the slot ((0, -1): none yet)."""
    row = conn.execute("SELECT (message_lsn - '0/0')::bigint, message_ordinal FROM unilog_capture").fetchone()
    return (int(row[0]), int(row[1])) if row else (0, -1)


def forget_capture(conn: psycopg.Connection[Any]) -> None:
    conn.execute("DELETE FROM unilog_capture")


def set_notify_trigger(conn: psycopg.Connection[Any], enabled: bool) -> None:
    """The commit wake-up for table mode; WAL mode reads the replication stream and producers skip the NOTIFY."""
    action = "ENABLE" if enabled else "DISABLE"
    _locked_ddl(conn, f"ALTER TABLE staged_log_records {action} TRIGGER staged_log_records_notify")


def read_index_state(conn: psycopg.Connection[Any]) -> str | None:
    """Table mode's read index: ``"valid"``, ``"invalid"`` (left by a concurrent build or drop that failed or was
    interrupted: queries do not use it, producers may still update it) or None (absent)."""
    row = conn.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", (READ_INDEX,)).fetchone()
    return None if row is None else "valid" if row[0] else "invalid"


def has_read_index(conn: psycopg.Connection[Any]) -> bool:
    """Whether the read index exists (valid or not)."""
    return read_index_state(conn) is not None


def set_read_index(conn: psycopg.Connection[Any], present: bool) -> None:
    """Build or drop the (stream, xid, id) index that table-mode passes read by. WAL mode reads the slot and deletes
    by primary key, so there it only costs every producer an index update; a switch back to table mode rebuilds it.

    Both run ``CONCURRENTLY``: the build takes a lock producers' inserts do not wait for (a plain ``CREATE INDEX``
    holds every producer for the whole build, which on a large backlog is seconds or minutes), so ``conn`` must be
    in autocommit mode, and each statement commits. An invalid index, what a concurrent build that failed or was
    interrupted leaves behind, is dropped first and built again. Each statement gives up after ``DDL_LOCK_TIMEOUT``
    (:class:`ConfigurationError`, one line) when a long or idle transaction keeps it waiting."""
    if not conn.autocommit:
        raise ValueError("set_read_index needs an autocommit connection (CONCURRENTLY runs outside a transaction)")
    state = read_index_state(conn)
    if state == "invalid" or (state == "valid" and not present):
        _concurrent_ddl(conn, f"DROP INDEX CONCURRENTLY IF EXISTS {READ_INDEX}")
    if present and state != "valid":
        _concurrent_ddl(
            conn, f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {READ_INDEX} ON staged_log_records (stream, xid, id)"
        )
        if read_index_state(conn) != "valid":  # IF NOT EXISTS found another session's build still running
            raise ConfigurationError(
                f"another session is building {READ_INDEX} (see pg_stat_progress_create_index): run the command "
                "again once it is done"
            )


def _concurrent_ddl(conn: psycopg.Connection[Any], statement: str) -> None:
    """Run ``CREATE``/``DROP INDEX CONCURRENTLY`` on the staging table (autocommit), giving up after
    DDL_LOCK_TIMEOUT. Its lock lets producers insert; it waits only for transactions that were open on the table
    (or held a snapshot) when it began, and a long or idle one would keep it waiting without end."""
    conn.execute(f"SET lock_timeout = '{int(DDL_LOCK_TIMEOUT * 1000)}ms'")
    try:
        conn.execute(statement)
    except psycopg.errors.LockNotAvailable:
        raise _not_locked() from None
    except psycopg.errors.QueryCanceled:
        raise ConfigurationError(
            f"changing {READ_INDEX} was cancelled; the invalid index it leaves is dropped by the next run: run the "
            "command again"
        ) from None
    finally:
        conn.execute("RESET lock_timeout")


def _locked_ddl(conn: psycopg.Connection[Any], statement: str) -> None:
    """Run DDL on the staging table, giving up after DDL_LOCK_TIMEOUT: a DDL lock request queued behind a long (or
    idle) transaction on the table would stall every producer queued behind it."""
    try:
        with conn.transaction():
            conn.execute(f"SET LOCAL lock_timeout = '{int(DDL_LOCK_TIMEOUT * 1000)}ms'")
            conn.execute(statement)
    except psycopg.errors.LockNotAvailable:
        raise _not_locked() from None


def _not_locked() -> ConfigurationError:
    return ConfigurationError(
        f"could not lock staged_log_records within {DDL_LOCK_TIMEOUT:g} s: a long or idle-in-transaction session "
        "holds it (see pg_stat_activity); end it and run the command again"
    )


def staged_before(conn: psycopg.Connection[Any], from_xid: str) -> bool:
    """Whether staged rows of transactions that may have committed before the slot existed are left."""
    row = conn.execute("SELECT EXISTS (SELECT 1 FROM staged_log_records WHERE xid < %s::xid8)", (from_xid,)).fetchone()
    return bool(row and row[0])


def sources_before(conn: psycopg.Connection[Any], from_xid: str) -> list[str]:
    """The ``stream`` values of the staged rows :func:`staged_before` finds (a scan of them: for the rare look at
    what a table-mode pass left of them)."""
    rows = conn.execute("SELECT DISTINCT stream FROM staged_log_records WHERE xid < %s::xid8", (from_xid,))
    return [r[0] for r in rows.fetchall()]


def wal_insert_lsn(conn: psycopg.Connection[Any]) -> int:
    """The end of the WAL written so far: a committed transaction's records all lie before it."""
    row = conn.execute("SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint").fetchone()
    return int(row[0]) if row else 0


def any_staged(conn: psycopg.Connection[Any], since_xid: str | None = None) -> bool:
    """Whether committed rows are staged (those of transactions from ``since_xid`` on, given: the slot's)."""
    if since_xid is None:
        row = conn.execute("SELECT EXISTS (SELECT 1 FROM staged_log_records)").fetchone()
    else:
        query = "SELECT EXISTS (SELECT 1 FROM staged_log_records WHERE xid >= %s::xid8)"
        row = conn.execute(query, (since_xid,)).fetchone()
    return bool(row and row[0])


def existing_ids(conn: psycopg.Connection[Any], ids: list[int], xids: list[int], timeout: float = 10.0) -> set[int]:
    """Which of these staged ids still have their row (not published yet); primary-key look-ups, no scan.

    A transaction's commit record reaches the WAL (and the slot's stream) a moment before the transaction stops
    counting as running for new snapshots, so a row missing from a snapshot taken in that moment is not gone but not
    yet visible. The look-up therefore waits until a snapshot sees every transaction of the batch (``xids``, the
    32-bit ids of pgoutput's begin messages) as ended: only then is a missing row a published one.
    """
    deadline = time.monotonic() + timeout
    while True:
        row = conn.execute(_SEES_ALL, (xids,)).fetchone()
        if row and row[0]:
            break
        conn.commit()  # a new snapshot for the next look
        if time.monotonic() > deadline:
            raise psycopg.OperationalError("transactions the WAL reported committed stayed running: retrying")
        time.sleep(0.001)
    return {r[0] for r in conn.execute("SELECT id FROM staged_log_records WHERE id = ANY(%s)", (ids,))}


# Whether the current snapshot sees these transactions as ended. A 32-bit xid from the WAL is widened to the xid8 of
# the snapshot's epoch (an xid just above the snapshot's xmax is one not completed yet: same epoch, not visible), or
# of the epoch before when it lies more than 2^31 above (the counter wrapped since): they are all recent.
_SEES_ALL = """
    WITH now AS (SELECT pg_current_snapshot() AS snap,
                        pg_snapshot_xmax(pg_current_snapshot())::text::numeric AS top)
    SELECT coalesce(bool_and(pg_visible_in_snapshot(
        (CASE WHEN x - top %% 4294967296 > 2147483648 THEN top - top %% 4294967296 - 4294967296 + x
              ELSE top - top %% 4294967296 + x END)::text::xid8, snap)), true)
    FROM now, unnest(%s::bigint[]) AS x
"""


def delete_ids(
    conn: psycopg.Connection[Any],
    ids: list[int],
    epoch: int,
    last_seqs: dict[str, int],
    mark: tuple[int, int] | None = None,
) -> int:
    """Delete published rows by id, advance each target stream's position and, with ``mark``, the last record
    message published, in the caller's transaction; return the rows deleted (the caller checks it is ``len(ids)``)."""
    deleted = conn.execute("DELETE FROM staged_log_records WHERE id = ANY(%s)", (ids,)).rowcount if ids else 0
    save_positions(conn, epoch, last_seqs)
    if mark is not None:
        conn.execute("UPDATE unilog_capture SET message_lsn = '0/0'::pg_lsn + %s::numeric, message_ordinal = %s", mark)
    return deleted


def published_positions(conn: psycopg.Connection[Any]) -> list[tuple[str, int, int]]:
    """(stream, epoch, last seq) of every stream this database has published to."""
    return [(r[0], r[1], r[2]) for r in conn.execute("SELECT stream, epoch, last_seq FROM unilog_stream_positions")]


def lsn_text(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


class SlotBusy(Exception):
    """Another session streams from the slot (another streamer owns this database's capture)."""


class SlotReplaced(Exception):
    """The slot was re-created since this streamer read the database's capture: it must read it again."""


class ReplicationStream:
    """One logical slot's changes over the streaming replication protocol, as raw pgoutput messages.

    :meth:`read` returns what has arrived (waiting up to ``wait`` seconds for the first message), answering the
    server's keep-alives; :meth:`confirm` reports an LSN as flushed, which lets the slot drop everything before it.
    A broken stream raises ``psycopg.OperationalError`` (retried by the worker loop, which restarts from the slot's
    confirmed position); a slot that is gone or invalidated raises :class:`CaptureLost`.
    """

    def __init__(self, conninfo: str, slot: CaptureSlot, *, application_name: str, timeout: float | None) -> None:
        options = connect_options(application_name, timeout)
        options["options"] = "-c datestyle=ISO -c timezone=UTC"  # how created_at's text is parsed
        try:
            self.conn = psycopg.connect(conninfo, autocommit=True, replication="database", **options)
        except psycopg.OperationalError as exc:
            raise unreachable(conninfo, exc) from None
        if (standby := standby_refusal(self.conn, conninfo)) is not None:
            self.conn.close()  # a standby's copy of a failover slot is not to be read: wait for the promotion
            try:
                raise standby
            finally:
                del standby  # it holds the error, whose traceback holds this frame: a cycle
        self.conninfo, self.slot = conninfo, slot
        self.flushed = 0  # the last LSN confirmed to the server
        self._received_end = 0  # the server's WAL end as last reported
        self._last_status = 0.0
        try:  # a server gone silent (paused, blackholed) is given the session's timeout, not forever
            with deadline(self.conn, timeout):
                self._claim()
                self._start()
        except BaseException:
            self.close()
            raise

    def _claim(self) -> None:
        """Take the slot's advisory lock on this connection (it lives as long as the stream does), and check that
        no other session streams the slot, before ``START_REPLICATION``: a refused one writes an ERROR line in the
        server's log, which a standby streamer retrying every second filled. Raises :class:`SlotBusy`."""
        key = sql.Literal(f"unilog.slot:{self.slot.slot}").as_bytes(self.conn)
        name = sql.Literal(self.slot.slot).as_bytes(self.conn)
        # the simple query protocol: a replication connection takes SQL, but not psycopg's extended protocol
        result = self.conn.pgconn.exec_(
            b"SELECT pg_try_advisory_lock(hashtextextended(" + key + b", 0)) AND NOT EXISTS "
            b"(SELECT 1 FROM pg_replication_slots WHERE slot_name = " + name + b" AND active_pid IS NOT NULL)"
        )
        free = result.status == pq.ExecStatus.TUPLES_OK and result.get_value(0, 0) == b"t"
        if not free:
            self.close()
            raise SlotBusy(f"another session streams from slot {self.slot.slot!r}")
        # with the lock held, the capture row must still be the one this stream was made for: a slot re-created
        # by another streamer (a lost slot replaced) has a new from_xid, and rows staged before it go out first
        row = self.conn.pgconn.exec_(b"SELECT from_xid::text FROM unilog_capture")
        current = row.get_value(0, 0) if row.status == pq.ExecStatus.TUPLES_OK and row.ntuples else None
        if current is not None and current.decode() != self.slot.from_xid:
            self.close()
            raise SlotReplaced(f"slot {self.slot.slot!r} was re-created by another streamer: the capture is read again")

    def _start(self) -> None:
        pgconn = self.conn.pgconn
        query = sql.SQL(
            "START_REPLICATION SLOT {} LOGICAL 0/0 (proto_version '1', publication_names {}, messages 'true')"
        ).format(
            sql.Identifier(self.slot.slot), sql.Literal(sql.Identifier(self.slot.publication).as_string(self.conn))
        )
        pgconn.send_query(query.as_bytes(self.conn))
        result = next_result(pgconn)
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            self._refused(result)

    def _refused(self, result: pq.abc.PGresult | None) -> None:
        state = (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode() if result else ""
        raw = (result.error_message if result else self.conn.pgconn.error_message).decode()
        message = "; ".join(line.strip().removeprefix("ERROR:").strip() for line in raw.splitlines() if line.strip())
        self.close()
        if state == "55006":
            raise SlotBusy(message)
        if state in ("42704", "55000"):  # no such slot; the slot was invalidated (its WAL was removed)
            raise CaptureLost(
                f"WAL capture slot {self.slot.slot!r} at {redact_url(self.conninfo)} is unusable ({message}): run "
                "`unilog capture wal --recreate` (or `unilog capture table`) and restart the streamer "
                "(docs/guides/wal-capture.md)"
            )
        raise psycopg.OperationalError(f"START_REPLICATION refused: {message}")

    def socket(self) -> int:
        return int(self.conn.pgconn.socket)

    def read(self, max_messages: int, wait: float) -> list[bytes]:
        """Up to ``max_messages`` pgoutput messages that have arrived; if none, wait up to ``wait`` seconds."""
        messages = self._drain(max_messages)
        if not messages and wait > 0:
            select.select([self.socket()], [], [], wait)
            messages = self._drain(max_messages)
        if time.monotonic() - self._last_status > STATUS_INTERVAL:
            self._status(False)
        return messages

    def _drain(self, limit: int) -> list[bytes]:
        pgconn = self.conn.pgconn
        pgconn.consume_input()
        out: list[bytes] = []
        last = None  # the last XLogData: its end is the furthest (they arrive in WAL order), read once per drain
        while len(out) < limit:
            size, data = pgconn.get_copy_data(1)
            if size == 0:
                break
            if size < 0:
                self._ended()
            kind = data[0]
            if kind == 119:  # 'w': XLogData
                out.append(bytes(data[_XLOG_HEADER.size :]))
                last = data
            elif kind == 107:  # 'k': a keep-alive
                _k, end, _clock, reply = _KEEPALIVE.unpack_from(data)
                self._received_end = max(self._received_end, end)
                if reply:
                    self._status(False)
        if last is not None:
            self._received_end = max(self._received_end, _XLOG_HEADER.unpack_from(last)[2])
        return out

    def _ended(self) -> None:
        result = next_result(self.conn.pgconn)
        if result is not None and result.status == pq.ExecStatus.FATAL_ERROR:
            self._refused(result)
        raise psycopg.OperationalError("the replication stream ended")

    @property
    def received_end(self) -> int:
        """The server's WAL position as of the last message: all changes before it have been read."""
        return self._received_end

    def confirm(self, lsn: int) -> None:
        """Report everything before ``lsn`` as flushed: the slot may forget it, and never sends it again."""
        if lsn > self.flushed:
            self.flushed = lsn
            self._status(False)

    def _status(self, reply: bool) -> None:
        clock = int(time.time() * 1_000_000) - _PG_EPOCH_US
        message = _STATUS.pack(b"r", self.flushed, self.flushed, self.flushed, clock, reply)
        pgconn = self.conn.pgconn
        if pgconn.put_copy_data(message) != 1 or pgconn.flush() < 0:
            raise psycopg.OperationalError(f"sending replication status failed: {pgconn.error_message.decode()}")
        self._last_status = time.monotonic()

    def close(self) -> None:
        if not self.conn.closed:
            self.conn.close()


def wal_capture_unavailable(level: str) -> ConfigurationError:
    return ConfigurationError(
        f"WAL capture needs wal_level = logical; this server has {level!r}: ALTER SYSTEM SET wal_level = logical and "
        "restart Postgres, or stay in table mode"
    )
