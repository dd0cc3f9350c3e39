"""The adapter rules, read from the code's syntax tree: SQL only in the store, Redis commands only in the adapter.

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
