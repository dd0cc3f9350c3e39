"""The schema registry's verdicts: each record type a module declares against the versions registered under its
name, under its stream's compatibility mode; and :func:`register_types`, which registers a module's new versions
from an application's own migration (what ``unilog schema register`` does, without the command).

A ``*_transitive`` mode compares with every registered version below the new one that is not retired, the others
with the newest such version only, the versions new in the same run included. A backward check against a version
the type has an upcaster chain from is satisfied by the chain (``v1 read through upcaster``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from .. import store
from ..errors import ConfigurationError, SchemaIncompatible
from ..store.schemas import changed_line


@dataclass
class Verdict:
    """What the registry says of one record type of a module: its breaking changes (none: compatible), the summary
    line when it has none, and its row if it is not registered yet."""

    tag: str
    stream: str
    breaks: list[str] = field(default_factory=list)
    summary: str = ""
    new_row: store.SchemaRow | None = None


def contracts_of(modules: Sequence[str]) -> list[Any]:
    """The record types ``modules`` declare (each once), or ConfigurationError if they declare none."""
    from ..contracts import contracts_in

    found: dict[str, Any] = {}
    for module in modules:
        for contract in contracts_in(module):
            found.setdefault(contract.type_tag, contract)
    if not found:
        named = ", ".join(repr(m) for m in modules)
        raise ConfigurationError(f"{named} declares no record types (no class decorated with @record_type)")
    return sorted(found.values(), key=lambda c: (c.name, c.version))


def row_of(contract: Any) -> store.SchemaRow:
    """The registry row of ``contract`` (stream ``''``: the default stream)."""
    return store.SchemaRow(
        name=contract.name,
        version=contract.version,
        stream=contract.stream or "",
        object=contract.object or "",
        action=contract.action or "",
        schema=contract.json_schema(),
        fingerprint=contract.fingerprint(),
    )


def judge(contract: Any, versions: list[store.SchemaRow], mode: str, stream: str) -> Verdict:
    """The verdict on ``contract`` against the registered ``versions`` of its name, under ``mode``."""
    row = row_of(contract)
    verdict = Verdict(contract.type_tag, stream)
    same = next((v for v in versions if v.version == row.version), None)
    if same is not None:
        if same.fingerprint != row.fingerprint:
            verdict.breaks.append(changed_line(row, same))
        else:
            verdict.summary = f"{row.name} v{row.version}: registered, unchanged"
        return verdict
    verdict.new_row = row
    below = [v for v in versions if v.version < row.version]
    older = [v for v in below if v.retired_at is None]
    older = older if mode.endswith("_transitive") else older[-1:]
    if mode == "none" or not older:
        retired = ", ".join(f"v{v.version}" for v in below)
        why = "mode none" if mode == "none" else (f"{retired} retired" if below else "no earlier version registered")
        verdict.summary = f"{row.name} v{row.version}: new, nothing to compare with ({why})"
        return verdict
    in_use = {v.version: v.schema for v in versions if v.retired_at is None}
    notes = []
    for old in older:
        lines, note = _compare(contract, row, old, mode, in_use)
        verdict.breaks.extend(lines)
        notes.extend([note] if note else [])
    against = ", ".join(f"v{v.version}" for v in older)
    verdict.summary = f"{row.name} v{row.version}: compatible with {against} ({mode})" + "".join(
        f", {note}" for note in notes
    )
    return verdict


def _compare(
    contract: Any, row: store.SchemaRow, old: store.SchemaRow, mode: str, in_use: dict[int, dict[str, Any]]
) -> tuple[list[str], str]:
    """The breaking changes of ``row`` against ``old`` under ``mode``, and a note if upcasters read ``old``'s data.

    Backward against a version the new one has upcasters from is the upcasters' business: data of ``old`` reaches
    the first upcaster at or above it (from version ``k``) unchanged, so it is read through them if ``k`` is
    ``old`` itself (or not registered), else it must read as version ``k``, which is checked instead."""
    from ..contracts import compat

    def check(new: dict[str, Any], how: str, new_version: int = row.version) -> list[str]:
        return compat.check(new, old.schema, how, name=row.name, new_version=new_version, old_version=old.version)

    via = compat.upcast_start(getattr(contract, "upcasters", None) or {}, old.version, row.version)
    if via is None or mode.removesuffix("_transitive") not in ("backward", "full"):
        return check(row.schema, mode), ""
    lines = check(row.schema, "forward") if mode.startswith("full") else []
    if via == old.version or via not in in_use:
        return lines, f"v{old.version} read through upcaster"
    return lines + check(in_use[via], "backward", via), f"v{old.version} read as v{via}, then through upcasters"


def verdicts(conn: psycopg.Connection[Any], contracts: list[Any], default_stream: str) -> list[Verdict]:
    """The verdict on each of ``contracts`` against the registry, under its stream's mode."""
    found: list[Verdict] = []
    for contract in contracts:  # by name and version: a version is judged with the ones new in this run below it
        stream = contract.stream or default_stream
        mode = store.stream_mode(conn, stream)
        found.append(
            judge(contract, _with_new(contract.name, store.registered(conn, contract.name), found), mode, stream)
        )
    return found


