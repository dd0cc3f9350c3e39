"""Schema compatibility, as Confluent's schema registry defines it, on pydantic's JSON Schemas.

A mode names who must read whom:

* ``backward``: a reader with the **new** schema reads data written with the **old** one (consumers upgrade first);
* ``forward``: a reader with the **old** schema reads data written with the **new** one (producers upgrade first);
* ``full``: both; ``none``: nothing is checked;
* ``*_transitive``: against every registered older version; without it, against the latest older one only.

Every check is one question, asked per direction: does the *reader* schema accept every value the *writer* schema
allows? So each rule breaks in exactly one direction, the one where the reader is the stricter side. For a change
from the old version to the new one:

=========================================================  ================  ===============
change from old to new                                     backward          forward
                                                           (new reads old)   (old reads new)
=========================================================  ================  ===============
field added, required (no default)                         **breaks**        ok
field added with a default                                 ok                ok
field removed that was required in old                     ok                **breaks**
field removed that had a default in old                    ok                ok
field written but unknown to a reader that forbids extras  **breaks** (a field old had, new forbids)  **breaks**
type widened: integer -> number                            ok                **breaks**
type narrowed: number -> integer; any type change          **breaks**        **breaks** (unless widening)
    between string, integer, boolean, object, array
made nullable (X -> X | None)                              ok                **breaks**
made non-nullable (X | None -> X)                          **breaks**        ok
enum value (or Literal) added                              ok                **breaks**
enum value (or Literal) removed                            **breaks**        ok
constraint tightened (maxLength, minimum, pattern, format) **breaks**        ok
constraint loosened                                        ok                **breaks**
a concrete type becomes Any                                ok                **breaks**
=========================================================  ================  ===============

Nested models (``$ref`` into ``$defs``, resolved on each side), array items (``items[]``), dict values (``name{}``)
and each member of a union (``anyOf``; ``null`` in it makes a value nullable) follow the same rules, recursively;
a writer's union member must be accepted by some reader member. A field with a default is always written by unilog
(encoding writes every field), so only a field's presence in the writer's ``properties`` counts as "written".

Upcasters: when the new version has an upcaster from an old version, data of that version is not read as it is but
through the upcasters, so ``backward`` against it holds by the upcasters (and is reported as read through them, not
checked); if the first upcaster on its way starts at a later version ``k``, the old data must read as version ``k``,
which is checked instead. ``forward`` is never helped by upcasters (an old reader has none for the new version).

Each breaking change is one line: ``RideCreated v3 vs v2 (backward): field 'fare' is required in v3 and absent in
v2, with no default``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError

if TYPE_CHECKING:
    from .declare import Contract

MODES = ("none", "backward", "backward_transitive", "forward", "forward_transitive", "full", "full_transitive")
DEFAULT_MODE = "backward"

_LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
_UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
_SHAPES = ("type", "enum", "const", "properties", "items", "prefixItems", "additionalProperties", "anyOf", "oneOf")


def validate_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`MODES`, else :class:`~unilog.errors.ConfigurationError` listing them."""
    if mode not in MODES:
        raise ConfigurationError(f"unknown compatibility mode {mode!r}: use one of {', '.join(MODES)}")
    return mode


def check(
    new: Mapping[str, Any],
    old: Mapping[str, Any],
    mode: str = DEFAULT_MODE,
    *,
    name: str = "record",
    new_version: int | None = None,
    old_version: int | None = None,
) -> list[str]:
    """The breaking changes between two JSON Schemas of one type under ``mode`` (a ``*_transitive`` mode compares
    these two as its plain form does), one line each; empty if compatible. ``name`` and the versions label them."""
    mode = validate_mode(mode)
    lines: list[str] = []
    for direction in _directions(mode):
        lines += _lines(direction, _tag(mode, direction), name, (new, new_version), (old, old_version))
    return lines


