"""Generate the threaded face of each asyncio source from it: ``python tools/faces.py`` (``--check``: exit 1, naming
them, if a generated file is stale, missing, or left behind by a source that is gone).

unilog writes code that both faces run once, as asyncio, in the ``_async/`` directories of :data:`PAIRS`: the
worker loop and its connections (``unilog/runtime/_async/``), the consumers' exactly-once sequences and the
partition worker (``unilog/consume/_async/``), the Redis adapter's methods both faces have and its connecting
(``unilog/engine/_async/``), ``emit`` (``unilog/produce/_async/``) and the store's statements both faces run
(``unilog/store/_async/``). Each source is transformed **on its syntax tree** (libcst, which keeps comments and
layout) into its ``_sync/`` twin, then formatted with ruff:

* ``async def``, ``async with``, ``async for`` lose ``async``; ``await x`` becomes ``x`` (with the parentheses
  that only held the ``await`` dropped: ``(await f()).g()`` becomes ``f().g()``);
* a **name** (a :class:`libcst.Name` node: an identifier, an attribute's name, an imported name) is renamed only if
  it is a key of :data:`RENAMES`, whole: ``AsyncConsumer`` becomes ``Consumer`` but ``AsyncConsumers`` or
  ``gaiotto`` stay as they are, and strings other than docstrings are never touched;
* an **imported module** is mapped by :data:`MODULES` (``unilog.store.aio`` -> ``unilog.store``) and by its path
  (a ``_async`` component becomes ``_sync``);
* **docstrings** get the same renames, as whole words, so each face's documentation names its own classes.

What truly differs between the faces is in small pairs in :mod:`unilog._acompat` (``asleep``/``sleep``,
``AEvent``/``Event``, ...) that the renames swap; a source that imports ``asyncio`` itself is refused, so nothing
asyncio-only can slip into the threaded face. ``tests/test_faces.py`` fails while a generated file does not match
its source.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import libcst as cst

ROOT = Path(__file__).resolve().parent.parent
# (asyncio source directory, generated threaded directory)
PAIRS: list[tuple[Path, Path]] = [
    (ROOT / "unilog" / "runtime" / "_async", ROOT / "unilog" / "runtime" / "_sync"),
    (ROOT / "unilog" / "consume" / "_async", ROOT / "unilog" / "consume" / "_sync"),
    (ROOT / "unilog" / "engine" / "_async", ROOT / "unilog" / "engine" / "_sync"),
    (ROOT / "unilog" / "produce" / "_async", ROOT / "unilog" / "produce" / "_sync"),
    (ROOT / "unilog" / "store" / "_async", ROOT / "unilog" / "store" / "_sync"),
]
RUFF = Path(sys.executable).parent / "ruff"
HEADER = "# Generated from "

# asyncio name -> threaded name: whole names only (see the module's docstring)
RENAMES = {
    # unilog's own classes: each asyncio class named here has a threaded twin of the same shape
    "AsyncConsumer": "Consumer",
    "AsyncMultiConsumer": "MultiConsumer",
    "AsyncGroupConsumer": "GroupConsumer",
    "AsyncPartitionedConsumer": "PartitionedConsumer",
    "AsyncWorker": "Worker",
    "AsyncLinks": "Links",
    "AsyncRedisStreams": "RedisStreams",
    "AsyncHandler": "Handler",
    "AsyncAdapter": "Adapter",
    "AsyncReadingCore": "ReadingCore",
    "AsyncGroupsCore": "GroupsCore",
    "AsyncLettersCore": "LettersCore",
    "AsyncRetentionCore": "RetentionCore",
    "AsyncPartitionsCore": "PartitionsCore",
    "AsyncClient": "Client",
    "async_node_connection": "node_connection",  # unilog.engine._async.nodes: a key's node's connection
    "anode_pool": "node_pool",  # unilog.engine.nodes: the pool (or a cluster node's connections) of each face
    "connect_async": "connect",  # unilog.store.aio / unilog.engine.aio -> unilog.store / unilog.engine
    "ping_async": "ping",
    "emit_async": "emit",  # unilog.produce: emit_async(tx, ...) -> emit(tx, ...)
    "emit_many_async": "emit_many",
    "AsyncSession": "Session",  # SQLAlchemy's (unilog.produce.handles pairs them)
    "adriver_of": "driver_of",
    # unilog._acompat's pairs
    "AEvent": "Event",
    "asleep": "sleep",
    "asleep_until": "sleep_until",
    # the libraries' own pairs
    "AsyncConnection": "Connection",  # psycopg
    "AsyncIterator": "Iterator",
    "AsyncGenerator": "Generator",
    "asynccontextmanager": "contextmanager",
    "aclose": "close",  # redis-py's asyncio client closes with aclose(), the threaded one with close()
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
    "StopAsyncIteration": "StopIteration",
}
# asyncio module -> threaded module (absolute); beyond these, a `_async` path component becomes `_sync`
MODULES = {
    "unilog.store.aio": "unilog.store",
    "unilog.engine.aio": "unilog.engine",
    # redis-py's asyncio client and its parts -> the threaded ones
    "redis.asyncio": "redis",
    "redis.asyncio.cluster": "redis.cluster",
    "redis.asyncio.retry": "redis.retry",
}
FORBIDDEN_IMPORTS = {"asyncio"}  # what differs goes through unilog._acompat's pairs
WORD = re.compile(r"\b(" + "|".join(sorted(map(re.escape, RENAMES), key=len, reverse=True)) + r")\b")


class Unasync(cst.CSTTransformer):
    """The asyncio -> threaded transformation of one module (see the module's docstring)."""

    def __init__(self, package: str) -> None:
        self.package = package  # the source's package: relative imports are resolved against it
        self.errors: list[str] = []

    # -- async and await ---------------------------------------------------------------------------------------------

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        return updated.with_changes(asynchronous=None, body=_redoc(updated.body))

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        return updated.with_changes(body=_redoc(updated.body))

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        return updated.with_changes(body=_redoc_statements(updated.body))

    def leave_With(self, original: cst.With, updated: cst.With) -> cst.With:
        return updated.with_changes(asynchronous=None)

    def leave_For(self, original: cst.For, updated: cst.For) -> cst.For:
        return updated.with_changes(asynchronous=None)

    def leave_CompFor(self, original: cst.CompFor, updated: cst.CompFor) -> cst.CompFor:
        return updated.with_changes(asynchronous=None)

    def leave_Await(self, original: cst.Await, updated: cst.Await) -> cst.BaseExpression:
        inner = updated.expression
        if updated.lpar and not getattr(inner, "lpar", None):
            if isinstance(inner, cst.Name | cst.Attribute | cst.Call | cst.Subscript):
                return inner  # the parentheses only held the await
            return inner.with_changes(lpar=updated.lpar, rpar=updated.rpar)
        return inner

    # -- names -------------------------------------------------------------------------------------------------------

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        return updated.with_changes(value=RENAMES.get(updated.value, updated.value))

    # -- imports -----------------------------------------------------------------------------------------------------

    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            name = cst.Module([]).code_for_node(alias.name)
            if name.split(".")[0] in FORBIDDEN_IMPORTS:
                self.errors.append(f"`import {name}`: use unilog._acompat's pairs")
        return False  # `import x` names no module of ours to map

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False  # leave_ImportFrom rewrites it whole; its names are not renamed twice

    def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom) -> cst.ImportFrom:
        module = _dotted(updated.module) if updated.module is not None else ""
        dots = len(updated.relative)
        absolute = _resolve(self.package, dots, module)
        if absolute.split(".")[0] in FORBIDDEN_IMPORTS:
            self.errors.append(f"`from {absolute} import ...`: use unilog._acompat's pairs")
        if isinstance(updated.names, cst.ImportStar):
            return updated
        target_package = _map_module(self.package)
        lines: list[tuple[str, cst.ImportAlias]] = []
        for alias in updated.names:
            name = _dotted(alias.name)
            whole = f"{absolute}.{name}"
            if whole in MODULES or _is_module(whole):  # a module, imported by name
                parent, _, last = _map_module(whole).rpartition(".")
                renamed = cst.ImportAlias(cst.Name(last), asname=_alias_unless(alias, last))
                lines.append((parent, renamed))
            else:
                new = RENAMES.get(name, name)
                lines.append((_map_module(absolute), alias.with_changes(name=cst.Name(new), asname=alias.asname)))
        parents = {parent for parent, _ in lines}
        if len(parents) != 1:
            self.errors.append(f"`from {absolute} import ...` maps to several modules: split the import")
            return updated
        relative, rest = _relative(target_package, parents.pop())
        names = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for _, a in lines]
        return updated.with_changes(
            relative=[cst.Dot()] * relative,
            module=cst.parse_expression(rest) if rest else None,
            names=names,
            lpar=None,
            rpar=None,
        )


