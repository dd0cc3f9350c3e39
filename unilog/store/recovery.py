"""Recovering the record messages of a lost WAL capture slot from the WAL itself.

A slot lost at a failover (no ready copy on the promoted standby), dropped, or invalidated takes with it only the
ability to *decode* what it had not delivered: the record messages are still in the WAL, as long as the WAL is. A
synchronous standby that is promoted has every committed one. So the streamer that finds its slot lost reads the
WAL from the last position the slot was known to need (``unilog_capture.restart_lsn``, kept by the guard every few
seconds and at the slot's creation; it replicates with the table) to the end, with ``pg_walinspect``, whose
description of a logical message carries its payload (Postgres 16+), keeps the record messages of transactions
that committed in this database, after the saved mark, in commit order, and stages them again as rows, before the
rows staged meanwhile (those that committed later are moved behind them, so each key keeps its commit order). All of
it is one transaction, under the emit lock (no producer writes a record message meanwhile: producers are switched to
rows first), that also records the loss (``unilog_capture_losses``): what was recovered, and what could not be (WAL
already removed, ``pg_walinspect`` missing, Postgres 15, a transaction that cannot be told apart from another
database's), which an operator acknowledges (``unilog capture losses --ack``).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from .failover import _RESCUE, _fields, count_record_messages
from .pgoutput import MESSAGE_PREFIX
from .wal import lsn_text

EMIT_LOCK = "unilog.emit_mode"  # unilog_stage's advisory lock, shared by every emitting transaction
PAYLOAD_SINCE = 160000  # pg_walinspect describes a logical message's payload from Postgres 16

_MESSAGE = re.compile(r'^transactional, prefix "(.*)"; payload \((\d+) bytes\):\s?(.*)$', re.S)
_SUBXACTS = re.compile(r"subxacts:((?: \d+)+)")


@dataclass(frozen=True)
class Recovery:
    """What a lost slot cost: the WAL range read (``start`` to ``end``), the record messages ``recovered`` (staged
    again as rows), those ``lost`` (None: how many is unknown, the WAL cannot be read here) and why (``detail``),
    and the id of the loss's row in ``unilog_capture_losses``."""

    start: int
    end: int
    recovered: int
    lost: int | None
    detail: str
    loss_id: int

    @property
    def complete(self) -> bool:
        """Every record message the slot had not delivered was recovered."""
        return self.lost == 0

    def line(self) -> str:
        """The loss in one line, for logs and errors."""
        span = f"{lsn_text(self.start)} to {lsn_text(self.end)}"
        if self.complete:
            return f"recovered {self.recovered} record messages from the WAL ({span}), in commit order: nothing is lost"
        count = "an unknown number of" if self.lost is None else f"up to {self.lost}"
        return (
            f"recovered {self.recovered} record messages from the WAL ({span}), but {count} record messages committed "
            f"in that range are lost: {self.detail} (loss #{self.loss_id}, `unilog capture losses`)"
        )


@dataclass(frozen=True)
class _Message:
    commit: int  # the commit record's LSN: the order transactions are published in
    ordinal: int  # among its transaction's record messages
    payload: bytes


def record_restart_lsn(conn: psycopg.Connection[Any], slot: str) -> None:
    """Keep the slot's ``restart_lsn`` in ``unilog_capture`` (where a recovery starts reading if the slot is lost),
    when it moved; in ``conn``'s transaction."""
    conn.execute(
        """
        UPDATE unilog_capture c SET restart_lsn = s.restart_lsn FROM pg_replication_slots s
        WHERE s.slot_name = %s AND c.slot_name = s.slot_name AND s.restart_lsn IS NOT NULL
          AND c.restart_lsn IS DISTINCT FROM s.restart_lsn
        """,
        (slot,),
    )


def walinspect_ready(conn: psycopg.Connection[Any]) -> str | None:
    """None if a recovery can read messages from the WAL here, else why not (one phrase). Never calls a function
    that may not exist: an error line in the server log for every check would be noise."""
    if conn.info.server_version < PAYLOAD_SINCE:
        return f"Postgres {conn.info.server_version // 10000}'s pg_walinspect does not show a message's payload (16+)"
    return walinspect_usable(conn)


