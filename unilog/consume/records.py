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
import sysconfig
import traceback
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from decimal import Decimal
from types import ModuleType
from typing import Any, TypeVar, cast

import psycopg

from ..config import import_user_module
from ..errors import HandlerNotFound, InjectedCrash, MalformedEntry, UnreadableRecord

T = TypeVar("T")

_NO_DATA = object()

REPLAY_OF = b"replay_of"
REPLAY_FOR = b"replay_for"


def replay_owner(kind: str, name: str) -> str:
    """The ``replay_for`` value naming a checkpoint consumer (``kind="consumer"``) or a group (``"group"``)."""
    return f"{kind}:{name}"


class Record:
    """One log record as a handler sees it. ``data`` is decoded from JSON on first access.

    ``numbers``: how ``data`` reads a JSON number with a fraction or an exponent. ``"float"`` (the default) gives a
    Python ``float``, as ``json.loads`` does: ``0.33333333333333333333`` becomes ``0.3333333333333333``.
    ``"decimal"`` gives a ``decimal.Decimal`` with every digit, for amounts a handler sums. Integers are ``int``
    either way (exact at any size). Set it on the consumer (``ConsumerConfig(numbers="decimal")``, ``unilog consume
    --numbers decimal``); :attr:`raw_data` is the JSON text as it is in the stream.

    ``producer`` ('' for entries not written by a unilog streamer) and ``position``, the record's (epoch, seq)
    within its producer (None for entries without unilog metadata), are read when the record is made: every
    consumer needs them to deduplicate, so they are plain attributes (this class is the consumers' hot path).
    """

    __slots__ = ("_data", "_exact", "_fields", "_id", "position", "producer", "stream")

    def __init__(self, stream: str, entry_id: bytes, fields: dict[bytes, bytes], numbers: str = "float") -> None:
        self.stream = stream
        self._id = entry_id
        self._fields = fields
        self._data: Any = _NO_DATA
        self._exact = numbers == "decimal"
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
                self._data = (
                    None if raw is None else json.loads(raw, parse_float=Decimal) if self._exact else json.loads(raw)
                )
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

    @property
    def type_name(self) -> str | None:
        """The name of the record's type (:mod:`unilog.contracts`), None for an untyped record."""
        tag = self._fields.get(b"type")
        if not tag:
            return None
        name, at, _version = tag.decode(errors="replace").rpartition("@")
        if not at or not name:
            raise MalformedEntry(self.stream, self.id, f"bad type field {tag!r} (a type is name@version)")
        return name

    @property
    def type_version(self) -> int | None:
        """The version of the record's type it was written with, None for an untyped record."""
        tag = self._fields.get(b"type")
        if not tag:
            return None
        try:
            return int(tag.rpartition(b"@")[2])
        except ValueError:
            raise MalformedEntry(self.stream, self.id, f"bad type field {tag!r}") from None

    def is_a(self, cls: type) -> bool:
        """Whether this record is of ``cls``'s type: its entry names the type, or, untyped (a producer that gave no
        type, such as ``unilog_emit`` without one), it has the type's object and action."""
        contract = _contract_of(cls)
        name = self.type_name
        if name is not None:
            return bool(name == contract.name)
        return self.object == contract.object and self.action == contract.action

    def typed(self, cls: type[T]) -> T:
        """The record as an instance of ``cls``, a class declared with :func:`unilog.contracts.record_type`:
        validated, ``Decimal`` fields exact, an older version brought up to ``cls``'s through its upcasters. A
        record that cannot be read so (another type, a version newer than ``cls``'s, data the type refuses) raises
        :class:`~unilog.errors.UnreadableRecord`, a :class:`~unilog.errors.MalformedEntry`: the consumer applies
        its ``on_malformed`` policy to the record, dead-lettering it with the reason by default."""
        contract = _contract_of(cls)
        if not self.is_a(cls):
            found = self.type_name or f"an untyped {self.object}/{self.action} record"
            raise UnreadableRecord(f"it is {found}, not {contract.name}", self.stream, self.id)
        raw = self._fields.get(b"data")
        try:
            return cast(T, contract.decode(b"null" if raw is None else raw, self.type_version))
        except UnreadableRecord as exc:
            raise exc.at(self.stream, self.id) from None

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

    def typed(self, cls: type[T]) -> list[T]:
        """The records of ``cls``'s type (see :meth:`Record.is_a`), in order, as instances of ``cls`` (see
        :meth:`Record.typed`); records of other types are left out."""
        return typed_records(self, (cls,))


def typed_records(records: Iterable[Record], wanted: tuple[type, ...]) -> list[Any]:
    """The records of the ``wanted`` types among ``records``, in order, each as an instance of its class. A record
    whose ``type`` field is exactly a wanted class's own ``name@version`` (nearly every one) is decoded straight
    away; any other goes through :meth:`Record.is_a` and :meth:`Record.typed` (older versions, untyped records)."""
    contracts = [_contract_of(cls) for cls in wanted]
    exact = {contract.type_tag.encode(): contract for contract in contracts}
    out = []
    for record in records:  # iterating a batch is where an injected mid-batch crash happens
        fields = record._fields
        contract = exact.get(fields.get(b"type", b""))
        if contract is not None:
            try:
                out.append(contract.decode(fields.get(b"data", b"null")))
            except UnreadableRecord as exc:
                raise exc.at(record.stream, record.id) from None
            continue
        for cls in wanted:
            if record.is_a(cls):
                out.append(record.typed(cls))
                break
    return out


