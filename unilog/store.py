"""The Postgres adapter: every SQL statement unilog runs lives here.

The streamer, the consumers and the CLI only call these functions; they never build SQL themselves. Functions take
an open psycopg connection and never commit unless their docstring says so: transaction boundaries belong to the
caller, because the guarantees (state and checkpoint in one transaction, delete only after Redis confirmed) are
decided there.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
import structlog
from psycopg import sql

from .config import redact_url
from .errors import SchemaMissing, ServerUnreachable

log = structlog.get_logger(__name__)

SCHEMA_HEAD = "unilog_0003"
VERSION_TABLE = "unilog_alembic_version"
NOTIFY_CHANNEL = "unilog_staged"


# -- connections ------------------------------------------------------------------------------------------------------


def connect(
    conninfo: str, *, autocommit: bool = False, application_name: str = "unilog", timeout: float | None = None
) -> psycopg.Connection[Any]:
    """Open a psycopg connection, turning connection failures into :class:`ServerUnreachable`.

    The error names the server with its password redacted and says what to check. TCP keepalives and a user
    timeout make a silently dead peer (a network partition) an error within seconds instead of a hang; a peer that
    still acknowledges packets but never answers is handled by :func:`deadline`.
    """
    try:
        return psycopg.connect(
            conninfo,
            autocommit=autocommit,
            application_name=application_name,
            connect_timeout=max(2, int(timeout or 10)),  # libpq's minimum is 2 s
            keepalives=1,
            keepalives_idle=10,
            keepalives_interval=3,
            keepalives_count=3,
            tcp_user_timeout=30_000,
        )
    except psycopg.OperationalError as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise ServerUnreachable(
            f"cannot connect to Postgres at {redact_url(conninfo)}: {reason} "
            "(is the server running and DATABASE_URL right?)"
        ) from None


class _Watchdog:
    """One daemon thread per process that breaks connections whose deadline passed.

    Arming and disarming is a dict update under a lock: starting a ``threading.Timer`` per call cost a thread
    start on every streamer pass and consumer batch (measured ~0.35 ms, more under load).
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._armed: dict[int, tuple[float, psycopg.Connection[Any]]] = {}
        self._next_token = 0
        self._thread: threading.Thread | None = None

    def arm(self, conn: psycopg.Connection[Any], seconds: float) -> int:
        with self._lock:
            self._next_token += 1
            token = self._next_token
            self._armed[token] = (time.monotonic() + seconds, conn)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._watch, name="unilog-deadlines", daemon=True)
                self._thread.start()
            self._lock.notify()
            return token

    def disarm(self, token: int) -> None:
        with self._lock:
            self._armed.pop(token, None)

    def _watch(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                expired = [t for t, (due, _) in self._armed.items() if due <= now]
                victims = [self._armed.pop(t)[1] for t in expired]
                wait = min((due for due, _ in self._armed.values()), default=now + 1.0) - now
                if not victims:
                    self._lock.wait(max(0.001, min(wait, 1.0)))
            for conn in victims:
                _break(conn)


_watchdog = _Watchdog()


@contextlib.contextmanager
def deadline(conn: psycopg.Connection[Any], seconds: float | None) -> Iterator[None]:
    """Break ``conn`` if the block takes longer than ``seconds``, so a query never waits forever on a server that
    went silent (paused, or behind a blackholing proxy). The blocked call then fails with ``OperationalError`` and
    the caller's usual reconnect path takes over; the transaction was not committed, so nothing is lost.
    """
    if not seconds:
        yield
        return
    token = _watchdog.arm(conn, seconds)
    try:
        yield
    finally:
        _watchdog.disarm(token)


def _break(conn: psycopg.Connection[Any]) -> None:
    """Shut the connection's socket down (from another thread): the blocked read returns at once."""
    log.warning("postgres call exceeded its deadline; breaking the connection")
    with contextlib.suppress(OSError, ValueError, psycopg.Error):
        sock = socket.socket(fileno=os.dup(conn.fileno()))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


def check_schema(conn: psycopg.Connection[Any]) -> None:
    """Raise :class:`SchemaMissing` unless unilog's migrations are applied up to :data:`SCHEMA_HEAD` or later."""
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (VERSION_TABLE,)).fetchone()
    if not row or not row[0]:
        raise SchemaMissing("the database has no unilog schema: run `unilog migrate` (with DATABASE_URL set) first")
    versions = {r[0] for r in conn.execute(sql.SQL("SELECT version_num FROM {}").format(sql.Identifier(VERSION_TABLE)))}
    if not versions or not any(v >= SCHEMA_HEAD for v in versions if v.startswith("unilog_")):
        raise SchemaMissing(
            f"the unilog schema is at {sorted(versions) or 'no revision'}, this unilog needs {SCHEMA_HEAD}: "
            "run `unilog migrate`"
        )


