# Generated from unilog/store/_async/connection.py by tools/faces.py: do not edit.
"""Opening a Postgres session (the one place the library does) and the schema check, written once for both faces
(``tools/faces.py`` generates the threaded one; :mod:`unilog.store.connection` and :mod:`unilog.store.aio` name
them). The libpq options, the refusals at login and the schema's verdict are plain functions each face has under the
same names.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from ...config import redact_url
from ...errors import ReadOnlyServer, SchemaMissing, ServerUnreachable, UnsupportedServer

SCHEMA_HEAD = "unilog_0014"
VERSION_TABLE = "unilog_alembic_version"
MIN_SERVER_VERSION = 150000
# the statements of the schema check
HAS_VERSION_TABLE = "SELECT to_regclass(%s) IS NOT NULL"
VERSIONS = sql.SQL("SELECT version_num FROM {}").format(sql.Identifier(VERSION_TABLE))


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
    still acknowledges packets but never answers is handled by ``deadline``. A server older than unilog supports is
    refused (:class:`UnsupportedServer`), and so is a standby (:class:`ReadOnlyServer`) unless ``standby`` (a read
    that wants one).
    """
    try:
        conn = psycopg.Connection.connect(conninfo, autocommit=autocommit, **connect_options(application_name, timeout))
    except psycopg.OperationalError as exc:
        raise unreachable(conninfo, exc) from None
    if refused := version_refusal(conn, conninfo) or (None if standby else standby_refusal(conn, conninfo)):
        conn.close()
        try:
            raise refused
        finally:
            del refused  # it holds the error, whose traceback holds this frame: a cycle
    return conn


def version_refusal(conn: psycopg.Connection[Any], conninfo: str) -> Exception | None:
    """The one-line error if ``conn``'s server is older than unilog supports, else None."""
    if conn.info.server_version >= MIN_SERVER_VERSION:
        return None
    version = conn.info.parameter_status("server_version") or str(conn.info.server_version)
    return UnsupportedServer(
        f"Postgres at {redact_url(conninfo)} is version {version}; unilog needs Postgres 15 or later: upgrade the "
        "server (pg_upgrade) or point DATABASE_URL at a newer one"
    )


def standby_refusal(conn: psycopg.Connection[Any], conninfo: str) -> Exception | None:
    """:class:`ReadOnlyServer` if ``conn``'s server is a hot standby (its ``in_hot_standby``, which the server
    reports at login: no query), else None. No unilog session writes to a standby, and a failover promotes one: a
    worker waits for that, retrying, and never exits or writes meanwhile."""
    if conn.info.parameter_status("in_hot_standby") != "on":
        return None
    return ReadOnlyServer(
        f"Postgres at {redact_url(conninfo)} is a read-only standby (in recovery): waiting for a primary (after a "
        "failover, give DATABASE_URL every host with target_session_attrs=read-write, or a virtual IP)"
    )


def check_schema(conn: psycopg.Connection[Any]) -> None:
    """Raise :class:`SchemaMissing` unless unilog's migrations are applied up to :data:`SCHEMA_HEAD` or later."""
    row = conn.execute(HAS_VERSION_TABLE, (VERSION_TABLE,)).fetchone()
    versions = {r[0] for r in conn.execute(VERSIONS).fetchall()} if row and row[0] else None
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
