"""Staging records inside the caller's own transaction.

:func:`emit` writes one row into ``staged_log_records`` through the connection the application is already using.
It never commits and never opens a transaction of its own: the record becomes real exactly when the caller's
transaction commits, and vanishes if it rolls back. Input is validated before anything is sent to Postgres, so a
rejected record leaves the caller's transaction untouched and usable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from .. import tracing
from ..config import validate_stream_name
from ..errors import InvalidRecord, NotInTransaction, SchemaMissing
from ..store import INSERT_STAGED, INSERT_STAGED_MANY, staged_columns
from .encoding import DEFAULT_MAX_PAYLOAD_BYTES, Encoder, encode_data

# INSERT_STAGED's parameters: action, object, data (JSON text), stream, key, traceparent, tracestate.
StagedParams = tuple[str, str, str, str, str | None, str | None, str | None]

# A record for emit_many: emit's keyword arguments (action, object, data; optionally key and stream) as a mapping.
RecordFields = Mapping[str, Any]
_REQUIRED = ("action", "object", "data")
_FIELDS = frozenset((*_REQUIRED, "key", "stream"))


@dataclass(frozen=True)
class Producer:
    """Stages records; holds the producer-side settings.

    ``max_payload_bytes`` bounds the UTF-8 size of a record's JSON; ``default_stream`` (None: the streamer's
    default stream) is used when ``emit`` is called without ``stream``; ``default`` encodes the values in ``data``
    that unilog's rules do not cover (``Decimal``, ``UUID``, dates and times and ``bytes`` are: see
    :func:`emit`): it gets the object and returns something JSON can encode.
    """

    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    default_stream: str | None = None
    default: Encoder | None = None

    def emit(
        self,
        tx: Any,
        *,
        action: str,
        object: str,
        data: Any,
        stream: str | None = None,
        key: str | None = None,
        default: Encoder | None = None,
    ) -> int | None:
        """Stage one record in ``tx``'s transaction and return its staged row's id (None in WAL capture mode, where
        the record is a transactional logical message in the WAL, not a row: see :mod:`unilog.stream.capture`).

        ``tx`` is a SQLAlchemy ``Session`` or ``Connection`` or a psycopg ``Connection``. ``data`` is any JSON value
        (usually a dict), encoded as :func:`unilog.emit` says; ``default`` (else the producer's) encodes other types.
        ``key`` optionally names the aggregate the record belongs to. Raises an
        :class:`~unilog.errors.InvalidRecord` subclass, before writing anything, for bad input.
        """
        params = self.prepare(action=action, object=object, data=data, stream=stream, key=key, default=default)
        return _insert(tx, params)

    def emit_many(
        self, tx: Any, records: Iterable[RecordFields], *, default: Encoder | None = None
    ) -> list[int | None]:
        """Stage many records in ``tx``'s transaction with one statement, in the order given; return their staged
        ids in that order (None for each in WAL capture mode). An empty list stages nothing and sends nothing.

        Each record is a mapping of :meth:`emit`'s keyword arguments: ``action``, ``object`` and ``data``, and
        optionally ``key`` and ``stream``; ``default`` (else the producer's) encodes other types for all of them.
        Every record is checked and encoded as :meth:`emit` does before anything is sent: the first bad one raises
        the :class:`~unilog.errors.InvalidRecord` subclass ``emit`` would, its message starting with
        ``records[i]`` (and its key) and its ``index`` set to ``i``; none is staged and the transaction is usable.
        """
        params = self.prepare_many(records, default=default)
        return _insert_many(tx, params) if params else []

    def prepare_many(self, records: Iterable[RecordFields], *, default: Encoder | None = None) -> list[StagedParams]:
        """:meth:`prepare` for each record of :meth:`emit_many` (no I/O); errors name the record (see there)."""
        out: list[StagedParams] = []
        for i, record in enumerate(records):
            try:
                out.append(self.prepare(**_fields(record), default=default))
            except InvalidRecord as exc:
                named = type(exc)(record_prefix(i, record) + str(exc))
                named.index = i
                raise named from None
        return out

    def prepare(
        self,
        *,
        action: str,
        object: str,
        data: Any,
        stream: str | None = None,
        key: str | None = None,
        default: Encoder | None = None,
    ) -> StagedParams:
        """Validate a record and return the parameters of ``INSERT_STAGED`` (no I/O)."""
        _require_text("action", action)
        _require_text("object", object)
        if key is not None:
            _require_text("key", key)
        target = stream if stream is not None else self.default_stream
        traceparent, tracestate = tracing.current_context()  # (None, None) without OpenTelemetry or a span
        text = encode_data(data, self.max_payload_bytes, default or self.default)
        target = "" if target is None else validate_stream_name(target)
        return action, object, text, target, key, traceparent, tracestate


def record_prefix(index: int, record: Any) -> str:
    """How an error from :meth:`Producer.emit_many` names its record: ``records[i]``, with the record's key."""
    key = record.get("key") if isinstance(record, Mapping) else None
    return f"records[{index}]{'' if key is None else f' (key {key!r})'}: "


def _fields(record: Any) -> dict[str, Any]:
    """One of emit_many's records as emit's keyword arguments, or InvalidRecord for a record of the wrong shape."""
    if not isinstance(record, Mapping):
        raise InvalidRecord(f"a record must be a mapping of emit's arguments, got {type(record).__name__}")
    unknown = sorted(str(name) for name in record if name not in _FIELDS)
    if unknown:
        raise InvalidRecord(f"unknown fields {unknown} (a record has action, object, data, and optionally key, stream)")
    missing = [name for name in _REQUIRED if name not in record]
    if missing:
        raise InvalidRecord(f"missing fields {missing} (a record has action, object, data, and optionally key, stream)")
    return dict(record)


def _require_text(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise InvalidRecord(f"{name} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InvalidRecord(f"{name} must not be empty")
    if "\x00" in value:
        raise InvalidRecord(f"{name} must not contain NUL characters")


def _insert(tx: Any, params: StagedParams) -> int | None:
    run = _runner(tx, "emit()")
    try:
        row = run(INSERT_STAGED, params).fetchone()
    except Exception as exc:
        raise_if_schema_missing(exc)
        raise
    assert row is not None
    return None if row[0] is None else int(row[0])


def _insert_many(tx: Any, params: list[StagedParams]) -> list[int | None]:
    run = _runner(tx, "emit_many()")
    try:
        rows = run(INSERT_STAGED_MANY, staged_columns(params)).fetchall()
    except Exception as exc:
        raise_if_schema_missing(exc)
        raise
    return [None if row[0] is None else int(row[0]) for row in rows]


def _runner(tx: Any, caller: str) -> Callable[..., Any]:
    """How to run a statement in ``tx``'s transaction (refused if it has none): execute or exec_driver_sql."""
    if isinstance(tx, Session):
        tx = tx.connection()  # joins (or autobegins) the session's transaction, as any session statement would
    if isinstance(tx, psycopg.Connection):
        _require_transaction(tx, caller)
        # The application's row factory (dict_row, class_row...) is its own business: unilog reads its RETURNING
        # rows by position, so it runs on a cursor of its own with tuple rows.
        return tx.cursor(row_factory=tuple_row).execute
    if isinstance(tx, Connection):
        driver = tx.connection.driver_connection
        if isinstance(driver, psycopg.Connection):
            _require_transaction(driver, caller)
        return tx.exec_driver_sql
    raise TypeError(f"{caller} needs a SQLAlchemy Session or Connection or a psycopg Connection, got {type(tx)!r}")


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


def require_transaction(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], caller: str = "emit()", how: str = "with"
) -> None:
    """Refuse a connection in autocommit mode with no transaction open (see :class:`NotInTransaction`); the error
    names ``caller`` and shows the ``how`` form of ``conn.transaction()`` (``async with`` for asyncio)."""
    _require_transaction(conn, caller, how)


def _require_transaction(conn: Any, caller: str = "emit()", how: str = "with") -> None:
    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        session = "an AsyncSession" if how == "async with" else "a Session"
        raise NotInTransaction(
            f"{caller} needs an open transaction: the connection is in autocommit mode with no transaction open "
            f"(use `{how} conn.transaction():`, a non-autocommit connection, or {session})"
        )


_default = Producer()


def emit(
    tx: Any,
    *,
    action: str,
    object: str,
    data: Any,
    stream: str | None = None,
    key: str | None = None,
    default: Encoder | None = None,
) -> int | None:
    """Stage a record in the caller's transaction with the default :class:`Producer` settings.

    ``data`` is JSON: dicts, lists, strings, numbers, booleans and None as they are, and by unilog's rules
    ``Decimal`` as its string (``"12.30"``: exact), ``UUID`` as its string, ``datetime``/``date``/``time`` as ISO
    8601 (``isoformat()``: an aware datetime keeps its offset) and ``bytes`` as standard base64 with padding.
    ``default`` encodes anything else: it gets the object and returns something JSON can encode; if it raises, or
    none is given, :class:`~unilog.errors.PayloadNotSerializable` names the value's path and type. See
    :meth:`Producer.emit`.
    """
    return _default.emit(tx, action=action, object=object, data=data, stream=stream, key=key, default=default)


def emit_many(tx: Any, records: Iterable[RecordFields], *, default: Encoder | None = None) -> list[int | None]:
    """Stage many records in the caller's transaction, in one statement and in the order given, with the default
    :class:`Producer` settings; return their staged ids (None each in WAL capture mode). Each record is a mapping
    of :func:`emit`'s arguments (``action``, ``object``, ``data``; optionally ``key``, ``stream``), checked and
    encoded as :func:`emit` does; the first bad one raises before anything is sent, naming it (``records[i]``). See
    :meth:`Producer.emit_many`.
    """
    return _default.emit_many(tx, records, default=default)