# -- producer ---------------------------------------------------------------------------------------------------------

INSERT_STAGED = (
    "INSERT INTO staged_log_records (action, object, data, stream, key) "
    "VALUES (%(action)s, %(object)s, %(data)s::jsonb, %(stream)s, %(key)s) RETURNING id"
)


# -- streamer ---------------------------------------------------------------------------------------------------------


# A staged row as the streamer reads it: (id, action, object, data, key, created_ms). ``data`` is Postgres's JSON
# text, passed through to Redis without decoding; plain tuples because this is the streamer's hot path.
StagedRow = tuple[int, str, str, str, str | None, int]


@dataclass(frozen=True, slots=True)
class ProducerIdentity:
    """This database's identity as a producer: positions are per (producer, stream)."""

    producer_id: str
    epoch: int


def producer_identity(conn: psycopg.Connection[Any]) -> ProducerIdentity:
    """Read this database's producer id and epoch."""
    row = conn.execute("SELECT producer_id, epoch FROM unilog_producer").fetchone()
    if row is None:
        raise SchemaMissing("unilog_producer is empty: run `unilog migrate` again")
    return ProducerIdentity(producer_id=row[0], epoch=row[1])


_CURRENT_IDENTITY = """
    SELECT (SELECT system_identifier FROM pg_control_system()),
           (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def resolve_identity(conn: psycopg.Connection[Any]) -> tuple[ProducerIdentity, bool]:
    """This database's producer identity, starting a new epoch if the database was restored or copied.

    A restore into another cluster (its transaction ids restart lower) or a copy into another database changes
    the cluster's system identifier or the database's oid. Then, in one transaction: the epoch is incremented (so
    positions restart at 1 in an epoch consumers have not seen, instead of colliding with old ones) and staged rows
    whose ``xid`` lies in this cluster's future are moved below the horizon, or they would never be published.
    Returns (identity, whether a new epoch began). Commits.
    """
    with conn.transaction():
        row = conn.execute(
            "SELECT producer_id, epoch, system_identifier, database_oid FROM unilog_producer FOR UPDATE"
        ).fetchone()
        if row is None:
            raise SchemaMissing("unilog_producer is empty: run `unilog migrate` again")
        current = conn.execute(_CURRENT_IDENTITY).fetchone()
        assert current is not None
        if (row[2], row[3]) == tuple(current):
            return ProducerIdentity(row[0], row[1]), False
        conn.execute(
            "UPDATE unilog_producer SET epoch = epoch + 1, system_identifier = %s, database_oid = %s", tuple(current)
        )
        conn.execute(
            "UPDATE staged_log_records SET xid = '1'::xid8 WHERE xid >= pg_snapshot_xmax(pg_current_snapshot())"
        )
        return ProducerIdentity(row[0], row[1] + 1), True


def adopt_identity(conn: psycopg.Connection[Any], producer_id: str) -> None:
    """Make a copied database a distinct producer in epoch 1 (test databases cloned from a template). Commits."""
    with conn.transaction():
        conn.execute(
            "UPDATE unilog_producer SET producer_id = %s, epoch = 1, "
            f"(system_identifier, database_oid) = ({_CURRENT_IDENTITY})",
            (producer_id,),
        )


def staged_sources(conn: psycopg.Connection[Any]) -> list[str]:
    """Distinct values of ``staged_log_records.stream``, found with a loose index scan (fast on big backlogs)."""
    rows = conn.execute(
        """
        WITH RECURSIVE s AS (
            (SELECT stream FROM staged_log_records ORDER BY stream LIMIT 1)
            UNION ALL
            SELECT (SELECT r.stream FROM staged_log_records r WHERE r.stream > s.stream ORDER BY r.stream LIMIT 1)
            FROM s WHERE s.stream IS NOT NULL
        )
        SELECT stream FROM s WHERE stream IS NOT NULL
        """
    ).fetchall()
    return [r[0] for r in rows]


# The text of xid is selected under another name: an output column named "xid" would be what ORDER BY xid sorts by
# (output names win over input columns), in text order ('10000' < '9999'), past the index, and out of step with the
# numeric (xid, id) > cursor.
# The next batch of a source: only rows below the visibility horizon, after (xid, id), in (xid, id) order
# (see fetch_visible). Parameters: stream, after xid, after id, limit.
VISIBLE_BATCH = """
    FROM staged_log_records
    WHERE stream = %s AND xid < pg_snapshot_xmin(pg_current_snapshot()) AND (xid, id) > (%s::xid8, %s)
    ORDER BY xid, id
    LIMIT %s