def walinspect_usable(conn: psycopg.Connection[Any]) -> str | None:
    """None if pg_walinspect is installed here and this role may call it, else why not (checked in the catalog)."""
    row = conn.execute(
        "SELECT has_function_privilege(p.oid, 'EXECUTE') FROM pg_proc p JOIN pg_extension e ON e.extname = "
        "'pg_walinspect' AND p.pronamespace = e.extnamespace WHERE p.proname = 'pg_get_wal_records_info'"
    ).fetchone()
    if row is None:
        return "pg_walinspect is not installed in this database (CREATE EXTENSION pg_walinspect, as a superuser)"
    if not row[0]:
        return "this role may not execute pg_get_wal_records_info (GRANT pg_read_server_files, or EXECUTE on it)"
    return None


def install_walinspect(conn: psycopg.Connection[Any]) -> bool:
    """``CREATE EXTENSION pg_walinspect`` where it is available and this role is a superuser (it is not a trusted
    extension); whether it is installed afterwards. Never fails: checked first, so no error reaches the log."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_walinspect'), "
        "EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_walinspect'), "
        "(SELECT rolsuper FROM pg_roles WHERE rolname = current_user)"
    ).fetchone()
    assert row is not None
    installed, available, superuser = row
    if not installed and available and superuser and not conn.read_only:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        return True
    return bool(installed)


def recover_lost_slot(
    conn: psycopg.Connection[Any], slot: str, other_captures: bool, *, lock_timeout: float = 2.0
) -> Recovery:
    """Switch producers to rows, then, in one transaction committed here: stage again as rows the record messages
    of this database's committed transactions that the lost ``slot`` had not delivered, in commit order, before
    the rows staged meanwhile; move the saved mark past them; record the loss. ``other_captures``: another
    database of this cluster may write unilog record messages too (the WAL is the cluster's): then a transaction
    that wrote nothing but messages cannot be told apart, and is counted lost rather than guessed. ``conn``: not
    autocommit. Raises ``psycopg.errors.LockNotAvailable`` if an emitting transaction does not end within
    ``lock_timeout`` (producers are on rows by then; the caller tries again)."""
    conn.execute("SELECT setval('unilog_emit_mode', 0)")  # a sequence: no rollback undoes it
    conn.commit()
    conn.execute("SELECT 1 FROM unilog_capture FOR UPDATE")
    conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{int(lock_timeout * 1000)}ms")))
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (EMIT_LOCK,))  # emitters in flight end
    conn.execute("SET LOCAL lock_timeout = 0")
    row = conn.execute(
        "SELECT (coalesce(restart_lsn, message_lsn) - '0/0')::numeric, (message_lsn - '0/0')::numeric, "
        "message_ordinal, (pg_current_wal_insert_lsn() - '0/0')::numeric FROM unilog_capture"
    ).fetchone()
    assert row is not None
    start, mark, end = int(row[0]), (int(row[1]), int(row[2])), int(row[3])
    _wait_flushed(conn, end)
    oldest = _oldest_wal(conn)
    removed = None
    if oldest is not None and oldest > start:
        removed, start = f"the WAL from {lsn_text(start)} to {lsn_text(oldest)} was already removed", oldest
    messages, commits, lost, detail = _recover_range(conn, start, end, mark, other_captures)
    if removed is not None:
        lost, detail = None, removed + (f"; {detail}" if detail else "")
    _restage(conn, messages, commits)
    if messages:
        last = messages[-1]
        conn.execute(
            "UPDATE unilog_capture SET message_lsn = '0/0'::pg_lsn + %s::numeric, message_ordinal = %s",
            (last.commit, last.ordinal),
        )
    # a hold, saved (every message before it is a row now, none written since): the guard releases it once the new
    # slot is safe, producers back to messages
    conn.execute(
        "UPDATE unilog_capture SET held_reason = %s, held_lsn = pg_current_wal_insert_lsn(), held_saved = true",
        (f"slot {slot!r} was lost: its record messages were recovered from the WAL as rows",),
    )
    loss = conn.execute(
        "INSERT INTO unilog_capture_losses (slot, from_lsn, to_lsn, recovered, lost, detail, acknowledged_at) "
        "VALUES (%s, %s::pg_lsn, %s::pg_lsn, %s, %s, %s, CASE WHEN %s THEN now() END) RETURNING id",
        (slot, lsn_text(start), lsn_text(end), len(messages), lost, detail or "none", lost == 0),
    ).fetchone()
    assert loss is not None
    conn.commit()
    return Recovery(start, end, len(messages), lost, detail or "none", int(loss[0]))


def _recover_range(
    conn: psycopg.Connection[Any], start: int, end: int, mark: tuple[int, int], other_captures: bool
) -> tuple[list[_Message], dict[int, int], int | None, str]:
    """(the messages to stage again, commit LSNs by xid, how many are lost (None: unknown), why)."""
    why = walinspect_ready(conn)
    if why is not None:
        return [], {}, *_count_only(conn, start, end, why)
    try:
        with conn.transaction():  # a savepoint: the recovery's transaction goes on if the WAL cannot be read
            messages, commits, ambiguous, _foreign = _read(conn, start, end, mark, other_captures)
    except psycopg.Error as exc:  # WAL removed where pg_ls_waldir could not tell, say: then nothing is known
        return [], {}, None, f"the WAL could not be read back ({' '.join(str(exc).split())})"
    detail = (
        f"{ambiguous} record messages of transactions that wrote nothing else cannot be told apart from another "
        "unilog database's on this cluster"
        if ambiguous
        else ""
    )
    return messages, commits, ambiguous, detail


def _count_only(conn: psycopg.Connection[Any], start: int, end: int, why: str) -> tuple[int | None, str]:
    """Where messages cannot be read back (Postgres 15, or no pg_walinspect): how many may be lost and why. The WAL's
    logical messages in the range are counted where pg_walinspect is installed (an upper bound: switch markers,
    rolled-back transactions and other databases' count too); none at all means none was lost (only rows, say)."""
    if walinspect_usable(conn) is not None:
        return None, why
    count = count_record_messages(conn, start, end)
    if count == 0:
        return 0, ""
    if count is None:
        return None, why
    return count, f"{why}; the WAL holds {count} logical messages in that range (an upper bound)"


def _wait_flushed(conn: psycopg.Connection[Any], target: int, timeout: float = 5.0) -> None:
    """Until the WAL up to ``target`` is flushed (an asynchronous commit's record must be in what is read)."""
    deadline = time.monotonic() + timeout
    query = "SELECT pg_current_wal_flush_lsn() >= '0/0'::pg_lsn + %s::numeric"
    while not conn.execute(query, (target,)).fetchone()[0]:  # type: ignore[index]
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)


def _oldest_wal(conn: psycopg.Connection[Any]) -> int | None:
    """The start of the oldest WAL segment still on disk (None: pg_ls_waldir may not be read by this role)."""
    allowed = conn.execute("SELECT has_function_privilege('pg_ls_waldir()', 'EXECUTE')").fetchone()
    if not (allowed and allowed[0]):
        return None
    row = conn.execute(
        """
        SELECT min(('x' || substr(w.name, 9, 8))::bit(32)::bigint * 4294967296
                   + ('x' || substr(w.name, 17, 8))::bit(32)::bigint * s.setting::bigint)
        FROM pg_ls_waldir() w, pg_settings s WHERE w.name ~ '^[0-9A-F]{24}$' AND s.name = 'wal_segment_size'
        """
    ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


# Every record message and transaction end in the range, then, per transaction id, the databases whose relations
# its records touched (the WAL is the cluster's: a commit record names its database, but walinspect does not show it).
_WAL = """
    WITH w AS MATERIALIZED (
        SELECT start_lsn, xid, resource_manager AS rm, record_type, description, block_ref
        FROM pg_get_wal_records_info('0/0'::pg_lsn + %s::numeric, '0/0'::pg_lsn + %s::numeric)
    )
    SELECT 'r', (start_lsn - '0/0')::numeric, xid::text::bigint, rm, record_type, description, NULL::text[]
    FROM w WHERE rm IN ('LogicalMessage', 'Transaction')
    UNION ALL
    SELECT 'd', NULL, xid::text::bigint, NULL, NULL, NULL,
           array_agg(DISTINCT (regexp_match(block_ref, 'rel \\d+/(\\d+)/'))[1])
    FROM w WHERE block_ref IS NOT NULL AND xid <> '0'::xid GROUP BY 3
    ORDER BY 1 DESC, 2
"""


def _read(
    conn: psycopg.Connection[Any], start: int, end: int, mark: tuple[int, int], other_captures: bool
) -> tuple[list[_Message], dict[int, int], int, int]:
    """(the record messages to recover in commit order, each recovered or later transaction's commit LSN by xid,
    messages that cannot be attributed, messages of other databases)."""
    own = str(conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0])  # type: ignore[index]
    pending: dict[int, list[tuple[int, bytes]]] = {}  # xid -> (lsn, payload), in WAL order
    top: dict[int, int] = {}  # subtransaction xid -> top-level xid
    commits: dict[int, int] = {}  # top-level xid -> commit LSN
    databases: dict[int, set[str]] = {}
    for kind, lsn, xid, rm, rtype, desc, dbs in conn.execute(_WAL, (start, end)):
        if kind == "d":
            databases[int(xid)] = {d for d in dbs if d}
            continue
        if rm == "LogicalMessage":
            found = _MESSAGE.match(desc or "")
            if found and found.group(1) == MESSAGE_PREFIX:  # not a switch marker, nor another tool's message
                pending.setdefault(int(xid), []).append((int(lsn), bytes.fromhex(found.group(3))))
        elif rtype in ("COMMIT", "COMMIT_PREPARED"):
            commits[int(xid)] = int(lsn)
            subs = _SUBXACTS.search(desc or "")
            for sub in subs.group(1).split() if subs else ():
                top[int(sub)] = int(xid)
    by_top: dict[int, list[tuple[int, bytes]]] = {}
    touched: dict[int, set[str]] = {}
    for xid, items in pending.items():
        owner = top.get(xid, xid)
        if owner in commits:
            by_top.setdefault(owner, []).extend(items)
    for xid, dbs in databases.items():
        touched.setdefault(top.get(xid, xid), set()).update(dbs)
    messages: list[_Message] = []
    ambiguous = foreign = 0
    for owner in sorted(by_top, key=commits.__getitem__):
        items = sorted(by_top[owner])
        dbs = touched.get(owner, set())
        if dbs and own not in dbs:
            foreign += len(items)
            continue
        for ordinal, (_lsn, payload) in enumerate(items):
            if (commits[owner], ordinal) <= mark:
                continue
            if not dbs and other_captures:
                ambiguous += 1
                continue
            messages.append(_Message(commits[owner], ordinal, payload))
    return messages, commits, ambiguous, foreign


def _restage(conn: psycopg.Connection[Any], messages: list[_Message], commits: dict[int, int]) -> None:
    """Stage ``messages`` as rows, and move behind them, in commit order, every staged row whose transaction
    committed after the first of them (its ids are lower: it was staged before this recovery)."""
    if not messages:
        return
    first = messages[0].commit
    later = conn.execute("SELECT id, xid(xid)::text::bigint FROM staged_log_records ORDER BY id").fetchall()
    moved = [(commits[x], 0, int(i)) for i, x in later if x in commits and commits[x] > first]
    columns = _columns(conn)
    if moved:
        conn.execute(
            "CREATE TEMP TABLE unilog_recovery_moved ON COMMIT DROP AS WITH d AS (DELETE FROM staged_log_records "
            "WHERE id = ANY(%s) RETURNING *) SELECT * FROM d",
            ([m[2] for m in moved],),
        )
    items = [(m.commit, 1, m.ordinal, m) for m in messages] + [(c, 0, i, None) for c, _z, i in moved]
    order = sorted(items, key=lambda t: t[:3])
    copy = sql.SQL(_COPY).format(cols=sql.SQL(", ").join(map(sql.Identifier, columns)))
    for _commit, kind, ident, message in order:
        if kind == 0:
            conn.execute(copy, (ident,))
        else:
            assert message is not None
            conn.execute(_RESCUE, _arguments(message.payload))


_COPY = "INSERT INTO staged_log_records ({cols}) SELECT {cols} FROM unilog_recovery_moved WHERE id = %s"


def _columns(conn: psycopg.Connection[Any]) -> list[str]:
    """staged_log_records' columns but ``id`` and ``xid`` (a row moved gets new ones: it is staged again now)."""
    rows = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = 'staged_log_records'::regclass AND attnum > 0 "
        "AND NOT attisdropped AND attgenerated = '' AND attname NOT IN ('id', 'xid') ORDER BY attnum"
    ).fetchall()
    return [str(r[0]) for r in rows]


