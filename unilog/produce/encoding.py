"""A record's ``data`` as JSON text: unilog's rules for the values JSON has no type for, the application's own
encoder for anything else, and one clear error naming what cannot be encoded.

The rules (``docs/guides/producers.md``, "What `data` may hold"), the values SQLAlchemy and Django models hand you
for Numeric, UUID, date/time and binary columns:

* ``Decimal``: its ``str()``, a JSON *string*, so no digit is lost (a JSON number would be read back as a float by
  most consumers): ``Decimal("12.30")`` -> ``"12.30"``; read it back with ``Decimal(value)``;
* ``UUID``: its ``str()``, 36 lowercase hex digits and hyphens;
* ``datetime``, ``date``, ``time``: ``isoformat()``, ISO 8601; a timezone-aware value keeps its UTC offset
  (``"2024-05-01T12:00:00+00:00"``), a naive one has none; read it back with ``datetime.fromisoformat``;
* ``bytes``, ``bytearray``, ``memoryview``: standard base64 with padding (RFC 4648, section 4) as a string; read it
  back with ``base64.b64decode``.

Anything else goes to the ``default`` callable the application gives (``emit(..., default=...)`` or
``Producer(default=...)``): it gets the object and returns something JSON can encode (these rules apply to what it
returns); if it raises, or none was given, the record is refused with :class:`~unilog.errors.PayloadNotSerializable`
naming the value's path and type.

:class:`RawJSON` is JSON text the application already has (a ``to_jsonb(row)`` from Postgres, a request body): it
is staged as it is, so its numbers keep every digit (``0.33333333333333333333`` stays that, where a Python float
would not), after a check that it is one JSON value jsonb can hold.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import uuid
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from ..errors import PayloadNotSerializable, PayloadTooLarge

DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20

Encoder = Callable[[Any], Any]  # an object JSON cannot hold -> something it can


class RawJSON:
    """JSON text to stage as it is, as a record's whole ``data``: ``emit(conn, ..., data=RawJSON(text))``.

    Nothing goes through Python's numbers, so ``{"amount": 0.33333333333333333333}`` reaches the stream with every
    digit (a consumer reads it exactly with ``numbers="decimal"``). The text must be one JSON value with no NaN,
    Infinity or NUL character (jsonb holds none of them) and within the payload limit; otherwise
    :class:`~unilog.errors.PayloadNotSerializable` says what is wrong, before anything is written. Only the whole
    ``data`` may be raw: inside a dict or list it is refused.
    """

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"RawJSON takes JSON text (a str), got {type(text).__name__}")
        self.text = text

    def __repr__(self) -> str:
        return f"RawJSON({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RawJSON) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


class PostgresJSON(RawJSON):
    """JSON text Postgres built (``row_to_json``, ``to_jsonb(...)::text``): valid by construction, so only its size
    is checked. Internal: what ``unilog backfill`` stages; an application's text is a :class:`RawJSON`."""

    __slots__ = ()


def _raw_problem(text: str) -> str | None:
    """Why ``text`` is not one JSON value jsonb can hold, or None. Numbers are parsed as text: never rounded."""

    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON")

    try:
        value = json.loads(text, parse_float=str, parse_int=str, parse_constant=constant)
    except ValueError as exc:
        return f"data is RawJSON that is not one JSON value ({exc})"
    if "\\u0000" in text:  # escaped, so look at what it decodes to
        return _Walk(encode_value, False).problem(value, "data")
    return None


def encode_value(value: Any) -> Any:
    """The JSON form of ``value`` by unilog's rules (see the module docstring); ``TypeError`` for any other type."""
    if isinstance(value, RawJSON):
        raise TypeError("RawJSON is only accepted as the whole data")
    if isinstance(value, Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, dt.date | dt.time):  # datetime is a date
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")


class _EncoderFailed(TypeError):
    """The application's encoder raised: json stops, and the error is explained by walking the data."""


def _chained(default: Encoder) -> Encoder:
    """unilog's rules, then the application's ``default`` for anything else."""

    def encode(value: Any) -> Any:
        try:
            return encode_value(value)
        except TypeError:
            pass
        try:
            return default(value)
        except Exception as exc:
            raise _EncoderFailed(str(exc)) from exc

    return encode


_OPTIONS: dict[str, Any] = {"ensure_ascii": False, "allow_nan": False, "separators": (",", ":"), "check_circular": True}
_encoder = json.JSONEncoder(default=encode_value, **_OPTIONS)


