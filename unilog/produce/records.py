"""What a producer checks and encodes before anything reaches Postgres: a record's fields, its JSON, its stream
(no I/O here, so both faces of ``emit`` share it; a rejected record leaves the caller's transaction untouched)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import tracing
from ..config import validate_stream_name
from ..errors import InvalidRecord
from .encoding import DEFAULT_MAX_PAYLOAD_BYTES, Encoder, PostgresJSON, encode_data

# INSERT_STAGED's parameters: action, object, data (JSON text), stream, key, traceparent, tracestate, record type.
StagedParams = tuple[str, str, str, str, str | None, str | None, str | None, str | None]

# A record for emit_many: emit's keyword arguments (action, object, data; optionally key and stream) as a mapping,
# or a typed record (an instance of a class declared with unilog.contracts.record_type).
RecordFields = Mapping[str, Any]
_REQUIRED = ("action", "object", "data")
_FIELDS = frozenset((*_REQUIRED, "key", "stream"))


@dataclass(frozen=True)
class ProducerRules:
    """The producer-side settings and the checks they drive (see :class:`unilog.Producer`, which adds ``emit``).

    ``max_payload_bytes`` bounds the UTF-8 size of a record's JSON; ``default_stream`` (None: the streamer's
    default stream) is used when ``emit`` is called without ``stream``; ``default`` encodes the values in ``data``
    that unilog's rules do not cover (``Decimal``, ``UUID``, dates and times and ``bytes`` are: see
    :func:`unilog.emit`): it gets the object and returns something JSON can encode.
    """

    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    default_stream: str | None = None
    default: Encoder | None = None

    def prepare_many(self, records: Iterable[RecordFields], *, default: Encoder | None = None) -> list[StagedParams]:
        """:meth:`prepare` for each record of :meth:`emit_many` (no I/O); errors name the record (see there)."""
        out: list[StagedParams] = []
        for i, record in enumerate(records):
            try:
                typed = typed_contract(record)
                if typed is not None:
                    out.append(self.prepare_typed(record, typed))
                elif isinstance(record, Mapping) and "record" in record:  # {"record": typed, "key": its key}
                    out.append(self.prepare_typed(record["record"], _typed_of(record), record.get("key")))
                else:
                    out.append(self.prepare(**_fields(record), default=default))
            except InvalidRecord as exc:
                exc.args = (record_prefix(i, record) + str(exc), *exc.args[1:])  # its own attributes kept (field, rule)
                exc.index = i
                raise exc from None
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
        return action, object, text, target, key, traceparent, tracestate, None

    def prepare_typed(self, record: Any, contract: Any, key: str | None = None) -> StagedParams:
        """:meth:`prepare` for a typed record (``contract``: its class's :class:`unilog.contracts.Contract`): the
        contract validates and encodes it (:class:`~unilog.errors.RecordContractViolation` names the field and the
        rule); its stream, object and action are the type's; its key is ``key``, else its key field's value."""
        text = encode_data(PostgresJSON(contract.encode(record)), self.max_payload_bytes)
        if key is None and contract.key_field is not None:
            value = getattr(record, contract.key_field)
            key = None if value is None else str(value)
        if key is not None:
            _require_text("key", key)
        stream = contract.stream if contract.stream is not None else self.default_stream
        traceparent, tracestate = tracing.current_context()
        return (
            contract.action,
            contract.object,
            text,
            "" if stream is None else stream,
            key,
            traceparent,
            tracestate,
            contract.type_tag,
        )


NO_DATA: Any = object()  # emit's ``data`` when none is given (None is a record's JSON null)


def prepare(
    rules: ProducerRules,
    record: Any,
    action: str | None,
    object: str | None,
    data: Any,
    stream: str | None,
    key: str | None,
    default: Encoder | None,
) -> StagedParams:
    """What ``emit`` stages for its arguments: a typed ``record``, alone, or ``action``, ``object`` and ``data``."""
    if record is not None:
        contract = typed_contract(record)
        if contract is None:
            raise InvalidRecord(
                f"emit takes a typed record (a class declared with unilog.contracts.record_type) or action=, "
                f"object=, data=; got a {type(record).__name__}"
            )
        if action is not None or object is not None or data is not NO_DATA or stream is not None:
            raise InvalidRecord(f"a typed record ({contract.type_tag}) sets its own action, object, data and stream")
        return rules.prepare_typed(record, contract, key)
    if data is NO_DATA:
        raise InvalidRecord("emit needs a typed record, or action=, object= and data=")
    # action and object are checked there: None is refused with the message naming the field
    return rules.prepare(action=action, object=object, data=data, stream=stream, key=key, default=default)  # type: ignore[arg-type]


def typed_contract(record: Any) -> Any:
    """The contract of ``record``'s class when it was declared with :func:`unilog.contracts.record_type`, else
    None (a class attribute look-up: the untyped path pays nothing else)."""
    return type(record).__dict__.get("__unilog_contract__")  # a subclass is not its parent's type


def record_prefix(index: int, record: Any) -> str:
    """How an error from :meth:`Producer.emit_many` names its record: ``records[i]``, with the record's key."""
    key = record.get("key") if isinstance(record, Mapping) else _typed_key(record)
    return f"records[{index}]{'' if key is None else f' (key {key!r})'}: "


def _typed_of(fields: Mapping[str, Any]) -> Any:
    """The contract of ``{"record": typed record, "key": ...}``, emit_many's form of a typed record with a key."""
    unknown = sorted(str(name) for name in fields if name not in ("record", "key"))
    contract = typed_contract(fields["record"])
    if unknown or contract is None:
        raise InvalidRecord("a typed record with a key is {'record': <typed record>, 'key': <str>}, nothing else")
    return contract


def _typed_key(record: Any) -> str | None:
    contract = typed_contract(record)
    if contract is None or contract.key_field is None:
        return None
    value = getattr(record, contract.key_field, None)
    return None if value is None else str(value)


def _fields(record: Any) -> dict[str, Any]:
    """One of emit_many's records as emit's keyword arguments, or InvalidRecord for a record of the wrong shape."""
    if not isinstance(record, Mapping):
        raise InvalidRecord(
            f"a record must be a mapping of emit's arguments or a typed record, got {type(record).__name__}"
        )
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


DEFAULT_RULES = ProducerRules()
