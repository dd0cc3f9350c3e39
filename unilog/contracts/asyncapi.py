"""The log as an AsyncAPI 3.0.0 document: :func:`build_document`, a pure function of its inputs (no I/O).

What is where:

* ``channels``: one per stream, ``address`` the stream's Redis key (its name; a partitioned stream's address is
  ``<stream>.p{partition}``, the parameter listing its partitions). Its ``messages`` are the versions of the record
  types on that stream, each a ``$ref`` to ``components/messages``.
* ``components/messages/<Name>_v<version>``: ``name`` the type's name, ``title`` "Name vN", ``payload`` the type's
  JSON Schema (what the entry's ``data`` field holds, as JSON text), ``headers`` the entry's other fields
  (``producer``, ``epoch``, ``seq``, ``created``, ``key``, ``type``, ``traceparent``...; the ``type``, ``object``
  and ``action`` fixed to the type's), and the extensions ``x-unilog-type``, ``x-unilog-object``,
  ``x-unilog-action``, ``x-unilog-version``, ``x-unilog-fingerprint``, ``x-unilog-retired`` and
  ``x-unilog-registered`` (False: read from a module, not from the registry).
* ``components/schemas``: the entry fields' schema (``unilog.EntryFields``) and the named sub-schemas of the types'
  JSON Schemas: pydantic's ``$defs`` are moved here and their ``$ref`` rewritten (a name two types use for different
  schemas is prefixed with the message's key), so every reference resolves within the document.
* ``operations``: per stream, ``<stream>.publish`` (``send``: unilog's streamer appends the records producers
  staged) and one ``receive`` per reader: ``<stream>.consumer.<name>`` for a checkpoint consumer,
  ``<stream>.group.<name>`` for a consumer group. Each lists the channel's messages.

The JSON Schemas are AsyncAPI Schema Objects (a superset of JSON Schema draft 07): pydantic's OpenAPI-style
``discriminator`` object becomes its property name, the form AsyncAPI's schema takes.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

ASYNCAPI_VERSION = "3.0.0"
CONTENT_TYPE = "application/json"
ENTRY_FIELDS = "unilog.EntryFields"
_KEY_CHARS = re.compile(r"[^A-Za-z0-9._-]")
_DIGITS = {"type": "string", "pattern": "^[0-9]+$"}


@dataclass(frozen=True)
class MessageType:
    """One version of a record type, as the document describes it. ``stream`` ``''`` is the default stream."""

    name: str
    version: int
    stream: str
    object: str
    action: str
    schema: Mapping[str, Any]
    fingerprint: str | None = None
    retired: bool = False
    registered: bool = True

    @property
    def key(self) -> str:
        """The message's key in the document (``RideCreated_v2``)."""
        return f"{_safe(self.name)}_v{self.version}"

    @property
    def type_tag(self) -> str:
        return f"{self.name}@{self.version}"


@dataclass(frozen=True)
class Reader:
    """Who reads a stream: a checkpoint consumer (``kind`` ``"consumer"``) or a consumer group (``"group"``)."""

    stream: str
    name: str
    kind: str = "consumer"


def build_document(
    types: Iterable[MessageType],
    *,
    title: str = "unilog",
    version: str = "1.0.0",
    description: str | None = None,
    default_stream: str = "unilog",
    streams: Iterable[str] = (),
    readers: Iterable[Reader] = (),
    partitions: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The AsyncAPI 3.0.0 document of the log: ``types`` on their streams (``''``: ``default_stream``), more
    ``streams`` without types, the ``readers`` of each, and each stream's partition count (``partitions``)."""
    by_stream: dict[str, list[MessageType]] = {}
    for t in sorted(types, key=lambda t: (t.name, t.version)):
        by_stream.setdefault(t.stream or default_stream, []).append(t)
    for stream in streams:
        by_stream.setdefault(stream or default_stream, [])
    for reader in readers:
        by_stream.setdefault(reader.stream or default_stream, [])
    components: dict[str, Any] = {"schemas": {ENTRY_FIELDS: entry_fields_schema()}, "messages": {}}
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    channel_keys = _Keys()
    for stream in sorted(by_stream):
        key = channel_keys.take(stream)
        messages = by_stream[stream]
        for t in messages:
            components["messages"][t.key] = message(t, components["schemas"])
        channels[key] = channel(stream, messages, (partitions or {}).get(stream, 1))
        stream_readers = [r for r in readers if (r.stream or default_stream) == stream]
        operations.update(stream_operations(stream, key, messages, stream_readers))
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": _info(title, version, description),
        "defaultContentType": CONTENT_TYPE,
        "channels": channels,
        "operations": operations,
        "components": components,
    }


