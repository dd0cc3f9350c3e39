"""What consumers are handed: :class:`Record` (one stream entry, decoded lazily), :class:`Batch` (the records of
one transaction) and the :data:`Handler` signature; loading handlers by ``module:function`` reference; and the
markers a replayed dead letter carries.

A replayed dead letter is appended to the stream again with two extra fields: ``replay_of`` (the id of the entry
first dead-lettered) and ``replay_for`` (``consumer:<name>`` or ``group:<name>``, whoever dead-lettered it). Only
that consumer or group applies it; every other one skips it, as it already applied the original (or will).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from types import ModuleType
from typing import Any, cast

import psycopg

from ..errors import HandlerNotFound, InjectedCrash, MalformedEntry

_NO_DATA = object()

REPLAY_OF = b"replay_of"
REPLAY_FOR = b"replay_for"


def replay_owner(kind: str, name: str) -> str:
    """The ``replay_for`` value naming a checkpoint consumer (``kind="consumer"``) or a group (``"group"``)."""
    return f"{kind}:{name}"


class Record:
    """One log record as a handler sees it. ``data`` is decoded from JSON on first access.

    ``producer`` ('' for entries not written by a unilog streamer) and ``position``, the record's (epoch, seq)
    within its producer (None for entries without unilog metadata), are read when the record is made: every
    consumer needs them to deduplicate, so they are plain attributes (this class is the consumers' hot path).
    """

    __slots__ = ("_data", "_fields", "_id", "position", "producer", "stream")

    def __init__(self, stream: str, entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        self.stream = stream
        self._id = entry_id
        self._fields = fields
        self._data: Any = _NO_DATA
        try:
            producer = fields.get(b"producer")
            self.producer: str = producer.decode() if producer else ""
            seq = fields.get(b"seq")
            self.position: tuple[int, int] | None = None if seq is None else (int(fields.get(b"epoch", b"0")), int(seq))
        except ValueError as exc:  # not integers, not UTF-8: another writer's entry, or a damaged one
            raise MalformedEntry(stream, entry_id.decode(errors="replace"), f"bad position fields ({exc})") from None

    def _text(self, name: bytes) -> str | None:
        value = self._fields.get(name)
        return None if value is None else value.decode()

    @property
    def id(self) -> str:
        """The stream entry id, like ``1700000000000-0``."""
        return self._id.decode()

    @property
    def data(self) -> Any:
        """The record's payload, decoded from the entry's ``data`` field (None if it has none)."""
        if self._data is _NO_DATA:
            raw = self._fields.get(b"data")
            try:
                self._data = None if raw is None else json.loads(raw)
            except ValueError as exc:  # the consumer dead-letters the entry (or stops): see MalformedEntry
                raise MalformedEntry(self.stream, self.id, f"data is not JSON ({exc})") from None
        return self._data

    @property
    def raw_data(self) -> bytes | None:
        """The payload's JSON text as stored in the stream."""
        return self._fields.get(b"data")

    @property
    def action(self) -> str | None:
        return self._text(b"action")

    @property
    def object(self) -> str | None:
        return self._text(b"object")

    @property
    def key(self) -> str | None:
        return self._text(b"key")

    @property
    def seq(self) -> int | None:
        pos = self.position
        return None if pos is None else pos[1]

    @property
    def traceparent(self) -> str | None:
        """The W3C trace context of the transaction that staged this record (None if it had none)."""
        return self._text(b"traceparent")

    @property
    def tracestate(self) -> str | None:
        return self._text(b"tracestate")

    def trace_context(self) -> Any:
        """The producer's OpenTelemetry context, to continue its trace (``tracer.start_as_current_span(...,
        context=record.trace_context())``) or link to it; None without OpenTelemetry or a traceparent."""
        from ..tracing import context_of

        return context_of(self.traceparent, self.tracestate)

    @property
    def replay_for(self) -> str | None:
        """``consumer:<name>`` or ``group:<name>`` if this entry is a replayed dead letter (only they apply it)."""
        return self._text(REPLAY_FOR)

    @property
    def origin(self) -> str:
        """The id of the entry this record was first appended as: ``replay_of`` for a replay, else its own id."""
        return self._text(REPLAY_OF) or self.id

    @property
    def created_ms(self) -> int | None:
        value = self._fields.get(b"created")
        return None if value is None else int(value)

    def __repr__(self) -> str:
        return f"Record(stream={self.stream!r}, id={self.id!r}, action={self.action!r}, position={self.position})"


Handler = Callable[[psycopg.Connection[Any], Sequence[Record]], Any]
# an ``async def`` handler, run by the asyncio consumers on a psycopg ``AsyncConnection``
AsyncHandler = Callable[[psycopg.AsyncConnection[Any], Sequence[Record]], Awaitable[Any]]


class Batch(Sequence[Record]):
    """The records handed to a handler; iterating it is where an injected mid-batch crash happens.

    ``consumer`` names who is applying them: the checkpoint consumer's name, or the group's.
    """

    def __init__(self, records: list[Record], crash_at: int | None = None, consumer: str = "") -> None:
        self._records = records
        self._crash_at = crash_at
        self.consumer = consumer

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, index: Any) -> Any:
        return self._records[index]

    def __iter__(self) -> Iterator[Record]:
        for i, record in enumerate(self._records):
            if i == self._crash_at:
                raise InjectedCrash("consumer.crash_mid_batch")
            yield record


MALFORMED_POLICIES = ("dead-letter", "stop")


def check_malformed_policy(policy: str) -> None:
    if policy not in MALFORMED_POLICIES:
        raise ValueError(f"on_malformed must be one of {', '.join(MALFORMED_POLICIES)}, not {policy!r}")


def load_object(ref: str, search: Sequence[str] | None = None) -> Any:
    """Import ``module:attribute`` (or ``module.attribute``) and return the attribute.

    A top-level package or module that is not importable is looked for in ``search`` (default: the working
    directory, as ``python -m`` finds it) and imported from there, without changing ``sys.path``; modules it
    imports by their own top-level names must then be importable (installed, or on ``PYTHONPATH``)."""
    module_name, sep, attr = ref.partition(":")
    if not sep:
        module_name, _, attr = ref.rpartition(".")
    if not module_name or not attr:
        raise HandlerNotFound(f"{ref!r} must look like package.module:name")
    try:
        module = _import(module_name, [os.getcwd()] if search is None else list(search))
    except ImportError as exc:
        raise HandlerNotFound(f"cannot import {module_name!r} for {ref!r}: {exc}") from None
    if not hasattr(module, attr):
        raise HandlerNotFound(f"{module_name!r} has no {attr!r} ({ref!r})")
    return getattr(module, attr)


def _import(module_name: str, search: list[str]) -> ModuleType:
    """``importlib.import_module``, with the top-level name found in ``search`` if it is not importable."""
    top = module_name.partition(".")[0]
    if top not in sys.modules and importlib.util.find_spec(top) is None:
        spec = importlib.machinery.PathFinder.find_spec(top, search)
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            sys.modules[top] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[top]
                raise
    return importlib.import_module(module_name)


def load_handler(ref: str, search: Sequence[str] | None = None) -> Handler:
    """Import ``module:function`` (or ``module.function``) and return the handler (see :func:`load_object`)."""
    handler = load_object(ref, search)
    if not callable(handler):
        raise HandlerNotFound(f"{ref!r} is not callable: a handler is a function (conn, records)")
    return cast(Handler, handler)
