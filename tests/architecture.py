"""The adapter rules, read from the code's syntax tree: SQL only in the store, Redis commands only in the adapter;
and the tree's import graph, read the same way, in which no circle may be (:func:`import_circles`).

Used by ``tests/test_architecture.py``. A string counts as SQL when it starts with a statement keyword and looks
like a statement (``SELECT ... FROM``, ``INSERT INTO``, ...), so prose in docstrings and log messages does not. A
Redis command is a call of a redis-py client method (``.xadd(...)``, ``.pipeline(...)``, ``.execute_command(...)``)
on anything, or any use of the client's ``.client`` attribute outside the adapter; names that are also ordinary
Python methods (``get``, ``set``, ``delete``, ``info``, ``type``, ``exists``, ``keys``) are not counted, since the
adapter's typed methods are the only way the library reaches the client object anyway.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ROOT / "unilog"
HARNESS = LIBRARY / "harness"
SQL_HOME = LIBRARY / "store"
REDIS_HOME = LIBRARY / "engine"

_SQL = re.compile(
    r"^\s*(?:"
    r"SELECT\s.+|INSERT\s+INTO\s|UPDATE\s+\S+\s+SET\s|DELETE\s+FROM\s|WITH\s+\w+\s+AS\s*\(|"
    r"(?:CREATE|ALTER|DROP)\s+(?:TABLE|INDEX|DATABASE|ROLE|FUNCTION|TRIGGER|SEQUENCE|SCHEMA|TYPE)\s|"
    r"LOCK\s+TABLE\s|TRUNCATE\s|LISTEN\s|UNLISTEN\s|NOTIFY\s|SET\s+(?:TRANSACTION|LOCAL|SESSION)\s|"
    r"BEGIN\s+ISOLATION\s|COPY\s+\S+\s+(?:FROM|TO)\s"
    r")",
    re.DOTALL,  # statements are written in capitals here, prose is not
)
# a word list reads better than 60 quoted strings
REDIS_METHODS = frozenset(
    """xadd xrange xrevrange xread xreadgroup xack xtrim xlen xdel xsetid xinfo_stream xinfo_groups xinfo_consumers
    xgroup_create xgroup_destroy xgroup_createconsumer xgroup_delconsumer xgroup_setid xpending xpending_range xclaim
    xautoclaim hset hget hgetall hdel hincrby hmget hsetnx zadd zrem zrange zrangebyscore zremrangebyscore zcard
    zscore eval evalsha script_load register_script execute_command pipeline flushdb flushall config_set config_get
    scan_iter expire pexpire incr incrby setex psetex mget unlink lpush rpush bgrewriteaof""".split()  # noqa: SIM905
)


@dataclass(frozen=True)
class Violation:
    path: Path
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT) if self.path.is_absolute() else self.path}:{self.line}: {self.what}"


def _text(node: ast.Constant | ast.JoinedStr) -> str | None:
    """A string literal's text; an f-string's with its placeholders as ``?`` (so a dynamic statement counts too)."""
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else "?" for v in node.values)
    return node.value if isinstance(node.value, str) else None


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def sql_in(source: str, path: Path) -> list[Violation]:
    """SQL statements written in ``source`` (docstrings excluded)."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    for node in ast.walk(tree):  # an f-string's literal parts are judged as part of the whole f-string
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)
    found = []
    for node in ast.walk(tree):
        if id(node) in skip or not isinstance(node, (ast.Constant, ast.JoinedStr)):
            continue
        text = _text(node)
        if text is not None and _SQL.match(text):
            found.append(Violation(path, node.lineno, f"SQL outside the store: {text.strip()[:50]!r}"))
    return found


def redis_in(source: str, path: Path) -> list[Violation]:
    """Redis client calls (and reaching into the adapter's ``.client``) in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in REDIS_METHODS:
            found.append(Violation(path, node.lineno, f"Redis command outside the adapter: .{node.func.attr}()"))
        elif isinstance(node, ast.Attribute) and node.attr == "client" and isinstance(node.ctx, ast.Load):
            found.append(Violation(path, node.lineno, "the Redis client used outside the adapter: .client"))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(n == "redis" or n.startswith("redis.") for n in names):
                found.append(Violation(path, node.lineno, "redis-py imported outside the adapter"))
    return found


def library_modules() -> list[Path]:
    """The library's source files: everything under ``unilog/`` but the harness."""
    return sorted(p for p in LIBRARY.rglob("*.py") if HARNESS not in p.parents)


def violations() -> list[Violation]:
    """Every breach of the adapter rules in the library."""
    found: list[Violation] = []
    for path in library_modules():
        source = path.read_text()
        if SQL_HOME not in path.parents:
            found += sql_in(source, path)
        if REDIS_HOME not in path.parents:
            found += redis_in(source, path)
    return found


# -- the import graph -------------------------------------------------------------------------------------------------

# the tree's Python code; not tests/ (no package: nothing imports it) nor migrations/ (Alembic's scripts)
PACKAGES = ("unilog", "services", "bench", "tools")


def tree_modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Every module of the tree by its dotted name (a package by its ``__init__.py``)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            found[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    return found


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The tree module ``name`` names: itself, or the nearest enclosing one (``pkg.func`` names ``pkg``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, modules: dict[str, Path]) -> set[str]:
    """The tree modules ``module`` imports: every ``import``/``from`` statement in it (at the top, in a function, under
    ``if TYPE_CHECKING``), relative ones resolved. ``from pkg import name`` is an edge to ``pkg.name`` when that is a
    module, else to ``pkg``. An edge to the module's own ancestor package (``from . import X`` in a submodule) is left
    out: Python initialises a module's ancestors before the module whatever its code says, so that edge adds no order
    the layout does not impose already."""
    path = modules[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(_owner(alias.name, modules) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
            found.update(_owner(f"{base}.{alias.name}", modules) for alias in node.names)
    ancestors = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
    return {m for m in found if m is not None and m != module and m not in ancestors}


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    modules = tree_modules(root, packages)
    return {module: imports_of(module, modules) for module in modules}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each circle of the graph (a strongly connected component of more than one module) as one cycle through it,
    ``[a, b, ..., a]``, found by Tarjan's algorithm (iterative: the graph has hundreds of modules)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(set(component))
    return [_cycle_through(graph, component) for component in components]


def _cycle_through(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle from the component's first module back to itself, inside the component (breadth first)."""
    first = min(component)
    came_from: dict[str, str] = {}
    frontier = [first]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == first:
                    path = [node]
                    while path[-1] != first:
                        path.append(came_from[path[-1]])
                    return [first, *reversed(path[:-1]), first]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {first} in {sorted(component)}")  # a component always has one