def _info(title: str, version: str, description: str | None) -> dict[str, Any]:
    text = description or (
        "The records of a unilog log: producers stage them in Postgres in their own transactions, and unilog's "
        "streamer appends them to Redis Streams in commit order. Each entry's `data` field holds the record's "
        "payload as JSON text; its other fields are described as the messages' headers."
    )
    return {"title": title, "version": version, "description": text}


def channel(stream: str, messages: list[MessageType], partitions: int = 1) -> dict[str, Any]:
    """The channel of ``stream``: its address, description and messages (``$ref`` to the components)."""
    found: dict[str, Any] = {
        "address": stream,
        "title": stream,
        "description": f"The Redis stream `{stream}`.",
        "messages": {t.key: {"$ref": f"#/components/messages/{t.key}"} for t in messages},
    }
    if partitions > 1:
        found["address"] = f"{stream}.p{{partition}}"
        found["description"] = (
            f"The stream `{stream}`, partitioned by key into {partitions} Redis streams `{stream}.p0` to "
            f"`{stream}.p{partitions - 1}`."
        )
        found["parameters"] = {
            "partition": {
                "description": "The partition's number: the record's key hashed modulo the partition count.",
                "enum": [str(i) for i in range(partitions)],
            }
        }
    if not messages:
        found["description"] += " No record type is registered on it: its records are untyped."
    return found


def message(t: MessageType, schemas: dict[str, Any]) -> dict[str, Any]:
    """The message of one type version; its payload's named sub-schemas are added to ``schemas``."""
    found: dict[str, Any] = {
        "name": t.name,
        "title": f"{t.name} v{t.version}",
        "summary": f"{t.object} {t.action}" + (" (retired)" if t.retired else ""),
        "contentType": CONTENT_TYPE,
        "headers": _headers(t),
        "payload": payload_schema(t, schemas),
        "x-unilog-type": t.type_tag,
        "x-unilog-object": t.object,
        "x-unilog-action": t.action,
        "x-unilog-version": t.version,
        "x-unilog-retired": t.retired,
        "x-unilog-registered": t.registered,
    }
    if t.fingerprint:
        found["x-unilog-fingerprint"] = t.fingerprint
    return found


def _headers(t: MessageType) -> dict[str, Any]:
    return {
        "type": "object",
        "allOf": [{"$ref": f"#/components/schemas/{ENTRY_FIELDS}"}],
        "properties": {
            "type": {"type": "string", "const": t.type_tag},
            "object": {"type": "string", "const": t.object},
            "action": {"type": "string", "const": t.action},
        },
    }


def entry_fields_schema() -> dict[str, Any]:
    """The fields of a typed record's Redis entry but ``data`` (its payload), all text as Redis keeps them."""
    props: dict[str, Any] = {
        "type": {"type": "string", "description": "The record's type and version, `<name>@<version>`."},
        "object": {"type": "string", "description": "What the record happened to, as given to emit."},
        "action": {"type": "string", "description": "What happened, as given to emit."},
        "producer": {"type": "string", "description": "The producer id of the database that staged the record."},
        "epoch": {**_DIGITS, "description": "The producer's epoch: with seq, the record's position."},
        "seq": {**_DIGITS, "description": "The record's sequence number within the producer's epoch."},
        "created": {**_DIGITS, "description": "When the record was staged, in milliseconds since the Unix epoch."},
        "key": {"type": "string", "description": "The record's key (ordering and partitioning), if it has one."},
        "traceparent": {"type": "string", "description": "The W3C trace context of the staging transaction."},
        "tracestate": {"type": "string", "description": "The W3C trace state that goes with traceparent."},
        "replay_of": {"type": "string", "description": "A replayed dead letter: the entry it was first."},
        "replay_for": {"type": "string", "description": "A replayed dead letter: `consumer:<name>` or `group:<name>`."},
    }
    return {
        "type": "object",
        "description": "The fields of a record's Redis stream entry besides `data`, which holds the payload.",
        "required": ["type", "object", "action", "producer", "epoch", "seq", "created"],
        "properties": props,
    }


