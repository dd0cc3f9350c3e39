"""Staging records inside the caller's own transaction.

:func:`emit` writes one row into ``staged_log_records`` through the connection the application is already using.
It never commits and never opens a transaction of its own: the record becomes real exactly when the caller's
transaction commits, and vanishes if it rolls back. Input is validated before anything is sent to Postgres, so a
rejected record leaves the caller's transaction untouched and usable.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._sync.emitting import emit, emit_many
from .encoding import Encoder
from .handles import raise_if_schema_missing, require_transaction
from .records import NO_DATA, ProducerRules, RecordFields, StagedParams, record_prefix

__all__ = [
    "Producer",
    "RecordFields",
    "StagedParams",
    "emit",
    "emit_many",
    "raise_if_schema_missing",
    "record_prefix",
    "require_transaction",
]


class Producer(ProducerRules):
    """Stages records; holds the producer-side settings.

    ``max_payload_bytes`` bounds the UTF-8 size of a record's JSON; ``default_stream`` (None: the streamer's
    default stream) is used when ``emit`` is called without ``stream``; ``default`` encodes the values in ``data``
    that unilog's rules do not cover (``Decimal``, ``UUID``, dates and times and ``bytes`` are: see
    :func:`emit`): it gets the object and returns something JSON can encode.
    """

    def emit(
        self,
        tx: Any,
        record: Any = None,
        /,
        *,
        action: str | None = None,
        object: str | None = None,
        data: Any = NO_DATA,
        stream: str | None = None,
        key: str | None = None,
        default: Encoder | None = None,
    ) -> int | None:
        """Stage one record in ``tx``'s transaction and return its staged row's id (None in WAL capture mode, where
        the record is a transactional logical message in the WAL, not a row: see :mod:`unilog.stream.capture`).

        ``tx`` is a SQLAlchemy ``Session`` or ``Connection`` or a psycopg ``Connection``. ``data`` is any JSON value
        (usually a dict), encoded as :func:`unilog.emit` says; ``default`` (else the producer's) encodes other types.
        ``key`` optionally names the aggregate the record belongs to. Raises an
        :class:`~unilog.errors.InvalidRecord` subclass, before writing anything, for bad input. A typed record is
        given alone, in place of ``action``, ``object``, ``data`` and ``stream`` (see :func:`unilog.emit`).
        """
        return emit(
            tx, record, action=action, object=object, data=data, stream=stream, key=key, producer=self, default=default
        )

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
        return emit_many(tx, records, producer=self, default=default)