"""

FETCH_BATCH = (
    "SELECT id, action, object, data::text, key, (extract(epoch FROM created_at) * 1000)::bigint, xid::text AS xid_text"
    + VISIBLE_BATCH
)

# The same batch as FETCH_BATCH, returned as ONE row: the count, every record's five publish arguments (data, action,
# object, created ms, key or '') already encoded as RESP bulk strings, and the last (xid, id). Postgres hands over
# the JSON text and does the per-record encoding in C, so the streamer touches no record in Python. The lengths are
# octet_length() of server-encoding text, so this is only used on UTF8 databases (see packed_fetch_supported).
FETCH_PACKED = (
    """
    WITH batch AS MATERIALIZED (
        SELECT xid, id, data::text AS data, action, object, coalesce(key, '') AS key,
               ((extract(epoch FROM created_at) * 1000)::bigint)::text AS created"""
    + VISIBLE_BATCH
    + """), last AS (
        SELECT xid, id FROM batch ORDER BY xid DESC, id DESC LIMIT 1
    )
    SELECT (SELECT count(*) FROM batch),
           convert_to((SELECT string_agg(
               '$' || octet_length(data) || E'\\r\\n' || data || E'\\r\\n$' || octet_length(action) || E'\\r\\n'
               || action || E'\\r\\n$' || octet_length(object) || E'\\r\\n' || object || E'\\r\\n$'
               || octet_length(created) || E'\\r\\n' || created || E'\\r\\n$' || octet_length(key) || E'\\r\\n'
               || key || E'\\r\\n', '' ORDER BY xid, id) FROM batch), 'UTF8'),
           (SELECT xid::text FROM last), (SELECT id FROM last)
