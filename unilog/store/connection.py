"""Opening Postgres connections (the one place the library does), deadlines on calls, and the schema check."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import structlog
from psycopg import sql

from ..config import redact_url
from ..errors import (
    PostgresPermissionDenied,
    ReadOnlyServer,
    SchemaMissing,
    ServerUnreachable,
    UnilogError,
    UnsupportedServer,
)

log = structlog.get_logger(__name__)

SCHEMA_HEAD = "unilog_0014"
VERSION_TABLE = "unilog_alembic_version"
_MIGRATE_LOCK = 0x756E696C6F67  # "unilog": serializes concurrent `unilog migrate` runs


def connect_options(application_name: str, timeout: float | None) -> dict[str, Any]:
    """libpq options of every unilog session: its name, a connect timeout, keepalives and a TCP user timeout."""
    return {
        "application_name": application_name,
        "connect_timeout": max(2, int(timeout or 10)),  # libpq's minimum is 2 s
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 3,
        "keepalives_count": 3,
        "tcp_user_timeout": 30_000,
    }


def unreachable(conninfo: str, exc: Exception) -> ServerUnreachable:
    """The one-line error for a failed connection attempt: the server (password redacted), the reason, the fix.

    The reason is libpq's whole message on one line (its lines and tabs become single spaces): its last line alone
    is often only the hint ("Is the server running on that host...") without the failure before it."""
    reason = " ".join(str(exc).split()) or type(exc).__name__
    return ServerUnreachable(
        f"cannot connect to Postgres at {redact_url(conninfo)}: {reason} "
        "(is the server running and DATABASE_URL right?)"
    )


def connect(
    conninfo: str,
    *,
    autocommit: bool = False,
    application_name: str = "unilog",
    timeout: float | None = None,
    standby: bool = False,
) -> psycopg.Connection[Any]:
    """Open a psycopg connection, turning connection failures into :class:`ServerUnreachable`.

    The error names the server with its password redacted and says what to check. TCP keepalives and a user
    timeout make a silently dead peer (a network partition) an error within seconds instead of a hang; a peer that
    still acknowledges packets but never answers is handled by :func:`deadline`. A standby is refused
    (:class:`ReadOnlyServer`) unless ``standby`` (a read that wants one).
    """
    try:
        conn = psycopg.connect(conninfo, autocommit=autocommit, **connect_options(application_name, timeout))
    except psycopg.OperationalError as exc:
        raise unreachable(conninfo, exc) from None
    if refused := version_refusal(conn, conninfo) or (None if standby else standby_refusal(conn, conninfo)):
        conn.close()
        raise refused
    return conn


def version_refusal(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], conninfo: str) -> Exception | None:
    """The one-line error if ``conn``'s server is older than unilog supports, else None (either face)."""
    if conn.info.server_version >= MIN_SERVER_VERSION:
        return None
    version = conn.info.parameter_status("server_version") or str(conn.info.server_version)
    return UnsupportedServer(
        f"Postgres at {redact_url(conninfo)} is version {version}; unilog needs Postgres 15 or later: upgrade the "
        "server (pg_upgrade) or point DATABASE_URL at a newer one"
    )


def standby_refusal(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], conninfo: str) -> Exception | None:
    """:class:`ReadOnlyServer` if ``conn``'s server is a hot standby (its ``in_hot_standby``, which the server
    reports at login: no query), else None (either face). No unilog session writes to a standby, and a failover
    promotes one: a worker waits for that, retrying, and never exits or writes meanwhile."""
    if conn.info.parameter_status("in_hot_standby") != "on":
        return None
    return ReadOnlyServer(
        f"Postgres at {redact_url(conninfo)} is a read-only standby (in recovery): waiting for a primary (after a "
        "failover, give DATABASE_URL every host with target_session_attrs=read-write, or a virtual IP)"
    )


MIN_SERVER_VERSION = 150000
# Failures no retry can fix: the role lacks a privilege. Workers stop with :func:`fatal`'s line instead of retrying.
FATAL: tuple[type[Exception], ...] = (psycopg.errors.InsufficientPrivilege,)


def fatal(exc: BaseException) -> UnilogError | None:
    """The one-line error for a Postgres failure no retry can fix (see :data:`FATAL`), or None."""
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        what = exc.diag.message_primary or str(exc).strip().splitlines()[0]
        found = re.search(r"for (table|sequence|schema|function) (\S+)", what)
        grant = (
            f"GRANT USAGE ON SCHEMA {found[2]}"
            if found and found[1] == "schema"
            else f"GRANT SELECT, INSERT, UPDATE, DELETE ON {found[2] if found else '<table>'}"
        )
        return PostgresPermissionDenied(
            f"Postgres refused: {what} (the role in DATABASE_URL lacks a privilege unilog needs): grant it, e.g. "
            f"{grant} TO <role>"
        )
    return None


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


# the statements of the schema check, run by the asyncio face too (``store.aio``)
HAS_VERSION_TABLE = "SELECT to_regclass(%s) IS NOT NULL"
VERSIONS = sql.SQL("SELECT version_num FROM {}").format(sql.Identifier(VERSION_TABLE))


def check_schema(conn: psycopg.Connection[Any]) -> None:
    """Raise :class:`SchemaMissing` unless unilog's migrations are applied up to :data:`SCHEMA_HEAD` or later."""
    row = conn.execute(HAS_VERSION_TABLE, (VERSION_TABLE,)).fetchone()
    versions = {r[0] for r in conn.execute(VERSIONS)} if row and row[0] else None
    schema_verdict(versions)


def schema_verdict(versions: set[str] | None) -> None:
    """Raise :class:`SchemaMissing` unless ``versions`` (None: no version table) include :data:`SCHEMA_HEAD` or a
    later revision."""
    if versions is None:
        raise SchemaMissing("the database has no unilog schema: run `unilog migrate` (with DATABASE_URL set) first")
    if not versions or not any(v >= SCHEMA_HEAD for v in versions if v.startswith("unilog_")):
        raise SchemaMissing(
            f"the unilog schema is at {sorted(versions) or 'no revision'}, this unilog needs {SCHEMA_HEAD}: "
            "run `unilog migrate`"
        )


def take_migration_lock(conn: psycopg.Connection[Any]) -> None:
    """Serialize migrations: a transaction-level advisory lock, held until the caller's transaction ends."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATE_LOCK,))