def _alias_unless(alias: cst.ImportAlias, name: str) -> cst.AsName | None:
    if alias.asname is None or _dotted(alias.asname.name) == name:  # type: ignore[arg-type]
        return None
    return alias.asname


def _dotted(node: cst.BaseExpression) -> str:
    return cst.Module([]).code_for_node(node)


def _resolve(package: str, dots: int, module: str) -> str:
    """The absolute module of ``from <dots><module> import ...`` in ``package``."""
    if not dots:
        return module
    base = package.split(".")[: len(package.split(".")) - dots + 1]
    return ".".join([*base, module] if module else base)


def _is_module(absolute: str) -> bool:
    path = ROOT.joinpath(*absolute.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _map_module(absolute: str) -> str:
    if absolute in MODULES:
        return MODULES[absolute]
    return ".".join("_sync" if part == "_async" else part for part in absolute.split("."))


def _relative(package: str, absolute: str) -> tuple[int, str]:
    """``absolute`` as a relative import from ``package``: (the number of dots, the rest)."""
    here, there = package.split("."), absolute.split(".")
    if here[0] != there[0]:  # not ours: stays absolute
        return 0, absolute
    common = 0
    while common < min(len(here), len(there)) and here[common] == there[common]:
        common += 1
    return len(here) - common + 1, ".".join(there[common:])


def _redoc_statements(body: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """``body`` with its docstring's names renamed as whole words."""
    statements = list(body)
    if statements and isinstance(statements[0], cst.SimpleStatementLine):
        first = statements[0].body[0] if statements[0].body else None
        if isinstance(first, cst.Expr) and isinstance(first.value, cst.SimpleString):
            text = WORD.sub(lambda m: RENAMES[m.group(1)], first.value.value)
            text = re.sub(r"(?<=\.)_async(?=\.)", "_sync", text)  # dotted module paths only
            statements[0] = statements[0].with_changes(body=[first.with_changes(value=cst.SimpleString(text))])
    return statements


def _redoc(body: cst.BaseSuite) -> cst.BaseSuite:
    if isinstance(body, cst.IndentedBlock):
        return body.with_changes(body=_redoc_statements(body.body))
    return body


def header(source: Path) -> str:
    rel = source.relative_to(ROOT).as_posix() if source.is_relative_to(ROOT) else source.name
    return f"{HEADER}{rel} by tools/faces.py: do not edit.\n"


def target_of(source: Path) -> Path:
    """Where the threaded face of ``source`` goes: the same name in its pair's generated directory."""
    for source_dir, target_dir in PAIRS:
        if source.parent == source_dir:
            return target_dir / source.name
    raise ValueError(f"{source} is in no source directory of tools/faces.py")


def package_of(source: Path) -> str:
    """The dotted package of ``source`` (``unilog.consume._async``); outside the repository, a stand-in under
    ``unilog.consume._async`` (the check's own tests run copies of a source from a temporary directory)."""
    if source.is_relative_to(ROOT):
        return ".".join(source.parent.relative_to(ROOT).parts)
    return "unilog.consume._async"


def transform(text: str, package: str) -> str:
    """The threaded face of asyncio source ``text`` of ``package``, unformatted; raises SystemExit naming what it
    cannot carry over."""
    tool = Unasync(package)
    out = cst.parse_module(text).visit(tool)
    if tool.errors:
        raise SystemExit("faces: " + "; ".join(tool.errors))
    return out.code


def generated(source: Path) -> str:
    """The threaded face of ``source``, formatted as the repository formats code."""
    text = header(source) + transform(source.read_text(), package_of(source))
    target = target_of(source).as_posix()
    text = _ruff(["check", "--fix-only", "--select", "I,F401", "--quiet", "--stdin-filename", target, "-"], text)
    return _ruff(["format", "--quiet", "--stdin-filename", target, "-"], text)


def _ruff(args: list[str], text: str) -> str:
    done = subprocess.run([str(RUFF), *args], input=text, capture_output=True, text=True, cwd=ROOT, check=False)
    if done.returncode not in (0, 1):
        raise SystemExit(f"faces: ruff {args[0]} failed: {done.stderr.strip()}")
    return done.stdout


def sources() -> list[Path]:
    """Every asyncio source file, of every pair."""
    return sorted(p for source_dir, _ in PAIRS for p in source_dir.glob("*.py") if p.name != "__init__.py")


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def orphans() -> list[Path]:
    """Generated files whose source is gone (a renamed or deleted source leaves its old face behind)."""
    wanted = {target_of(source) for source in sources()}
    return sorted(
        p
        for _, target_dir in PAIRS
        for p in target_dir.glob("*.py")
        if p not in wanted and p.read_text().startswith(HEADER)
    )


def stale() -> list[str]:
    """Generated files that do not match their sources, are missing, or have no source left."""
    out = []
    for source in sources():
        target = target_of(source)
        if not target.exists() or target.read_text() != generated(source):
            out.append(_name(target))
    return out + [_name(p) for p in orphans()]


def main(argv: list[str]) -> int:
    if "--check" in argv:
        found = stale()
        for name in found:
            print(f"faces: {name} is stale: run `python tools/faces.py`")
        return 1 if found else 0
    for source in sources():
        target = target_of(source)
        target.parent.mkdir(exist_ok=True)
        target.write_text(generated(source))
        print(f"faces: wrote {_name(target)}")
    for orphan in orphans():
        orphan.unlink()
        print(f"faces: removed {_name(orphan)} (its source is gone)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