def _contract_of(cls: type) -> Any:
    contract = cls.__dict__.get("__unilog_contract__") if isinstance(cls, type) else None
    if contract is None:
        raise TypeError(f"{cls!r} is not a record type: declare it with unilog.contracts.record_type")
    return contract


def load_object(ref: str, search: Sequence[str] | None = None) -> Any:
    """Import ``module:attribute`` and return the attribute. A reference without ``:`` is refused
    (:class:`~unilog.errors.HandlerNotFound`, naming the ``module:attribute`` it may have meant): the dotted form
    would turn a mistyped reference into another, valid-looking one.

    A top-level package or module that is not importable is looked for in ``search`` (default: the working
    directory, as ``python -m`` finds it) and imported from there, without changing ``sys.path``; modules it
    imports by their own top-level names must then be importable (installed, or on ``PYTHONPATH``). Whatever stops
    the import (a missing module, a syntax error, an exception the module raises, a missing dependency of it) or
    the attribute is :class:`~unilog.errors.HandlerNotFound`, in one line."""
    return _load(ref, search, ("a reference is module:attribute", "name", "module:attribute"))


def _load(ref: str, search: Sequence[str] | None, form: tuple[str, str, str]) -> Any:
    """:func:`load_object`; ``form``: how a reference looks, an attribute name for the example and the form's
    short name, for the errors."""
    module_name, sep, attr = ref.partition(":")
    if not sep:
        raise HandlerNotFound(_not_colon_form(ref, form))
    if not module_name or not attr:
        raise HandlerNotFound(f"{ref!r} must look like package.{form[2]}")
    try:
        module = _import(module_name, [os.getcwd()] if search is None else list(search))
    except (Exception, SystemExit) as exc:  # anything the module does while it is imported: the user's code
        raise HandlerNotFound(_import_failed(module_name, ref, exc)) from None
    found = getattr(module, attr, None)
    if isinstance(found, ModuleType):
        raise HandlerNotFound(f"{ref!r} is a module: {form[0]}, like '{ref}:{form[1]}'")
    if not hasattr(module, attr):
        raise HandlerNotFound(f"{module_name!r} has no {attr!r} ({ref!r})")
    return found


def _not_colon_form(ref: str, form: tuple[str, str, str]) -> str:
    """The one line refusing ``ref``, which has no ``:``: a module's name is told how a reference looks; a dotted
    name is shown the ``module:attribute`` it may have meant."""
    module_name, _, attr = ref.rpartition(".")
    if _is_module(ref):
        return f"{ref!r} is a module: {form[0]}, like '{ref}:{form[1]}'"
    if not module_name or not attr:
        return f"{ref!r} must look like package.{form[2]}"
    return f"{ref!r} is not {form[2]}: did you mean '{module_name}:{attr}'?"


def _import_failed(module_name: str, ref: str, exc: BaseException) -> str:
    """One line saying why ``module_name`` could not be imported for ``ref``."""
    where = f"cannot import {module_name!r} for {ref!r}"
    if isinstance(exc, ModuleNotFoundError) and exc.name and _names_part_of(exc.name, module_name):
        return f"{where}: no module named {exc.name!r} (in the working directory or on PYTHONPATH)"
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return f"{where}: it imports {exc.name!r}, which cannot be found (not installed, or not on PYTHONPATH)"
    if isinstance(exc, SyntaxError):
        return f"{where}: {type(exc).__name__} in {exc.filename}, line {exc.lineno}: {' '.join(str(exc.msg).split())}"
    frame = _raising_line(exc)
    at = f" at {frame.filename}, line {frame.lineno}" if frame is not None else ""
    return f"{where}: importing it raised {_flat(exc)}{at}"


def _raising_line(exc: BaseException) -> traceback.FrameSummary | None:
    """The line of the application's code that raised ``exc`` while it was imported: the innermost frame below the
    import machinery outside the standard library and installed packages (``os.environ[...]`` is reported where
    the module asked, not inside ``os``), else the imported module's own line."""
    frames = traceback.extract_tb(exc.__traceback__)
    first = next((i for i, f in enumerate(frames) if f.filename.startswith("<frozen importlib")), None)
    imported = [f for f in frames[first or 0 :] if not f.filename.startswith("<")]
    own = [f for f in imported if not f.filename.startswith(_LIBRARIES)]
    return own[-1] if own else (imported[0] if imported else None)


_LIBRARIES = tuple(
    {
        os.path.join(path, "")
        for key, path in sysconfig.get_paths().items()
        if key in ("stdlib", "platstdlib", "purelib", "platlib")
    }
)


def _flat(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _names_part_of(missing: str, module_name: str) -> bool:
    """Whether ``missing`` is ``module_name`` or one of its parent packages (the reference's own module is absent)."""
    return module_name == missing or module_name.startswith(missing + ".")


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except Exception:  # its parent is not a package
        return False


def _import(module_name: str, search: list[str]) -> ModuleType:
    """:func:`unilog.config.import_user_module`: the top-level name found in ``search`` if it is not
    importable."""
    return import_user_module(module_name, search)


def load_handler(ref: str, search: Sequence[str] | None = None) -> Handler:
    """Import ``module:function`` and return the handler (see :func:`load_object`; a reference without ``:`` is
    refused)."""
    handler = _load(ref, search, ("a handler reference is module:function", "handle", "module:function"))
    if not callable(handler):
        raise HandlerNotFound(f"{ref!r} is not callable: a handler is a function (conn, records)")
    return cast(Handler, handler)