def _with_new(name: str, versions: list[store.SchemaRow], found: list[Verdict]) -> list[store.SchemaRow]:
    """``versions`` of type ``name`` and the versions of it this run registers (judged before): v3 is compared with
    the v2 registered beside it, not only with what the database held."""
    new = [v.new_row for v in found if v.new_row is not None and v.new_row.name == name]
    return sorted([*versions, *new], key=lambda row: row.version)


def verdicts_offline(snapshot: dict[str, Any], contracts: list[Any], default_stream: str) -> list[Verdict]:
    """:func:`verdicts` against a registry exported with ``unilog schema export`` (no database: a CI job)."""
    rows = [_from_dict(item) for item in snapshot["schemas"]]
    modes: dict[str, str] = snapshot.get("modes", {})
    found: list[Verdict] = []
    for contract in contracts:
        stream = contract.stream or default_stream
        versions = [row for row in rows if row.name == contract.name]
        found.append(
            judge(
                contract,
                _with_new(contract.name, versions, found),
                modes.get(stream, store.DEFAULT_SCHEMA_MODE),
                stream,
            )
        )
    return found


def load_snapshot(path: str) -> dict[str, Any]:
    """A file ``unilog schema export`` wrote, or one ConfigurationError line saying what is wrong with it."""
    try:
        with open(path, encoding="utf-8") as file:
            snapshot = json.load(file)
        if not isinstance(snapshot, dict) or not isinstance(snapshot.get("schemas"), list):
            raise ValueError("it has no list of schemas")
        for item in snapshot["schemas"]:
            _from_dict(item)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigurationError(
            f"--against {path}: not a registry exported by `unilog schema export` ({exc})"
        ) from None
    return snapshot


def _from_dict(item: dict[str, Any]) -> store.SchemaRow:
    return store.SchemaRow(
        str(item["name"]), int(item["version"]), str(item["stream"]), str(item["object"]), str(item["action"]),
        dict(item["schema"]), str(item["fingerprint"]), retired_at=item.get("retired_at") or None,
    )  # fmt: skip


def register_types(conn: psycopg.Connection[Any], modules: Sequence[str], default_stream: str) -> list[str]:
    """Register the new versions of the record types ``modules`` declare, in ``conn``'s transaction (the caller
    commits: an Alembic or Django migration's own), and return their tags (none when all are registered already).
    A breaking change, or a changed schema under a registered version, raises
    :class:`~unilog.errors.SchemaIncompatible` naming each one, and nothing is registered. ``default_stream``: the
    stream of types declared without one (its compatibility mode applies to them)."""
    store.lock_registry(conn)
    found = verdicts(conn, contracts_of(modules), default_stream)
    breaks = [line for verdict in found for line in verdict.breaks]
    if breaks:
        raise SchemaIncompatible("; ".join(breaks))
    new = [verdict.new_row for verdict in found if verdict.new_row is not None]
    for row in new:
        store.register(conn, row)
    return [row.type_tag for row in new]
