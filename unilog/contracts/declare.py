"""Declaring record types: :func:`record_type`, :func:`upcaster`, the process-wide registry and :class:`Contract`.

A declaration is checked when its module is imported, so a bad one (a name outside ``[A-Za-z][A-Za-z0-9_.-]{0,99}``,
a version below 1, a ``key`` that is not a field, two classes claiming one name and version) stops the import with
one :class:`~unilog.errors.ConfigurationError` line instead of surfacing at the first emit.
"""

from __future__ import annotations

import builtins
import pkgutil
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..config import import_user_module, validate_stream_name
from ..errors import ConfigurationError, InvalidStreamName
from .codec import Codec

TYPE_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,99}")

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
T = TypeVar("T", bound=type)


@dataclass(frozen=True, eq=False)
class Contract:
    """What :func:`record_type` declared about a class: its type's ``name`` and ``version``, where its records go
    (``stream``, None for the producer's default stream; ``object``, ``action``), the class, the field whose
    ``str()`` is the record's key (``key_field``, or None) and the ``upcasters`` that bring older versions' data to
    this one (``{from_version: function}``).

    The JSON Schema is pydantic's in ``mode="validation"``: the consumer's view, what a reader of this version
    accepts (a field with a default is not required), which is what compatibility is about."""

    name: str
    version: int
    stream: str | None
    object: str
    action: str
    cls: type
    key_field: str | None = None
    upcasters: dict[int, Upcaster] = field(default_factory=dict)
    _codec: Codec = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    @property
    def type_tag(self) -> str:
        """``"<name>@<version>"``, the value of a typed entry's ``type`` field (``RideCreated@2``)."""
        return f"{self.name}@{self.version}"

    def encode(self, instance: builtins.object) -> str:
        """Validate ``instance`` (however it was made or changed since) and return its JSON text: ``Decimal`` as a
        string with every digit, ``UUID`` as its string, date/time in ISO 8601, field names by alias. Raises
        :class:`~unilog.errors.RecordContractViolation` naming the field and the rule."""
        return self._codec.encode(instance)

    def decode(self, text: str | bytes, version: int | None = None) -> Any:
        """An instance from a record's ``data`` written at ``version`` (None: this version). Older data goes through
        the upcasters from its version on (a version without one is read as it is); a newer version raises
        :class:`~unilog.errors.UnknownRecordVersion`, data that does not validate
        :class:`~unilog.errors.UnreadableRecord` naming the field and the rule."""
        if version is None or version == self.version:
            return self._codec.decode(text)
        return self._codec.decode_older(text, version, self.version, self.upcasters)

    def json_schema(self) -> dict[str, Any]:
        """Pydantic's JSON Schema of the class, ``mode="validation"`` (a fresh copy: change it freely)."""
        return self._codec.json_schema()

    def fingerprint(self) -> str:
        """``"sha256:<hex>"`` of the JSON Schema as canonical JSON (sorted keys, no spaces): equal schemas, equal
        fingerprints, in any process. Titles and descriptions (docstrings) are part of the schema, so they count."""
        return self._codec.fingerprint()

    def key_of(self, instance: builtins.object) -> str | None:
        """The record key ``instance`` carries: ``str()`` of its ``key_field``, or None without one."""
        if self.key_field is None:
            return None
        value = getattr(instance, self.key_field)
        return None if value is None else str(value)


_REGISTRY: dict[tuple[str, int], Contract] = {}
_LOCK = threading.Lock()


def record_type(
    *,
    object: str,
    action: str,
    stream: str | None = None,
    version: int = 1,
    name: str | None = None,
    key: str | None = None,
) -> Callable[[T], T]:
    """Declare the decorated class (a pydantic v2 ``BaseModel`` or a dataclass) as version ``version`` of the
    record type ``name`` (default: the class's name), emitted to ``stream`` (None: the producer's default stream)
    as ``object``/``action``; ``key`` names the field whose ``str()`` is the record's key unless emit is given one.

    Returns the class unchanged, with its :class:`Contract` as ``cls.__unilog_contract__``, and registers it
    process-wide. A bad declaration raises :class:`~unilog.errors.ConfigurationError` with one line."""

    def declare(cls: T) -> T:
        contract = _contract(cls, object, action, stream, version, name, key)
        _register(contract)
        # type.__setattr__: a frozen pydantic model or a class with a metaclass of its own still takes it
        type.__setattr__(cls, "__unilog_contract__", contract)
        return cls

    return declare


