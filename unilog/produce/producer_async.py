"""Staging records from asyncio code: ``await emit_async(tx, ...)`` on a psycopg ``AsyncConnection`` or a SQLAlchemy
``AsyncSession``/``AsyncConnection``.

A function of its own rather than an ``emit`` that is sometimes awaitable: an un-awaited call would stage nothing
and say nothing, and type checkers can tell the two apart. The guarantees are ``emit``'s: the record is one row in
the caller's transaction, nothing commits, a handle with no open transaction is refused, bad input is refused before
anything is sent (the transaction stays usable), and the active span's trace context is stored with the record.
"""

from __future__ import annotations

from typing import Any

import psycopg

from ..store import INSERT_STAGED
from .encoding import Encoder
from .producer import Producer, StagedParams, _default, raise_if_schema_missing, require_transaction

try:  # SQLAlchemy's asyncio layer needs greenlet ("sqlalchemy[asyncio]"); without it only psycopg handles work
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
except ImportError:  # pragma: no cover - depends on the installation
    AsyncConnection = AsyncSession = None  # type: ignore[assignment,misc]


async def emit_async(
    tx: Any,
    *,
    action: str,
    object: str,
    data: Any,
    stream: str | None = None,
    key: str | None = None,
    producer: Producer | None = None,
    default: Encoder | None = None,
) -> int | None:
    """Stage one record in ``tx``'s transaction and return its staged id (None in WAL mode: a message); ``data``
    is encoded as :func:`unilog.emit` says (``default``: your encoder for other types); see
    :meth:`unilog.Producer.emit`."""
    settings = producer or _default
    params = settings.prepare(action=action, object=object, data=data, stream=stream, key=key, default=default)
    return await _insert(tx, params)


async def _insert(tx: Any, params: StagedParams) -> int | None:
    if AsyncSession is not None and isinstance(tx, AsyncSession):
        tx = await tx.connection()  # joins (or begins) the session's transaction
    try:
        if isinstance(tx, psycopg.AsyncConnection):
            require_transaction(tx, "emit_async()", "async with")
            cursor = await tx.execute(INSERT_STAGED, params)
            row = await cursor.fetchone()
        elif AsyncConnection is not None and isinstance(tx, AsyncConnection):
            raw = await tx.get_raw_connection()
            if isinstance(raw.driver_connection, psycopg.AsyncConnection):
                require_transaction(raw.driver_connection, "emit_async()", "async with")
            row = (await tx.exec_driver_sql(INSERT_STAGED, params)).fetchone()
        else:
            raise TypeError(
                "emit_async() needs a SQLAlchemy AsyncSession or AsyncConnection or a psycopg AsyncConnection, "
                f"got {type(tx)!r} (use emit() for synchronous handles)"
            )
    except Exception as exc:
        raise_if_schema_missing(exc)
        raise
    assert row is not None
    return None if row[0] is None else int(row[0])
