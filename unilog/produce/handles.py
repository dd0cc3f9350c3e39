"""The handles a producer stages through, of both faces: SQLAlchemy sessions and connections and psycopg connections,
with the refusals they share (no open transaction, unilog's schema missing, a handle of the wrong kind).

The asyncio names pair with the threaded ones for ``tools/faces.py``: ``AsyncSession``/``Session``,
``AsyncConnection``/``Connection``, :func:`adriver_of`/:func:`driver_of`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from ..errors import NotInTransaction, SchemaMissing

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession


def __getattr__(name: str) -> Any:
    """SQLAlchemy's asyncio handles, imported on first use (by ``emit_async``): a web app that only calls ``emit``
    does not load them. None each where SQLAlchemy's asyncio layer is not installed (it needs greenlet,
    ``sqlalchemy[asyncio]``): then only psycopg's ``AsyncConnection`` works."""
    if name not in ("AsyncConnection", "AsyncSession"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from sqlalchemy.ext import asyncio as sa_asyncio
    except ImportError:  # pragma: no cover - depends on the installation
        return None
    return getattr(sa_asyncio, name)


__all__ = [
    "AsyncConnection",
    "AsyncSession",
    "Connection",
    "Session",
    "adriver_of",
    "driver_of",
    "raise_if_schema_missing",
    "require_transaction",
    "wrong_handle",
]


def driver_of(conn: Connection) -> Any:
    """The DBAPI connection under a SQLAlchemy connection (a psycopg ``Connection`` with the psycopg dialect)."""
    return conn.connection.driver_connection


async def adriver_of(conn: Any) -> Any:
    """:func:`driver_of` for a SQLAlchemy ``AsyncConnection``."""
    return (await conn.get_raw_connection()).driver_connection


def wrong_handle(caller: str, tx: Any) -> TypeError:
    """The error for a handle ``caller`` cannot stage through, naming the handles it takes."""
    if "_async" in caller:
        return TypeError(
            f"{caller} needs a SQLAlchemy AsyncSession or AsyncConnection or a psycopg AsyncConnection, "
            f"got {type(tx)!r} (use {caller.replace('_async', '')} for synchronous handles)"
        )
    return TypeError(f"{caller} needs a SQLAlchemy Session or Connection or a psycopg Connection, got {type(tx)!r}")


def raise_if_schema_missing(exc: BaseException) -> None:
    """Raise :class:`SchemaMissing` if ``exc`` (or what SQLAlchemy wrapped in ``.orig``) is a missing table."""
    missing = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedFunction)
    cause = exc if isinstance(exc, missing) else getattr(exc, "orig", None)
    if isinstance(cause, psycopg.errors.UndefinedTable):
        raise SchemaMissing("staged_log_records does not exist: run `unilog migrate`") from None
    if isinstance(cause, psycopg.errors.UndefinedFunction) and "unilog_stage" in str(cause):
        raise SchemaMissing(
            "unilog_stage() does not exist (the schema predates unilog_0009): run `unilog migrate`"
        ) from None


def require_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], caller: str = "emit()") -> None:
    """Refuse a connection in autocommit mode with no transaction open (see :class:`NotInTransaction`); the error
    names ``caller`` and shows the form of ``conn.transaction()`` for the connection's face."""
    how = "async with" if isinstance(conn, psycopg.AsyncConnection) else "with"
    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        session = "an AsyncSession" if how == "async with" else "a Session"
        raise NotInTransaction(
            f"{caller} needs an open transaction: the connection is in autocommit mode with no transaction open "
            f"(use `{how} conn.transaction():`, a non-autocommit connection, or {session})"
        )
