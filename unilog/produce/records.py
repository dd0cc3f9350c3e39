"""What a producer checks and encodes before anything reaches Postgres: a record's fields, its JSON, its stream
(no I/O here, so both faces of ``emit`` share it; a rejected record leaves the caller's transaction untouched)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import tracing
from ..config import validate_stream_name
from ..errors import InvalidRecord
from .encoding import DEFAULT_MAX_PAYLOAD_BYTES, Encoder, encode_data

# INSERT_STAGED's parameters: action, object, data (JSON text), stream, key, traceparent, tracestate.
StagedParams = tuple[str, str, str, str, str | None, str | None, str | None]

# A record for emit_many: emit's keyword arguments (action, object, data; optionally key and stream) as a mapping.
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


DEFAULT_RULES = ProducerRules()