def _contract(
    cls: type, obj: str, action: str, stream: str | None, version: int, name: str | None, key: str | None
) -> Contract:
    where = f"@record_type on {getattr(cls, '__qualname__', cls)!r}"
    if not isinstance(cls, type):
        raise ConfigurationError(f"{where}: decorate a class (a pydantic BaseModel or a dataclass)")
    name = cls.__name__ if name is None else name
    if not isinstance(name, str) or not TYPE_NAME_RE.fullmatch(name):
        raise ConfigurationError(f"{where}: type name {name!r} must match [A-Za-z][A-Za-z0-9_.-]{{0,99}}")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ConfigurationError(f"{where}: version must be an int >= 1, got {version!r}")
    for label, value in (("object", obj), ("action", action)):
        if not isinstance(value, str) or not value:
            raise ConfigurationError(f"{where}: {label} must be a non-empty string, got {value!r}")
    if stream is not None:
        try:
            validate_stream_name(stream)
        except InvalidStreamName as exc:
            raise ConfigurationError(f"{where}: {exc}") from None
    codec = Codec.build(cls, f"{name} v{version}", where)
    if key is not None and key not in codec.field_names:
        raise ConfigurationError(f"{where}: key {key!r} is not a field of {cls.__name__} ({codec.describe_fields()})")
    return Contract(name, version, stream, obj, action, cls, key, {}, codec)


def _register(contract: Contract) -> None:
    with _LOCK:
        known = _REGISTRY.get((contract.name, contract.version))
        if known is not None and _origin(known.cls) != _origin(contract.cls):
            raise ConfigurationError(
                f"record type {contract.name} v{contract.version} is declared twice: by {_origin(known.cls)} and by "
                f"{_origin(contract.cls)}"
            )
        # the same class declared again (its module reloaded, or run as __main__ and imported) replaces itself
        _REGISTRY[(contract.name, contract.version)] = contract


def _origin(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def upcaster(target: type, *, from_version: int) -> Callable[[Upcaster], Upcaster]:
    """Register the decorated function as the step that turns data of version ``from_version`` of ``target``'s
    type into data of version ``from_version + 1`` (a dict in, a dict out), run at consume time: with steps
    ``1 -> 2`` and ``2 -> 3``, a consumer declaring v3 reads v1 records through both. ``target`` is the class of the
    newest version; a step is missing where the change needs none (a field added with a default)."""
    contract = contract_of(target)
    if isinstance(from_version, bool) or not isinstance(from_version, int) or not 1 <= from_version < contract.version:
        raise ConfigurationError(
            f"@upcaster for {contract.name} v{contract.version}: from_version must be an int from 1 to "
            f"{contract.version - 1}, got {from_version!r}"
        )

    def register(function: Upcaster) -> Upcaster:
        known = contract.upcasters.get(from_version)
        if known is not None and _function_origin(known) != _function_origin(function):
            raise ConfigurationError(
                f"@upcaster for {contract.name} v{from_version} -> v{from_version + 1} is declared twice: by "
                f"{_function_origin(known)} and by {_function_origin(function)}"
            )
        contract.upcasters[from_version] = function
        return function

    return register


def _function_origin(function: Callable[..., Any]) -> str:
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', repr(function))}"


def contract_of(cls_or_instance: object) -> Contract:
    """The :class:`Contract` of a declared class or of an instance of one; :class:`~unilog.errors.ConfigurationError`
    if it was not declared with :func:`record_type`."""
    cls = cls_or_instance if isinstance(cls_or_instance, type) else type(cls_or_instance)
    contract = cls.__dict__.get("__unilog_contract__")  # a subclass does not inherit its parent's type
    if not isinstance(contract, Contract):
        raise ConfigurationError(f"{cls.__qualname__} is not a record type: declare it with @record_type(...)")
    return contract


def all_contracts() -> list[Contract]:
    """Every contract declared in this process so far, by name then version."""
    with _LOCK:
        return sorted(_REGISTRY.values(), key=lambda c: (c.name, c.version))


def contracts_in(module_name: str) -> list[Contract]:
    """Import ``module_name`` (and, for a package, every module below it) and return the contracts its classes
    declare, by name then version. Whatever stops an import is one :class:`~unilog.errors.HandlerNotFound` line."""
    module = _import(module_name)
    names = [module_name]
    if hasattr(module, "__path__"):
        for info in pkgutil.walk_packages(module.__path__, prefix=f"{module_name}.", onerror=_walk_failed):
            _import(info.name)
            names.append(info.name)
    inside = set(names)
    return [c for c in all_contracts() if c.cls.__module__ in inside]


def _import(module_name: str) -> Any:
    from ..errors import HandlerNotFound

    try:
        return import_user_module(module_name)
    except (Exception, SystemExit) as exc:  # anything the user's module does while it is imported
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise HandlerNotFound(f"cannot import {module_name!r}: {reason}") from None


def _walk_failed(name: str) -> None:
    _import(name)  # raises, in one line, what stopped the walk from importing a package