"""
)

# Where a fetch starts: the (xid, id) of the last row published, or the very beginning.
START = ("0", 0)


def fetch_visible(
    conn: psycopg.Connection[Any], source: str, limit: int, after: tuple[str, int] = START
) -> tuple[list[StagedRow], tuple[str, int]]:
    """The next ``limit`` staged records of ``source`` below the visibility horizon, in (xid, id) order, and the
    (xid, id) of the last one.

    Only rows written by transactions older than every transaction still running are read, so no transaction
    can later commit a row that sorts before one already returned: the order is final, and a late commit is
    published after, never skipped. For the same reason a publisher holding the stream's lock may pass the last
    (xid, id) it published as ``after``: every row before it is gone, and starting there skips the dead index
    entries a large drained backlog leaves at the front of the index. It also makes the batch exactly the rows
    in the range (``after``, last]: no row can appear in that range later (see :func:`delete_published`).
    """
    rows = conn.execute(FETCH_BATCH, (source, after[0], after[1], limit)).fetchall()
    if not rows:
        return [], after
    last = rows[-1]
    return [row[:6] for row in rows], (last[6], last[0])


def packed_fetch_supported(conn: psycopg.Connection[Any]) -> bool:
    """Whether :func:`fetch_packed` can be used: its byte lengths are right only in a UTF8 database."""
    return conn.info.parameter_status("server_encoding") == "UTF8"


def fetch_packed(
    conn: psycopg.Connection[Any], source: str, limit: int, after: tuple[str, int] = START
) -> tuple[int, bytes, tuple[str, int]]:
    """The batch :func:`fetch_visible` would return, as (count, RESP-encoded publish arguments, last (xid, id)).

    Same rows, same order, same guarantees; count 0 means nothing visible (and ``after`` is returned as last).
    """
    row = conn.execute(FETCH_PACKED, (source, after[0], after[1], limit), binary=True).fetchone()
    if row is None or not row[0]:
        return 0, b"", after
    count, body, last_xid, last_id = row
    return int(count), bytes(body), (str(last_xid), int(last_id))


def has_staged(conn: psycopg.Connection[Any], source: str) -> bool:
    """Whether committed rows of ``source`` exist at all (visible or still behind the horizon)."""
    row = conn.execute("SELECT EXISTS (SELECT 1 FROM staged_log_records WHERE stream = %s)", (source,)).fetchone()
    return bool(row and row[0])


def last_published_seq(conn: psycopg.Connection[Any], stream: str, epoch: int) -> int:
    """The last sequence number published on ``stream`` in ``epoch`` (0 if none)."""
    row = conn.execute("SELECT epoch, last_seq FROM unilog_stream_positions WHERE stream = %s", (stream,)).fetchone()
    if row is None or row[0] != epoch:
        return 0
    return int(row[1])


def delete_published(
    conn: psycopg.Connection[Any],
    source: str,
    after: tuple[str, int],
    last: tuple[str, int],
    count: int,
    epoch: int,
    last_seqs: dict[str, int],
) -> int:
    """Delete the published batch, the ``count`` rows of ``source`` in the (xid, id) range (``after``, ``last``],
    and advance each target stream's position, in the caller's transaction.

    The range holds exactly the rows that were fetched: they were all below the visibility horizon, so every
    transaction that could write a row into the range had ended before the fetch. Returns the number of rows
    deleted; the caller must check it equals the batch's size (fewer means another session deleted some).
    """
    # The LIMIT stops the index scan at the batch's end: a row comparison bounds the start of a btree scan but not
    # its end, and a large transaction's rows all share one xid (measured: 20 ms instead of 1 ms per 1000 rows).
    cur = conn.execute(
        """
        DELETE FROM staged_log_records WHERE ctid = ANY(ARRAY(
            SELECT ctid FROM staged_log_records
            WHERE stream = %s AND (xid, id) > (%s::xid8, %s) AND (xid, id) <= (%s::xid8, %s)
            ORDER BY xid, id LIMIT %s))
        """,
        (source, after[0], after[1], last[0], last[1], count),
    )
    with conn.cursor() as positions:
        positions.executemany(
            """
            INSERT INTO unilog_stream_positions (stream, epoch, last_seq) VALUES (%s, %s, %s)
            ON CONFLICT (stream) DO UPDATE SET epoch = excluded.epoch, last_seq = excluded.last_seq, updated_at = now()
            """,
            [(stream, epoch, seq) for stream, seq in last_seqs.items()],
        )
    return cur.rowcount


def try_stream_lock(conn: psycopg.Connection[Any], stream: str) -> bool:
    """Take the session-level advisory lock that makes one streamer the publisher of ``stream``.

    The lock is released when the session ends, including when its process is killed, so a standby
    streamer takes over as soon as Postgres notices the dead connection.
    """
    row = conn.execute("SELECT pg_try_advisory_lock(hashtextextended('unilog.stream:' || %s, 0))", (stream,)).fetchone()
    return bool(row and row[0])


def staged_backlog(conn: psycopg.Connection[Any]) -> tuple[int, float | None]:
    """(number of committed staged records, age in seconds of the oldest one or None)."""
    row = conn.execute(
        "SELECT count(*), extract(epoch FROM now() - min(created_at))::float8 FROM staged_log_records"
    ).fetchone()
    assert row is not None
    return int(row[0]), row[1]


def staged_by_stream(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, float | None]]:
    """Per ``stream`` column value ('' = the default stream): (committed staged records, oldest age in seconds)."""
    rows = conn.execute(
        """
        SELECT stream, count(*), extract(epoch FROM now() - min(created_at))::float8
        FROM staged_log_records GROUP BY stream
        """
    ).fetchall()
    return {r[0]: (int(r[1]), r[2]) for r in rows}


def horizon_holder(conn: psycopg.Connection[Any]) -> dict[str, Any] | None:
    """The oldest transaction in the cluster that holds an xid, which holds back publication of every record
    committed after it began (any database: transaction ids are cluster-wide). None if there is none."""
    row = conn.execute(
        """
        SELECT pid, datname, application_name, state, extract(epoch FROM now() - xact_start)::float8
        FROM pg_stat_activity
        WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()
        ORDER BY xact_start
        LIMIT 1
        """
    ).fetchone()
    if row is None:
        return None
    keys = ("pid", "database", "application_name", "state", "age_seconds")
    return dict(zip(keys, row, strict=True))


# -- consumers --------------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Checkpoint:
    """A consumer's progress: the last stream entry it consumed and, per producer, the last (epoch, seq) applied."""

    name: str
    stream: str
    last_id: str = "0-0"
    positions: dict[str, tuple[int, int]] = field(default_factory=dict)

    def copy(self) -> Checkpoint:
        return Checkpoint(self.name, self.stream, self.last_id, dict(self.positions))