def stream_operations(
    stream: str, channel_key: str, messages: list[MessageType], readers: Iterable[Reader]
) -> dict[str, Any]:
    """The stream's operations: the streamer's ``send`` and each reader's ``receive``."""
    refs = [{"$ref": f"#/channels/{channel_key}/messages/{t.key}"} for t in messages]
    ref = {"$ref": f"#/channels/{channel_key}"}
    found: dict[str, Any] = {
        f"{channel_key}.publish": {
            "action": "send",
            "channel": ref,
            "title": f"Publish to {stream}",
            "summary": "unilog's streamer appends the records producers staged, in commit order.",
            "messages": refs,
        }
    }
    for reader in sorted(readers, key=lambda r: (r.kind, r.name)):
        kind = "consumer group" if reader.kind == "group" else "checkpoint consumer"
        found[f"{channel_key}.{reader.kind}.{_safe(reader.name)}"] = {
            "action": "receive",
            "channel": ref,
            "title": f"{reader.name} reads {stream}",
            "summary": f"The {kind} {reader.name!r} reads the stream.",
            "messages": refs,
            "x-unilog-reader": {"kind": reader.kind, "name": reader.name},
        }
    return found


def payload_schema(t: MessageType, schemas: dict[str, Any]) -> dict[str, Any]:
    """``t``'s JSON Schema with its ``$defs`` moved into ``schemas`` (components/schemas) and every ``$ref`` to
    them rewritten; a name already there for another schema is prefixed with the message's key."""
    root = copy.deepcopy(dict(t.schema))
    defs: dict[str, Any] = {**root.pop("definitions", {}), **root.pop("$defs", {})}
    names = {name: _safe(name) for name in defs}
    moved = {names[n]: _rewritten(d, names) for n, d in defs.items()}
    if any(k in schemas and schemas[k] != v for k, v in moved.items()):
        names = {name: f"{t.key}.{_safe(name)}" for name in defs}
        moved = {names[n]: _rewritten(d, names) for n, d in defs.items()}
    schemas.update(moved)
    return _rewritten(root, names)


def _rewritten(node: Any, names: Mapping[str, str]) -> Any:
    """A copy of ``node`` with refs to ``#/$defs/X`` (or ``#/definitions/X``) pointing at components/schemas, and
    pydantic's ``discriminator`` objects as AsyncAPI's property name."""
    if isinstance(node, list):
        return [_rewritten(item, names) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str):
            out[key] = _ref(value, names)
        elif key == "discriminator" and isinstance(value, dict):
            out[key] = value.get("propertyName", "")
        elif key in ("properties", "patternProperties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {name: _rewritten(sub, names) for name, sub in value.items()}  # names, not keywords
        else:
            out[key] = _rewritten(value, names)
    return out


def _ref(ref: str, names: Mapping[str, str]) -> str:
    for prefix in ("#/$defs/", "#/definitions/"):
        if ref.startswith(prefix):
            name, _, rest = ref[len(prefix) :].partition("/")
            if name in names:
                return f"#/components/schemas/{names[name]}" + (f"/{rest}" if rest else "")
    return ref


def _safe(name: str) -> str:
    """``name`` as a key of the document's maps (``[A-Za-z0-9._-]``: a stream's ``:`` becomes ``_``)."""
    return _KEY_CHARS.sub("_", name)


class _Keys:
    """Unique keys for names that may become the same once made safe (``a:b`` and ``a_b``)."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def take(self, name: str) -> str:
        key, n = _safe(name), 1
        while key in self.used:
            n += 1
            key = f"{_safe(name)}_{n}"
        self.used.add(key)
        return key