def encode_data(data: Any, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES, default: Encoder | None = None) -> str:
    """Encode ``data`` as compact JSON by the rules above (``default``: the application's encoder for other types),
    or raise an error that names the offending key and type."""
    if isinstance(data, RawJSON):
        return _raw_text(data, max_bytes)
    value_of = encode_value if default is None else _chained(default)
    try:
        text = (_encoder if default is None else json.JSONEncoder(default=value_of, **_OPTIONS)).encode(data)
    except (TypeError, ValueError, RecursionError):
        raise PayloadNotSerializable(_explain(data, value_of, default is not None)) from None
    # Postgres's jsonb cannot store NUL characters; json escapes them, so look for the escape, then confirm.
    if "\\u0000" in text and (problem := _Walk(value_of, default is not None).problem(data, "data")) is not None:
        raise PayloadNotSerializable(problem)
    if len(text) * 4 > max_bytes or not text.isascii():
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise PayloadNotSerializable(_explain(data, value_of, default is not None)) from None
        if size > max_bytes:
            raise PayloadTooLarge(f"data is {size} bytes as JSON, over the limit of {max_bytes} bytes")
    return text


def _raw_text(data: RawJSON, max_bytes: int) -> str:
    if not isinstance(data, PostgresJSON) and (problem := _raw_problem(data.text)) is not None:
        raise PayloadNotSerializable(problem)
    try:
        size = len(data.text.encode("utf-8"))
    except UnicodeEncodeError:
        raise PayloadNotSerializable("data is RawJSON containing a lone surrogate, which is not valid UTF-8") from None
    if size > max_bytes:
        raise PayloadTooLarge(f"data is {size} bytes as JSON, over the limit of {max_bytes} bytes")
    return data.text


def _explain(data: Any, value_of: Encoder, given: bool) -> str:
    return _Walk(value_of, given).problem(data, "data") or "data is not JSON-serializable"


class _Walk:
    """Walks a value the way the encoder does and describes the first thing JSON (or jsonb) cannot hold, with its
    path. ``value_of`` converts what JSON has no type for; ``given``: an application's encoder is part of it."""

    def __init__(self, value_of: Encoder, given: bool) -> None:
        self.value_of, self.given = value_of, given

    def problem(self, value: Any, path: str, depth: int = 0) -> str | None:
        if depth > 500:
            return f"{path} is nested too deeply (or contains itself)"
        if value is None or isinstance(value, bool | int):
            return None
        if isinstance(value, float):
            return None if math.isfinite(value) else f"{path} is {value!r}: NaN and Infinity are not valid JSON"
        if isinstance(value, str):
            return _string_problem(value, path)
        if isinstance(value, Mapping) and isinstance(value, dict):
            return self._mapping(value, path, depth)
        if isinstance(value, list | tuple):
            for i, v in enumerate(value):
                if problem := self.problem(v, f"{path}[{i}]", depth + 1):
                    return problem
            return None
        return self._converted(value, path, depth)

    def _mapping(self, value: dict[Any, Any], path: str, depth: int) -> str | None:
        for k, v in value.items():
            if not isinstance(k, str | int | float | bool) and k is not None:
                return f"{path} has a key of type {type(k).__name__} ({k!r}): JSON object keys must be strings"
            if isinstance(k, str) and (problem := _string_problem(k, f"{path} key {k!r}")):
                return problem
            if problem := self.problem(v, f"{path}[{k!r}]", depth + 1):
                return problem
        return None

    def _converted(self, value: Any, path: str, depth: int) -> str | None:
        kind = type(value).__name__
        if isinstance(value, RawJSON):
            return f"{path} is RawJSON, which is accepted only as the whole data (emit(..., data=RawJSON(text)))"
        try:
            converted = self.value_of(value)
        except _EncoderFailed as exc:
            cause = exc.__cause__ or exc
            reason = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
            return f"{path} is of type {kind}, and the default= encoder raised {' '.join(reason.split())}"
        except TypeError:
            hint = "" if self.given else " (give a default= encoder for it)"
            return f"{path} is of type {kind}, which is not JSON-serializable{hint}"
        if converted is value:
            return f"{path} is of type {kind}, and the default= encoder returned it unchanged"
        return self.problem(converted, path, depth + 1)


def _string_problem(value: str, path: str) -> str | None:
    if "\x00" in value:
        return f"{path} contains a NUL character, which Postgres jsonb cannot store"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return f"{path} contains a lone surrogate, which is not valid UTF-8"
    return None
