"""Staging records inside the caller's own transaction.

:func:`emit` writes one row into ``staged_log_records`` through the connection the application is already using.
It never commits and never opens a transaction of its own: the record becomes real exactly when the caller's
transaction commits, and vanishes if it rolls back. Input is validated before anything is sent to Postgres, so a
rejected record leaves the caller's transaction untouched and usable.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from .. import tracing
from ..config import validate_stream_name
from ..errors import InvalidRecord, NotInTransaction, PayloadNotSerializable, PayloadTooLarge, SchemaMissing
from ..store import INSERT_STAGED

DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20

# INSERT_STAGED's parameters: action, object, data (JSON text), stream, key, traceparent, tracestate.
StagedParams = tuple[str, str, str, str, str | None, str | None, str | None]

_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"), check_circular=True)


@dataclass(frozen=True)
class Producer:
    """Stages records; holds the producer-side settings.

    ``max_payload_bytes`` bounds the UTF-8 size of a record's JSON; ``default_stream`` (None: the streamer's
    default stream) is used when ``emit`` is called without ``stream``.
    """

    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    default_stream: str | None = None

    def emit(
        self,
        tx: Any,
        *,
        action: str,
        object: str,
        data: Any,
        stream: str | None = None,
        key: str | None = None,
    ) -> int:
        """Stage one record in ``tx``'s transaction and return its staged id.

        ``tx`` is a SQLAlchemy ``Session`` or ``Connection`` or a psycopg ``Connection``. ``data`` is any JSON value
        (usually a dict). ``key`` optionally names the aggregate the record belongs to. Raises an
        :class:`~unilog.errors.InvalidRecord` subclass, before writing anything, for bad input.
        """
        params = self.prepare(action=action, object=object, data=data, stream=stream, key=key)
        return _insert(tx, params)

    def prepare(
        self,
        *,
        action: str,
        object: str,
        data: Any,
        stream: str | None = None,
        key: str | None = None,
    ) -> StagedParams:
        """Validate a record and return the parameters of ``INSERT_STAGED`` (no I/O)."""
        _require_text("action", action)
        _require_text("object", object)
        if key is not None:
            _require_text("key", key)
        target = stream if stream is not None else self.default_stream
        traceparent, tracestate = tracing.current_context()  # (None, None) without OpenTelemetry or a span
        text = encode_data(data, self.max_payload_bytes)
        target = "" if target is None else validate_stream_name(target)
        return action, object, text, target, key, traceparent, tracestate


def _require_text(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise InvalidRecord(f"{name} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InvalidRecord(f"{name} must not be empty")
    if "\x00" in value:
        raise InvalidRecord(f"{name} must not contain NUL characters")


def encode_data(data: Any, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """Encode ``data`` as compact JSON, or raise an error that names the offending key and type."""
    try:
        text = _encoder.encode(data)
    except (TypeError, ValueError, RecursionError):
        raise PayloadNotSerializable(_explain(data)) from None
    # Postgres's jsonb cannot store NUL characters; json escapes them, so look for the escape, then confirm.
    if "\\u0000" in text and (problem := _find_problem(data, "data")) is not None:
        raise PayloadNotSerializable(problem)
    if len(text) * 4 > max_bytes or not text.isascii():
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise PayloadNotSerializable(_explain(data)) from None
        if size > max_bytes:
            raise PayloadTooLarge(f"data is {size} bytes as JSON, over the limit of {max_bytes} bytes")
    return text


def _explain(data: Any) -> str:
    return _find_problem(data, "data") or "data is not JSON-serializable"


def _find_problem(value: Any, path: str, depth: int = 0) -> str | None:
    """Walk ``value`` and describe the first thing JSON (or jsonb) cannot hold, with its path."""
    if depth > 500:
        return f"{path} is nested too deeply (or contains itself)"
    if value is None or isinstance(value, bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value!r}: NaN and Infinity are not valid JSON"
    if isinstance(value, str):
        return _string_problem(value, path)
    if isinstance(value, Mapping) and isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str | int | float | bool) and k is not None:
                return f"{path} has a key of type {type(k).__name__} ({k!r}): JSON object keys must be strings"
            if isinstance(k, str) and (problem := _string_problem(k, f"{path} key {k!r}")):
                return problem
            if problem := _find_problem(v, f"{path}[{k!r}]", depth + 1):
                return problem
        return None
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            if problem := _find_problem(v, f"{path}[{i}]", depth + 1):
                return problem
        return None
    return f"{path} is of type {type(value).__name__}, which is not JSON-serializable"


def _string_problem(value: str, path: str) -> str | None:
    if "\x00" in value:
        return f"{path} contains a NUL character, which Postgres jsonb cannot store"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return f"{path} contains a lone surrogate, which is not valid UTF-8"
    return None


def _insert(tx: Any, params: StagedParams) -> int:
    if isinstance(tx, Session):
        tx = tx.connection()  # joins (or autobegins) the session's transaction, as any session statement would
    run: Callable[..., Any]
    if isinstance(tx, psycopg.Connection):
        _require_transaction(tx)
        run = tx.execute
    elif isinstance(tx, Connection):
        driver = tx.connection.driver_connection
        if isinstance(driver, psycopg.Connection):
            _require_transaction(driver)
        run = tx.exec_driver_sql
    else:
        raise TypeError(f"emit() needs a SQLAlchemy Session or Connection or a psycopg Connection, got {type(tx)!r}")
    try:
        row = run(INSERT_STAGED, params).fetchone()
    except Exception as exc:
        raise_if_schema_missing(exc)
        raise
    assert row is not None
    return int(row[0])


def raise_if_schema_missing(exc: BaseException) -> None:
    """Raise :class:`SchemaMissing` if ``exc`` (or what SQLAlchemy wrapped in ``.orig``) is a missing table."""
    if isinstance(exc, psycopg.errors.UndefinedTable) or isinstance(
        getattr(exc, "orig", None), psycopg.errors.UndefinedTable
    ):
        raise SchemaMissing("staged_log_records does not exist: run `unilog migrate`") from None


def require_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Refuse a connection in autocommit mode with no transaction open (see :class:`NotInTransaction`)."""
    _require_transaction(conn)


def _require_transaction(conn: Any) -> None:
    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        raise NotInTransaction(
            "emit() needs an open transaction: the connection is in autocommit mode with no transaction open "
            "(use `with conn.transaction():`, a non-autocommit connection, or a Session)"
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
) -> int:
    """Stage a record in the caller's transaction with the default :class:`Producer` settings.

    See :meth:`Producer.emit`.
    """
    return _default.emit(tx, action=action, object=object, data=data, stream=stream, key=key)
