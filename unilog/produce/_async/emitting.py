"""Staging records in the caller's own transaction, through whatever handle it holds: a SQLAlchemy ``AsyncSession``
or ``AsyncConnection``, or a psycopg ``AsyncConnection``.

One source, two faces: this module is written once, as asyncio code under ``_async/``, and generated for threads
under ``_sync/``, so both faces refuse, encode and stage alike. The guarantees: the
record is one row (or, in WAL mode, one logical message) in the caller's transaction; nothing commits; a handle
with no open transaction is refused; bad input is refused before anything is sent (the transaction stays usable);
and the active span's trace context is stored with the record.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from ...store import INSERT_STAGED, INSERT_STAGED_MANY, staged_columns
from ..encoding import Encoder
from ..handles import (
    AsyncConnection,
    AsyncSession,
    adriver_of,
    raise_if_schema_missing,
    require_transaction,
    wrong_handle,
)
from ..records import DEFAULT_RULES, NO_DATA, ProducerRules, RecordFields, StagedParams, prepare


async def emit_async(
    tx: Any,
    record: Any = None,
    /,
    *,
    action: str | None = None,
    object: str | None = None,
    data: Any = NO_DATA,
    stream: str | None = None,
    key: str | None = None,
    producer: ProducerRules | None = None,
    default: Encoder | None = None,
) -> int | None:
    """Stage one record in ``tx``'s transaction (the settings of ``producer``, else the defaults) and return its
    staged row's id (None in WAL capture mode, where the record is a logical message in the WAL, not a row).

    ``data`` is JSON: dicts, lists, strings, numbers, booleans and None as they are, and by unilog's rules
    ``Decimal`` as its string (``"12.30"``: exact), ``UUID`` as its string, ``datetime``/``date``/``time`` as ISO
    8601 (``isoformat()``: an aware datetime keeps its offset) and ``bytes`` as standard base64 with padding.
    ``default`` encodes anything else: it gets the object and returns something JSON can encode; if it raises, or
    none is given, :class:`~unilog.errors.PayloadNotSerializable` names the value's path and type. ``key``
    optionally names the aggregate the record belongs to. Bad input raises an
    :class:`~unilog.errors.InvalidRecord` subclass before anything is sent. See :meth:`unilog.Producer.emit`.

    A typed record (an instance of a class declared with :func:`unilog.contracts.record_type`) is given alone, in
    place of ``action``, ``object``, ``data`` and ``stream``, which its type binds: ``emit(tx, RideCreated(...))``.
    Its contract validates and encodes it (:class:`~unilog.errors.RecordContractViolation`, naming the field and
    the rule, before anything is sent) and the entry carries its type, ``name@version``. ``key`` overrides the
    type's key field.
    """
    rules = producer or DEFAULT_RULES
    return await _insert(tx, prepare(rules, record, action, object, data, stream, key, default))


async def emit_many_async(
    tx: Any,
    records: Iterable[RecordFields],
    *,
    producer: ProducerRules | None = None,
    default: Encoder | None = None,
) -> list[int | None]:
    """Stage many records in ``tx``'s transaction, in one statement and in the order given; return their staged
    ids (None each in WAL capture mode). Each record is a mapping of :func:`emit_async`'s arguments (``action``,
    ``object``, ``data``; optionally ``key``, ``stream``), checked and encoded as one record is; the first bad one
    raises before anything is sent, naming it (``records[i]``). An empty list sends nothing. See
    :meth:`unilog.Producer.emit_many`.
    """
    params = (producer or DEFAULT_RULES).prepare_many(records, default=default)
    if not params:
        return []
    caller = f"{emit_many_async.__name__}()"
    rows = await _run(tx, caller, INSERT_STAGED_MANY, staged_columns(params), many=True)
    return [None if row[0] is None else int(row[0]) for row in rows]


async def _insert(tx: Any, params: StagedParams) -> int | None:
    row = await _run(tx, f"{emit_async.__name__}()", INSERT_STAGED, params, many=False)
    assert row is not None
    return None if row[0] is None else int(row[0])


async def _run(tx: Any, caller: str, statement: str, params: tuple[Any, ...], *, many: bool) -> Any:
    """Run ``statement`` in ``tx``'s transaction (refused if it has none); its rows if ``many``, else its row."""
    if AsyncSession is not None and isinstance(tx, AsyncSession):
        tx = await tx.connection()  # joins (or begins) the session's transaction, as any session statement would
    try:
        if isinstance(tx, psycopg.AsyncConnection):
            require_transaction(tx, caller)
            # The application's row factory (dict_row, class_row...) is its own business: unilog reads its RETURNING
            # rows by position, so it runs on a cursor of its own with tuple rows.
            cursor = await tx.cursor(row_factory=tuple_row).execute(statement, params)
            return await (cursor.fetchall() if many else cursor.fetchone())
        if AsyncConnection is not None and isinstance(tx, AsyncConnection):
            driver = await adriver_of(tx)
            if isinstance(driver, psycopg.AsyncConnection):
                require_transaction(driver, caller)
            result = await tx.exec_driver_sql(statement, params)
            return result.fetchall() if many else result.fetchone()
        raise wrong_handle(caller, tx)
    except Exception as exc:
        raise_if_schema_missing(exc)
        raise
