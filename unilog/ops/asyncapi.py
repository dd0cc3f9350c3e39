"""``unilog asyncapi``: gather what the AsyncAPI document describes, then build it with the pure
:func:`unilog.contracts.asyncapi.build_document`.

* the record types: every version registered in ``unilog_schemas`` (:func:`unilog.store.schemas.registered`,
  retired ones marked), and the contracts of the ``modules`` given that are not registered yet;
* the streams: the default one, the types' streams, and those with staged records or a consumer's checkpoint (as
  ``unilog status`` finds them), each with its partition count;
* the readers of each stream: consumers with a checkpoint in Postgres, consumers registered for retention in Redis
  (``unilog consumer register``), and consumer groups (``XINFO GROUPS``); a partitioned stream's are read from its
  partitions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from .. import engine, store
from ..config import Settings
from ..contracts.asyncapi import MessageType, Reader, build_document


def document(
    settings: Settings, modules: Sequence[str] = (), *, title: str = "unilog", version: str = "1.0.0"
) -> dict[str, Any]:
    """The AsyncAPI 3.0.0 document of the log ``settings`` names, with the contracts of ``modules``."""
    conn = store.connect(settings.conninfo, autocommit=True, application_name="unilog-asyncapi")
    try:
        client = engine.connect(settings.redis_url)
    except BaseException:
        conn.close()
        raise
    try:
        engine.ping(client, settings.redis_url)
        api = engine.RedisStreams(client)
        store.check_schema(conn)
        types = registered_types(conn)
        types += module_types(modules, {(t.name, t.version) for t in types})
        streams, readers, partitions = bookkeeping(conn, api, settings.stream, {t.stream for t in types})
    finally:
        conn.close()
        client.close()
    return build_document(
        types,
        title=title,
        version=version,
        default_stream=settings.stream,
        streams=streams,
        readers=readers,
        partitions=partitions,
    )


def registered_types(conn: Any) -> list[MessageType]:
    """Every version in the registry, retired ones included (old entries of theirs may still be on the stream)."""
    from ..store import schemas

    return [
        MessageType(
            r.name,
            r.version,
            r.stream,
            r.object,
            r.action,
            r.schema,
            r.fingerprint,
            retired=r.retired_at is not None,
        )
        for r in schemas.registered(conn)
    ]


def module_types(modules: Iterable[str], known: set[tuple[str, int]], *, registered: bool = False) -> list[MessageType]:
    """The contracts declared in ``modules`` whose name and version are not in ``known`` (the registered ones),
    marked not ``registered`` (the docs site's, built from code alone, are not marked)."""
    if not modules:
        return []  # unilog.contracts imports pydantic: only when asked
    from ..contracts import contracts_in

    found = []
    for module in modules:
        for c in contracts_in(module):
            if (c.name, c.version) in known:
                continue
            known.add((c.name, c.version))
            schema, fingerprint = c.json_schema(), c.fingerprint()
            stream = c.stream or ""
            found.append(
                MessageType(c.name, c.version, stream, c.object, c.action, schema, fingerprint, registered=registered)
            )
    return found


def bookkeeping(
    conn: Any, api: engine.RedisStreams, default_stream: str, typed: set[str]
) -> tuple[list[str], list[Reader], dict[str, int]]:
    """(the streams, their readers, their partition counts): the default stream, the ``typed`` ones, those with
    staged records and those with a checkpoint, partitions folded into their streams."""
    checkpoints = store.list_checkpoints(conn)
    named = {default_stream, *typed, *store.staged_by_stream(conn), *(cp.stream for cp in checkpoints)}
    named = {n or default_stream for n in named}
    partitions = {n: api.partitions(n) for n in sorted(named)}
    streams = sorted(n for n in named if _parent(n, partitions) is None)
    readers = {Reader(_parent(cp.stream, partitions) or cp.stream, cp.name) for cp in checkpoints}
    for stream in streams:
        for key in _keys(stream, partitions[stream]):
            readers |= {Reader(stream, name) for name in api.registered(key)}
            readers |= {Reader(stream, str(g["name"]), "group") for g in api.groups(key)}
    return streams, sorted(readers, key=lambda r: (r.stream, r.kind, r.name)), partitions


def _keys(stream: str, count: int) -> list[str]:
    """The Redis streams of ``stream``: itself, or its partitions."""
    return [f"{stream}.p{i}" for i in range(count)] if count > 1 else [stream]


def _parent(name: str, partitions: dict[str, int]) -> str | None:
    """The partitioned stream ``name`` is a partition of, if it is one of those in ``partitions``."""
    match = re.fullmatch(r"(.+)\.p([0-9]+)", name)
    if match and partitions.get(match[1], 1) > int(match[2]):
        return match[1]
    return None


def markdown(doc: dict[str, Any], raw_link: str | None = None) -> str:
    """``doc`` (an AsyncAPI document :func:`document` built) as a Markdown page: its channels, its messages with
    their payloads' fields, its operations and the named schemas; ``raw_link``: where the JSON is, linked."""
    info = doc["info"]
    lines = [f"# {info['title']} {info['version']}", "", info.get("description", ""), ""]
    if raw_link:
        lines += [f"The document itself, AsyncAPI {doc['asyncapi']}: [{raw_link.rsplit('/', 1)[-1]}]({raw_link}).", ""]
    lines += ["## Channels", "", "| channel | address | messages | description |", "|---|---|---|---|"]
    for key, channel in doc["channels"].items():
        names = ", ".join(_message_title(doc, m["$ref"]) for m in channel["messages"].values()) or "-"
        lines.append(f"| `{key}` | `{channel['address']}` | {_cell(names)} | {_cell(channel['description'])} |")
    lines += ["", "## Operations", "", "| operation | action | channel | summary |", "|---|---|---|---|"]
    for key, op in doc["operations"].items():
        channel = op["channel"]["$ref"].rsplit("/", 1)[-1]
        lines.append(f"| `{key}` | {op['action']} | `{channel}` | {_cell(op.get('summary', ''))} |")
    lines += ["", "## Messages", ""]
    for message in doc["components"]["messages"].values():
        lines += _message_section(message)
    lines += ["## Schemas", "", "The named schemas the messages' payloads and headers refer to.", ""]
    for name, schema in doc["components"]["schemas"].items():
        lines += [f"### `{name}`", "", *_fields(schema), ""]
    return "\n".join(lines)


def _message_title(doc: dict[str, Any], ref: str) -> str:
    return str(doc["components"]["messages"][ref.rsplit("/", 1)[-1]]["title"])


def _message_section(message: dict[str, Any]) -> list[str]:
    facts = [f"type `{message['x-unilog-type']}`", f"object `{message['x-unilog-object']}`"]
    facts.append(f"action `{message['x-unilog-action']}`")
    if message.get("x-unilog-fingerprint"):
        facts.append(f"fingerprint `{message['x-unilog-fingerprint'][:19]}`")
    if message.get("x-unilog-retired"):
        facts.append("**retired**")
    if not message.get("x-unilog-registered", True):
        facts.append("not registered yet")
    about = message["payload"].get("description")
    head = [f"### {message['title']}", "", *([_cell(about), ""] if about else []), ", ".join(facts) + ".", ""]
    return [*head, *_fields(message["payload"]), ""]


def _fields(schema: dict[str, Any]) -> list[str]:
    """A table of an object schema's properties: name, type, whether required, description."""
    props = schema.get("properties", {})
    if not props:
        return [f"A value of type {_cell(type_text(schema))}."]
    required = set(schema.get("required", []))
    rows = ["| field | type | required | description |", "|---|---|---|---|"]
    for name, prop in props.items():
        text = prop.get("description") or ""  # not pydantic's title: the field's name again
        rows.append(f"| `{name}` | {_cell(type_text(prop))} | {'yes' if name in required else 'no'} | {_cell(text)} |")
    return rows


def type_text(node: Any) -> str:
    """A JSON Schema node's type in a few words: ``string (uuid)``, ``array of Place``, ``number or string``."""
    if not isinstance(node, dict):
        return "any"
    if "$ref" in node:
        return str(node["$ref"]).rsplit("/", 1)[-1]
    if "const" in node:
        return json.dumps(node["const"])
    if "enum" in node:
        return "one of " + ", ".join(json.dumps(v) for v in node["enum"])
    for combined, word in (("anyOf", " or "), ("oneOf", " or "), ("allOf", " and ")):
        if combined in node:
            return word.join(dict.fromkeys(type_text(n) for n in node[combined]))
    kind = node.get("type", "any")
    if isinstance(kind, list):
        return " or ".join(str(k) for k in kind)
    if kind == "array":
        return f"array of {type_text(node.get('items'))}"
    return f"{kind} ({node['format']})" if "format" in node else str(kind)


def _cell(text: str) -> str:
    """Text for a Markdown table's cell: one line, its pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")