def _checkpoint_from_row(name: str, row: tuple[Any, ...]) -> Checkpoint:
    stream, last_id, positions = row
    return Checkpoint(name, stream, last_id, {p: (int(e), int(s)) for p, (e, s) in positions.items()})


def _read_checkpoint(conn: psycopg.Connection[Any], name: str, *, for_update: bool = False) -> Checkpoint | None:
    query = "SELECT stream, last_id, positions FROM unilog_checkpoints WHERE name = %s"
    row = conn.execute(query + (" FOR UPDATE" if for_update else ""), (name,)).fetchone()
    return None if row is None else _checkpoint_from_row(name, row)


def ensure_checkpoint(conn: psycopg.Connection[Any], name: str, stream: str) -> Checkpoint:
    """Return consumer ``name``'s checkpoint, creating it at the stream's beginning if it does not exist."""
    conn.execute(
        "INSERT INTO unilog_checkpoints (name, stream) VALUES (%s, %s) ON CONFLICT (name) DO NOTHING", (name, stream)
    )
    checkpoint = _read_checkpoint(conn, name)
    assert checkpoint is not None
    return checkpoint


def lock_checkpoint(conn: psycopg.Connection[Any], name: str) -> Checkpoint | None:
    """Lock and return the checkpoint row, in the caller's transaction, so two copies of one consumer serialize."""
    return _read_checkpoint(conn, name, for_update=True)


