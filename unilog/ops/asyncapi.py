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
    client = engine.connect(settings.redis_url)
    engine.ping(client, settings.redis_url)
    api = engine.RedisStreams(client)
    try:
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


def module_types(modules: Iterable[str], known: set[tuple[str, int]]) -> list[MessageType]:
    """The contracts declared in ``modules`` whose name and version are not in ``known`` (the registered ones)."""
    from ..contracts import contracts_in

    found = []
    for module in modules:
        for c in contracts_in(module):
            if (c.name, c.version) in known:
                continue
            known.add((c.name, c.version))
            schema = c.json_schema()
            found.append(
                MessageType(
                    c.name, c.version, c.stream or "", c.object, c.action, schema, c.fingerprint(), registered=False
                )
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