def check_versions(
    name: str,
    new_version: int,
    new_schema: Mapping[str, Any],
    registered: Mapping[int, Mapping[str, Any]],
    mode: str = DEFAULT_MODE,
    upcast_from: Collection[int] = (),
) -> list[str]:
    """The breaking changes of ``new_schema`` (version ``new_version``) against the ``registered`` schemas (version
    -> schema; retired ones left out by the caller) under ``mode``: every older version for a ``*_transitive``
    mode, else the latest older one. ``upcast_from``: the versions the new one has an upcaster from."""
    mode = validate_mode(mode)
    older = sorted(v for v in registered if v < new_version)
    if mode == "none" or not older:
        return []
    lines: list[str] = []
    for version in older if mode.endswith("_transitive") else older[-1:]:
        old = (registered[version], version)
        for direction in _directions(mode):
            reader: tuple[Mapping[str, Any], int] = (new_schema, new_version)
            via = upcast_start(upcast_from, version, new_version) if direction == "backward" else None
            if via is not None and (via == version or via not in registered):
                continue  # read through the upcasters
            if via is not None:  # the data reaches the upcaster from ``via`` unchanged: it must read as ``via``
                reader = (registered[via], via)
            lines += _lines(direction, _tag(mode, direction), name, reader, old)
    return lines


def check_contract(
    contract: Contract, registered: Mapping[int, Mapping[str, Any]], mode: str = DEFAULT_MODE
) -> list[str]:
    """:func:`check_versions` for a declared contract, its upcasters included."""
    return check_versions(contract.name, contract.version, contract.json_schema(), registered, mode, contract.upcasters)


def upcast_start(upcast_from: Collection[int], old_version: int, new_version: int) -> int | None:
    """The first version from ``old_version`` on whose data an upcaster takes (data of ``old_version`` reaches it
    unchanged), or None if none runs: then ``old_version`` is read as it is. Equal to ``old_version``: it is read
    through upcasters (what ``unilog schema check`` reports as "read through upcaster")."""
    return min((v for v in upcast_from if old_version <= v < new_version), default=None)


Versioned = tuple[Mapping[str, Any], "int | None"]


def _lines(direction: str, tag: str, name: str, new: Versioned, old: Versioned) -> list[str]:
    """One direction's lines: ``backward``, the new schema reads the old one's data; ``forward``, the reverse."""
    new_label = f"v{new[1]}" if new[1] is not None else "the new schema"
    old_label = f"v{old[1]}" if old[1] is not None else "the old schema"
    if direction == "backward":
        problems = _Compare(new[0], old[0], new_label, old_label).problems()
    else:
        problems = _Compare(old[0], new[0], old_label, new_label).problems()
    return [f"{name} {new_label} vs {old_label} ({tag}): {problem}" for problem in problems]


def _tag(mode: str, direction: str) -> str:
    return mode if mode.startswith(direction) else f"{mode}: {direction}"


def _directions(mode: str) -> tuple[str, ...]:
    if mode.startswith("backward"):
        return ("backward",)
    if mode.startswith("forward"):
        return ("forward",)
    if mode.startswith("full"):
        return ("backward", "forward")
    return ()