def _arguments(payload: bytes) -> tuple[Any, ...]:
    """A record message's content (``stream LF tail-length LF body tail``, as unilog_stage writes it) as the
    arguments of the rescue's insert (:mod:`unilog.store.failover`)."""
    first = payload.index(b"\n")
    second = payload.index(b"\n", first + 1)
    size = payload[first + 1 : second]
    tail_at = len(payload) - int(size[1:] if size[:1] == b"t" else size)
    data, action, obj, created, key = _fields(payload[second + 1 : tail_at])
    parent, state, typed = (*_fields(payload[tail_at:]), "", "", "")[:3]
    stream = payload[:first].decode()
    return (stream, data, action, obj, created, key or None, parent or None, state or None, typed or None)


def other_capture_databases(conn: psycopg.Connection[Any], conninfo: str) -> bool:
    """Whether another database of this cluster may write unilog record messages (it has ``unilog_capture``), or
    cannot be checked (no CONNECT privilege): asked of each, in a session of its own."""
    from psycopg.conninfo import make_conninfo

    from ..errors import UnilogError
    from .connection import connect

    names = conn.execute(
        "SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate AND datname <> current_database()"
    ).fetchall()
    for (name,) in names:
        try:
            with connect(
                make_conninfo(conninfo, dbname=name), autocommit=True, application_name="unilog-recovery"
            ) as c:
                if c.execute("SELECT to_regclass('unilog_capture') IS NOT NULL").fetchone()[0]:  # type: ignore[index]
                    row = c.execute("SELECT EXISTS (SELECT 1 FROM unilog_capture)").fetchone()
                    if row and row[0]:
                        return True
        except (UnilogError, psycopg.Error):
            return True
    return False