def lock_consumer(conn: psycopg.Connection[Any], name: str) -> Checkpoint | None:
    """Serialize copies of consumer ``name`` with a transaction-level advisory lock, then read its checkpoint.

    Unlike :func:`lock_checkpoint` this takes no row lock, so the transaction gets no transaction id: a consumer that
    computes for long before it writes (a Spark job) does not hold back the streamer's visibility horizon meanwhile.
    Before it saves, it must re-read the row with :func:`lock_checkpoint` and find it unchanged (a copy that does not
    take this lock, a Python consumer of the same name, may have moved it)."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('unilog.consumer:' || %s, 0))", (name,))
    return _read_checkpoint(conn, name)


def save_checkpoint(conn: psycopg.Connection[Any], checkpoint: Checkpoint) -> None:
    """Write the checkpoint in the caller's transaction (which also holds the consumer's state changes)."""
    conn.execute(
        "UPDATE unilog_checkpoints SET last_id = %s, positions = %s::jsonb, updated_at = now() WHERE name = %s",
        (checkpoint.last_id, json.dumps({p: list(pos) for p, pos in checkpoint.positions.items()}), checkpoint.name),
    )


def list_checkpoints(conn: psycopg.Connection[Any]) -> list[Checkpoint]:
    """Every consumer checkpoint, by name."""
    rows = conn.execute("SELECT name, stream, last_id, positions FROM unilog_checkpoints ORDER BY name").fetchall()
    return [_checkpoint_from_row(r[0], r[1:]) for r in rows]


# -- consumer groups --------------------------------------------------------------------------------------------------

Identity = tuple[str, int, int]  # (producer, epoch, seq)


def group_watermarks(conn: psycopg.Connection[Any], group: str, stream: str) -> dict[tuple[str, int], int]:
    """(producer, epoch) -> the seq at or below which every record was applied by ``group``."""
    rows = conn.execute(
        "SELECT producer, epoch, seq FROM unilog_group_watermarks WHERE group_name = %s AND stream = %s",
        (group, stream),
    ).fetchall()
    return {(r[0], int(r[1])): int(r[2]) for r in rows}


def claim_identities(
    conn: psycopg.Connection[Any], group: str, stream: str, identities: Sequence[Identity]
) -> set[Identity]:
    """Insert ``identities`` (distinct) as applied by ``group`` in the caller's transaction; return those that were
    new.

    Identities already present belong to records this group applied before (a redelivery): the caller skips them.
    They are sent as runs of consecutive seqs, which is what a stream's positions mostly are, and the new ones are
    listed only when some were not new: the common batch costs a few values each way, not one per record.
    """
    if not identities:
        return set()
    producers, epochs, lows, highs = _runs(identities)
    row = conn.execute(
        """
        WITH ins AS (
            INSERT INTO unilog_processed (group_name, stream, producer, epoch, seq)
            SELECT %(g)s, %(s)s, r.p, r.e, n
            FROM unnest(%(p)s::text[], %(e)s::bigint[], %(lo)s::bigint[], %(hi)s::bigint[]) AS r(p, e, lo, hi),
                 generate_series(r.lo, r.hi) AS n
            ON CONFLICT DO NOTHING
            RETURNING producer, epoch, seq
        )
        SELECT count(*),
               CASE WHEN count(*) < %(n)s THEN array_agg(producer) END,
               CASE WHEN count(*) < %(n)s THEN array_agg(epoch) END,
               CASE WHEN count(*) < %(n)s THEN array_agg(seq) END
        FROM ins
        """,
        {"g": group, "s": stream, "p": producers, "e": epochs, "lo": lows, "hi": highs, "n": len(identities)},
    ).fetchone()
    assert row is not None
    if row[0] == len(identities):
        return set(identities)
    if not row[0]:
        return set()
    return {(p, int(e), int(n)) for p, e, n in zip(row[1], row[2], row[3], strict=True)}


def _runs(identities: Sequence[Identity]) -> tuple[list[str], list[int], list[int], list[int]]:
    """``identities`` as runs of consecutive seqs per (producer, epoch): four parallel lists."""
    producers: list[str] = []
    epochs: list[int] = []
    lows: list[int] = []
    highs: list[int] = []
    last: Identity | None = None
    for identity in identities:
        producer, epoch, seq = identity
        if last is not None and seq == last[2] + 1 and epoch == last[1] and producer == last[0]:
            highs[-1] = seq
        else:
            producers.append(producer)
            epochs.append(epoch)
            lows.append(seq)
            highs.append(seq)
        last = identity
    return producers, epochs, lows, highs


def advance_watermarks(conn: psycopg.Connection[Any], group: str, stream: str) -> int:
    """Move each (producer, epoch) watermark over the contiguous run of applied seqs above it and prune the rows
    at or below it, in the caller's transaction; return rows pruned. Seqs are dense per producer and stream, so a
    watermark never passes a record that was not applied (a dead letter, say): that record blocks it until it is
    replayed and applied, or dropped."""
    conn.execute(
        """
        WITH pairs AS (
            SELECT DISTINCT producer, epoch FROM unilog_processed
            WHERE group_name = %(g)s AND stream = %(s)s AND producer <> ''
        ), current AS (
            SELECT p.producer, p.epoch, coalesce(w.seq, 0) AS seq
            FROM pairs p LEFT JOIN unilog_group_watermarks w
              ON w.group_name = %(g)s AND w.stream = %(s)s AND w.producer = p.producer AND w.epoch = p.epoch
        ), runs AS (
            SELECT c.producer, c.epoch, r.seq, r.seq - c.seq - row_number() OVER (
                PARTITION BY c.producer, c.epoch ORDER BY r.seq) AS offset_from_run
            FROM current c JOIN unilog_processed r
              ON r.group_name = %(g)s AND r.stream = %(s)s AND r.producer = c.producer AND r.epoch = c.epoch
             AND r.seq > c.seq
        ), advanced AS (
            SELECT producer, epoch, max(seq) AS seq FROM runs WHERE offset_from_run = 0 GROUP BY producer, epoch
        )
        INSERT INTO unilog_group_watermarks (group_name, stream, producer, epoch, seq)
        SELECT %(g)s, %(s)s, producer, epoch, seq FROM advanced
        ON CONFLICT (group_name, stream, producer, epoch) DO UPDATE SET seq = excluded.seq
        """,
        {"g": group, "s": stream},
    )
    cur = conn.execute(
        """
        DELETE FROM unilog_processed r USING unilog_group_watermarks w
        WHERE r.group_name = %(g)s AND r.stream = %(s)s
          AND w.group_name = r.group_name AND w.stream = r.stream AND w.producer = r.producer AND w.epoch = r.epoch
          AND r.seq <= w.seq
        """,
        {"g": group, "s": stream},
    )
    return cur.rowcount


def mark_dropped(conn: psycopg.Connection[Any], group: str, stream: str, identity: Identity) -> None:
    """Record a dead letter that was dropped as settled for ``group``, so the watermark can move past it."""
    claim_identities(conn, group, stream, [identity])