class _Compare:
    """Does ``reader`` accept everything ``writer`` allows? Each schema's ``$ref`` resolves in its own ``$defs``."""

    def __init__(self, reader: Mapping[str, Any], writer: Mapping[str, Any], reader_label: str, writer_label: str):
        self.reader, self.writer = reader, writer
        self.r, self.w = reader_label, writer_label
        self.seen: set[tuple[str, str, str]] = set()

    def problems(self) -> list[str]:
        return self.value(self.reader, self.writer, "")

    def value(self, reader: Mapping[str, Any], writer: Mapping[str, Any], path: str) -> list[str]:
        key = (path, str(reader.get("$ref")), str(writer.get("$ref")))
        if "$ref" in reader and "$ref" in writer:
            if key in self.seen:  # a recursive model: this pair is being compared further up
                return []
            self.seen.add(key)
        r_branches, r_null = _branches(_resolved(reader, self.reader))
        w_branches, w_null = _branches(_resolved(writer, self.writer))
        out = []
        if w_null and not r_null:
            out.append(f"{_field(path)}{self.w} writes null, which {self.r} does not accept")
        for w in w_branches:
            w = _resolved(w, self.writer)
            candidates = [_resolved(r, self.reader) for r in r_branches]
            reports = [self.branch(r, w, path) for r in candidates]
            if reports and not all(reports):
                continue
            same = [rep for r, rep in zip(candidates, reports, strict=True) if _kind(r) == _kind(w)]
            out += same[0] if same else [self.changed(w, r_branches, path)]
        return out

    def changed(self, writer: Mapping[str, Any], readers: list[Any], path: str) -> str:
        read = " or ".join(_describe(_resolved(r, self.reader)) for r in readers) or "nothing"
        return f"{_field(path)}{self.w} writes {_describe(writer)}, {self.r} reads only {read}"

    def branch(self, r: Mapping[str, Any], w: Mapping[str, Any], path: str) -> list[str]:
        rk, wk = _kind(r), _kind(w)
        if rk == "any":
            return []
        if wk == "any":
            return [f"{_field(path)}{self.w} writes any value, {self.r} reads only {_describe(r)}"]
        if "values" in (rk, wk):
            return self.values(r, w, path)
        if not (rk == wk or (wk == "integer" and rk == "number")):
            return [self.changed(w, [r], path)]
        out = self.bounds(r, w, path)
        if rk == "object":
            out += self.object(r, w, path)
        elif rk == "array":
            out += self.array(r, w, path)
        return out

    def values(self, r: Mapping[str, Any], w: Mapping[str, Any], path: str) -> list[str]:
        """Enums and constants (``Literal``): every value the writer may write must be one the reader accepts."""
        if _kind(w) != "values":
            return [f"{_field(path)}{self.w} writes any {_describe(w)}, {self.r} reads only {_describe(r)}"]
        written = _enum(w)
        if _kind(r) == "values":
            missing = [v for v in written if v not in _enum(r)]
        else:
            missing = [v for v in written if _json_type(v) not in _accepted_types(r)]
        if not missing:
            return []
        shown = ", ".join(repr(v) for v in missing)
        return [f"{_field(path)}{self.w} writes {shown}, which {self.r} does not accept ({_describe(r)})"]

    def bounds(self, r: Mapping[str, Any], w: Mapping[str, Any], path: str) -> list[str]:
        out = []
        for key in _LOWER_BOUNDS + _UPPER_BOUNDS:
            if key in r and (key not in w or (w[key] < r[key] if key in _LOWER_BOUNDS else w[key] > r[key])):
                out.append(
                    f"{_field(path)}{self.r} requires {key} {r[key]}, {self.w} writes {key} {w.get(key, 'unbounded')}"
                )
        for key in ("pattern", "format"):
            if key in r and r[key] != w.get(key):
                out.append(f"{_field(path)}{self.r} requires {key} {r[key]!r}, {self.w} writes {w.get(key, 'any')!r}")
        return out

    def object(self, r: Mapping[str, Any], w: Mapping[str, Any], path: str) -> list[str]:
        r_props, w_props = r.get("properties", {}), w.get("properties", {})
        w_required = set(w.get("required", ()))
        out = []
        for name in r.get("required", ()):
            inner = _joined(path, name)
            if name not in w_props:
                out.append(f"field {inner!r} is required in {self.r} and absent in {self.w}, with no default")
            elif name not in w_required and "default" not in w_props[name]:
                out.append(f"field {inner!r} is required in {self.r} and may be absent in {self.w}")
        for name in w_props:
            inner = _joined(path, name)
            if name in r_props:
                out += self.value(r_props[name], w_props[name], inner)
            elif r.get("additionalProperties") is False:
                out.append(f"field {inner!r} is written in {self.w} and {self.r} forbids fields it does not declare")
            elif isinstance(r.get("additionalProperties"), dict):
                out += self.value(r["additionalProperties"], w_props[name], inner)
        r_extra, w_extra = r.get("additionalProperties"), w.get("additionalProperties")
        if isinstance(w_extra, dict) and isinstance(r_extra, dict):
            out += self.value(r_extra, w_extra, f"{path}{{}}")
        elif isinstance(w_extra, dict) and r_extra is False:
            out.append(f"{_field(path)}{self.w} writes any key, {self.r} forbids keys it does not declare")
        return out

    def array(self, r: Mapping[str, Any], w: Mapping[str, Any], path: str) -> list[str]:
        out = []
        r_prefix, w_prefix = r.get("prefixItems", []), w.get("prefixItems", [])
        for i, (ri, wi) in enumerate(zip(r_prefix, w_prefix, strict=False)):
            out += self.value(ri, wi, f"{path}[{i}]")
        if len(w_prefix) > len(r_prefix) and r.get("items") is False:
            out.append(f"{_field(path)}{self.w} writes {len(w_prefix)} items, {self.r} reads {len(r_prefix)} at most")
        r_items, w_items = r.get("items", {}), w.get("items", {})
        if isinstance(r_items, dict) and isinstance(w_items, dict):
            out += self.value(r_items, w_items, f"{path}[]")
        return out