def capture_losses(conn: psycopg.Connection[Any], *, unacknowledged: bool = False) -> list[dict[str, Any]]:
    """The lost capture slots recorded (newest first), each with what was recovered and lost; only those not
    acknowledged yet with ``unacknowledged`` (none before migration unilog_0014)."""
    if conn.execute("SELECT to_regclass('unilog_capture_losses') IS NULL").fetchone()[0]:  # type: ignore[index]
        return []
    cur = conn.execute(
        "SELECT id, detected_at, slot, from_lsn::text, to_lsn::text, recovered, lost, detail, acknowledged_at, "
        "acknowledged_by FROM unilog_capture_losses WHERE NOT %s OR acknowledged_at IS NULL ORDER BY id DESC",
        (unacknowledged,),
    )
    names = [c.name for c in cur.description or []]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def acknowledge_loss(conn: psycopg.Connection[Any], loss: int, by: str) -> bool:
    """Acknowledge loss ``loss`` (``by``: who); False if there is no such loss or it was acknowledged before."""
    row = conn.execute(
        "UPDATE unilog_capture_losses SET acknowledged_at = now(), acknowledged_by = %s "
        "WHERE id = %s AND acknowledged_at IS NULL RETURNING id",
        (by, loss),
    ).fetchone()
    return row is not None


