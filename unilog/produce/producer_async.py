"""Staging records from asyncio code: ``await emit_async(tx, ...)`` on a psycopg ``AsyncConnection`` or a SQLAlchemy
``AsyncSession``/``AsyncConnection``.

A function of its own rather than an ``emit`` that is sometimes awaitable: an un-awaited call would stage nothing
and say nothing, and type checkers can tell the two apart. The guarantees are ``emit``'s: the record is one row in
the caller's transaction, nothing commits, a handle with no open transaction is refused, bad input is refused before
anything is sent (the transaction stays usable), and the active span's trace context is stored with the record.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from ..store import INSERT_STAGED, INSERT_STAGED_MANY, staged_columns
from .encoding import Encoder
from .producer import (
    Producer,
    RecordFields,
    StagedParams,
    _default,
    raise_if_schema_missing,
    require_transaction,
)

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


async def emit_many_async(
    tx: Any,
    records: Iterable[RecordFields],
    *,
    producer: Producer | None = None,
    default: Encoder | None = None,
) -> list[int | None]:
    """Stage many records in ``tx``'s transaction with one statement, in the order given, and return their staged
    ids (None each in WAL mode); the records, checks and errors are :meth:`unilog.Producer.emit_many`'s, and an
    empty list sends nothing."""
    params = (producer or _default).prepare_many(records, default=default)
    if not params:
        return []
    rows = await _run(tx, "emit_many_async()", INSERT_STAGED_MANY, staged_columns(params), many=True)
    return [None if row[0] is None else int(row[0]) for row in rows]


async def _insert(tx: Any, params: StagedParams) -> int | None:
    row = await _run(tx, "emit_async()", INSERT_STAGED, params, many=False)
    assert row is not None
    return None if row[0] is None else int(row[0])


async def _run(tx: Any, caller: str, statement: str, params: tuple[Any, ...], *, many: bool) -> Any:
    """Run ``statement`` in ``tx``'s transaction (refused if it has none); its rows if ``many``, else its row."""
    if AsyncSession is not None and isinstance(tx, AsyncSession):
        tx = await tx.connection()  # joins (or begins) the session's transaction
    try:
        if isinstance(tx, psycopg.AsyncConnection):
            require_transaction(tx, caller, "async with")
            # unilog reads its rows by position, whatever row factory the application gave its connection
            cursor = await tx.cursor(row_factory=tuple_row).execute(statement, params)
            return await (cursor.fetchall() if many else cursor.fetchone())
        if AsyncConnection is not None and isinstance(tx, AsyncConnection):
            raw = await tx.get_raw_connection()
            if isinstance(raw.driver_connection, psycopg.AsyncConnection):
                require_transaction(raw.driver_connection, caller, "async with")
            result = await tx.exec_driver_sql(statement, params)
            return result.fetchall() if many else result.fetchone()
        raise TypeError(
            f"{caller} needs a SQLAlchemy AsyncSession or AsyncConnection or a psycopg AsyncConnection, "
            f"got {type(tx)!r} (use {caller.replace('_async', '')} for synchronous handles)"
        )
    except Exception as exc:
        raise_if_schema_missing(exc)
        raise