def _resolved(node: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    """``node`` with its ``$ref`` (into ``root``'s ``$defs``) and a single-member ``allOf`` replaced by their target,
    the node's own keywords (a field's default, description) kept over the target's."""
    for _ in range(64):  # a chain of references, never a loop in pydantic's output
        if "$ref" in node:
            target = _lookup(root, node["$ref"])
            node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        elif isinstance(node.get("allOf"), list) and len(node["allOf"]) == 1:
            node = {**node["allOf"][0], **{k: v for k, v in node.items() if k != "allOf"}}
        else:
            return node
    return node


def _lookup(root: Mapping[str, Any], ref: str) -> Mapping[str, Any]:
    if not ref.startswith("#"):
        raise ConfigurationError(f"the schema refers to {ref!r}, outside itself: only local $ref are supported")
    node: Any = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        node = node.get(part.replace("~1", "/").replace("~0", "~"), {}) if isinstance(node, Mapping) else {}
    return node if isinstance(node, Mapping) else {}


def _branches(node: Mapping[str, Any]) -> tuple[list[Mapping[str, Any]], bool]:
    """The members of a union (``anyOf``/``oneOf``, a list of types, an enum holding null), and whether null is one."""
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            members: list[Mapping[str, Any]] = []
            nullable = False
            for member in node[key]:
                inner, null = _branches(member)
                members += inner
                nullable = nullable or null
            return members, nullable
    types = node.get("type")
    if isinstance(types, list):
        rest = {k: v for k, v in node.items() if k != "type"}
        return [{**rest, "type": t} for t in types if t != "null"], "null" in types
    if types == "null" or ("const" in node and node["const"] is None):
        return [], True
    if isinstance(node.get("enum"), list) and None in node["enum"]:
        values = [v for v in node["enum"] if v is not None]
        return ([{**node, "enum": values}] if values else []), True
    return [node], False


def _kind(node: Mapping[str, Any]) -> str:
    if "enum" in node or "const" in node:
        return "values"
    kind = node.get("type")
    if isinstance(kind, str):
        return kind
    if "properties" in node or "additionalProperties" in node:
        return "object"
    if "items" in node or "prefixItems" in node:
        return "array"
    return "any" if not any(key in node for key in _SHAPES) else "unknown"


def _enum(node: Mapping[str, Any]) -> list[Any]:
    return list(node["enum"]) if "enum" in node else [node.get("const")]


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}.get(type(value), "null")


def _accepted_types(node: Mapping[str, Any]) -> set[str]:
    kind = _kind(node)
    return {"integer", "number"} if kind == "number" else {kind}


def _describe(node: Mapping[str, Any]) -> str:
    kind = _kind(node)
    if kind == "values":
        return "one of " + ", ".join(repr(v) for v in _enum(node))
    if kind == "object" and "title" in node:
        return f"object {node['title']}"
    if kind == "array":
        return "array"
    return {"any": "any value", "unknown": "a value of an unsupported schema"}.get(kind, kind)


def _joined(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _field(path: str) -> str:
    return f"field {path!r}: " if path else "the record: "