# A staged row that a published entry was made from: the lowest id with the same content, not taken already. Its
# created time in ms as either path wrote it: WAL mode truncates a row's, table mode rounds it.
_MATCH = """
    SELECT id FROM staged_log_records
    WHERE stream = ANY(%(sources)s) AND action = %(action)s AND object = %(object)s AND data = %(data)s::jsonb
      AND coalesce(key, '') = %(key)s AND coalesce(record_type, '') = %(type)s
      AND coalesce(traceparent, '') = %(traceparent)s AND coalesce(tracestate, '') = %(tracestate)s
      AND %(created)s::bigint IN (floor(extract(epoch FROM created_at) * 1000)::bigint,
                                  round(extract(epoch FROM created_at) * 1000)::bigint)
      AND id <> ALL(%(taken)s)
    ORDER BY id LIMIT 1
"""


def match_published(
    conn: psycopg.Connection[Any], entries: dict[str, tuple[list[str], list[dict[str, str]]]]
) -> list[int] | None:
    """The staged rows that published entries were made from (``entries``: per target stream, its staging
    sources and the entries' fields), one row per entry; None if any entry matches no row. In ``conn``'s
    transaction; nothing is changed."""
    taken: list[int] = []
    for sources, fields in entries.values():
        for entry in fields:
            row = conn.execute(
                _MATCH,
                {
                    "sources": sources,
                    "action": entry.get("action"),
                    "object": entry.get("object"),
                    "data": entry.get("data"),
                    "key": entry.get("key", ""),
                    "type": entry.get("type", ""),
                    "traceparent": entry.get("traceparent", ""),
                    "tracestate": entry.get("tracestate", ""),
                    "created": entry.get("created", "0"),
                    "taken": taken,
                },
            ).fetchone()
            if row is None:
                return None
            taken.append(int(row[0]))
    return taken
