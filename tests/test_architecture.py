"""Architecture contracts: the layers and the adapter rules that ARCHITECTURE.md states, checked on every run.

* import-linter (its contracts are in ``pyproject.toml``) keeps the layers: the library never imports the harness
  or the demo, the harness uses only the library's public API, the producer side never imports the consumer side;
* a syntax-tree check (``tests/architecture.py``) keeps every SQL statement in ``unilog/store/`` and every Redis
  command in ``unilog/engine/`` (its generated ``_sync/`` face and ``_async/`` source included);
* every long-running worker implements :class:`unilog.runtime.Worker` and runs its one loop;
* no module over 600 lines and no function over 60 in the library, the harness, the demo and the benchmarks;
* no import circle anywhere in the tree (``unilog``, ``services``, ``bench``, ``tools``): the graph of every
  ``import`` statement, in functions too, read from the syntax tree (``tests/architecture.py``).

Each contract is also run against a planted violation, so a contract that can no longer fail fails here.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from architecture import (
    REDIS_HOME,
    ROOT,
    Violation,
    import_circles,
    import_graph,
    library_modules,
    redis_in,
    sql_in,
    violations,
)
from unilog.backfill import Backfill

from unilog import Consumer, GroupConsumer, PartitionedConsumer, Streamer
from unilog.runtime import Worker

LINT_IMPORTS = str(Path(sys.executable).parent / "lint-imports")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    # PYTHONPATH first: a copied tree must shadow the editable install of the real one
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_import_contracts_hold() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


PLANTED = {
    "the library imports the harness": (
        "unilog/config.py",
        "from unilog.harness import supervisor",
        "The library never imports the harness",
    ),
    "the library imports the demo": (
        "unilog/ops/status.py",
        "import services.rides",
        "Nothing in unilog imports the demo",
    ),
    "the harness imports the store": (
        "unilog/harness/supervisor.py",
        "from unilog import store",
        "The harness uses only the library's public API",
    ),
    "the harness imports a room's internals": (
        "unilog/harness/supervisor.py",
        "from unilog.stream import capture",
        "The harness uses only the library's public API",
    ),
    "the producer imports a consumer": (
        "unilog/produce/producer.py",
        "from unilog.consume import consumer",
        "The producer side does not import the streaming or consuming side",
    ),
    "the streamer imports a consumer": (
        "unilog/stream/streamer.py",
        "from unilog.consume import records",
        "The streaming side does not import the producing or consuming side",
    ),
    "a consumer imports the streamer": (
        "unilog/consume/partitions.py",
        "from unilog.stream import streamer",
        "The consuming side does not import the producing or streaming side",
    ),
    "the streamer imports the operations room": (
        "unilog/stream/retention.py",
        "from unilog.ops import dlq",
        "The streaming side does not import the producing or consuming side, operations or Spark",
    ),
    "the producer imports Spark": (
        "unilog/produce/encoding.py",
        "from unilog.spark import columns",
        "The producer side does not import the streaming or consuming side, operations or Spark",
    ),
    "the contracts import a room": (
        "unilog/contracts/codec.py",
        "from unilog.produce import encoding",
        "unilog.contracts imports none of the rooms",
    ),
    "the store imports a room": (
        "unilog/store/locks.py",
        "from unilog.consume import base",
        "The adapters (store, engine) and the shared core import none of the rooms",
    ),
}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_each_import_contract_fails_on_a_planted_violation(case: str, tmp_path: Path) -> None:
    path, line, contract = PLANTED[case]
    for name in ("unilog", "services"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    target = tmp_path / path
    target.write_text(target.read_text() + f"\n{line}  # planted\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0, result.stdout
    broken = " ".join(result.stdout.split("Broken contracts", 1)[-1].split())  # import-linter wraps long names
    assert contract in broken, result.stdout
    # an adapter imported by every room breaks their contracts too (indirectly); any other plant breaks one
    assert "1 broken" in result.stdout or case == "the store imports a room", result.stdout


def test_sql_and_redis_commands_stay_in_their_adapters() -> None:
    assert [str(v) for v in violations()] == []


def test_the_adapter_check_catches_planted_sql_and_redis() -> None:
    planted = textwrap.dedent(
        '''
        """SELECT in a docstring is prose."""
        import redis
        def f(conn, api, name):
            conn.execute("SELECT last_id FROM unilog_checkpoints WHERE name = %s", (name,))
            conn.execute(f"LISTEN {name}")
            api.client.xrange("s", count=1)
            pipe = api.pipeline()
            log.info("select the next batch")  # prose, not SQL
        '''
    )
    found = [v.what for v in sql_in(planted, Path("x.py")) + redis_in(planted, Path("x.py"))]
    assert found.count("redis-py imported outside the adapter") == 1
    assert sum("SQL outside the store" in w for w in found) == 2
    assert any(".xrange()" in w for w in found) and any(".pipeline()" in w for w in found)
    assert any(".client" in w for w in found)
    assert sql_in('"""SELECT x FROM y"""\nlog.info("select x from y")', Path("y.py")) == []
    assert isinstance(sql_in("x = 'DELETE FROM t'", Path("z.py"))[0], Violation)


def test_the_adapter_check_reads_every_library_module() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in library_modules()}
    assert {"unilog/stream/streamer.py", "unilog/consume/_sync/checkpoint.py", "unilog/cli/__init__.py"} <= names
    assert not any(n.startswith("unilog/harness/") for n in names)


def test_the_adapters_generated_face_and_its_source_are_the_adapter() -> None:
    """The Redis commands of ``unilog/engine/_async/`` and ``_sync/`` count as the adapter's: read, and allowed there."""
    adapter = [p for p in library_modules() if p.parent.name in ("_async", "_sync") and p.parent.parent == REDIS_HOME]
    assert {p.relative_to(ROOT).as_posix() for p in adapter} >= {
        "unilog/engine/_async/groups.py",
        "unilog/engine/_sync/groups.py",
    }
    senders = [p for p in adapter if p.stem not in ("__init__", "connection", "nodes")]  # those two open, lend
    assert all(redis_in(p.read_text(), p) for p in senders), "each sends commands"
    assert not any(REDIS_HOME in v.path.parents for v in violations())


@pytest.mark.parametrize("worker", [Streamer, Consumer, GroupConsumer, PartitionedConsumer, Backfill])
def test_every_worker_implements_the_contract_and_shares_the_loop(worker: type) -> None:
    assert issubclass(worker, Worker)
    assert "run" not in vars(worker), f"{worker.__name__} has a loop of its own"
    assert "drain_pass" in vars(worker), f"{worker.__name__} drains in a loop of its own"
    assert not getattr(worker, "__abstractmethods__", None)


def test_the_asyncio_workers_implement_the_awaited_contract_and_share_its_loop() -> None:
    from unilog import AsyncConsumer, AsyncGroupConsumer, AsyncPartitionedConsumer
    from unilog.runtime import AsyncWorker

    for worker in (AsyncConsumer, AsyncGroupConsumer, AsyncPartitionedConsumer):
        assert issubclass(worker, AsyncWorker)
        assert "run" not in vars(worker) and "drain" not in vars(worker), f"{worker.__name__} has a loop of its own"
        assert not getattr(worker, "__abstractmethods__", None)


def test_the_failure_policy_is_applied_in_one_place_per_face() -> None:
    """Only the loop (``unilog/runtime/``: its asyncio source and the generated threaded face) decides what a failed
    pass leads to and backs off; no worker retries on its own."""
    users = []
    for path in library_modules():
        if path.is_relative_to(ROOT / "unilog" / "runtime"):
            continue
        tree = ast.parse(path.read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        if names & {"decide", "Backoff", "_settle", "serve_async"}:
            users.append(path.relative_to(ROOT).as_posix())
    assert users == []


def test_no_import_circle_in_the_tree() -> None:
    """A circle makes a module's behaviour depend on which module of the circle is imported first (a partly
    initialised module, an ImportError under one entry point only) and makes the modules one unit in all but name."""
    circles = [" -> ".join(cycle) for cycle in import_circles(import_graph())]
    assert circles == [], f"import circles: {circles}"


def test_the_import_graph_reads_the_whole_tree() -> None:
    graph = import_graph()
    assert {"unilog.stream.streamer", "services.rides", "bench.typed", "bench.codecs", "tools.faces"} <= set(graph)
    assert "unilog.errors" in graph["unilog.stream.streamer"]  # a relative `from ..errors import ...`
    assert "bench.core" in graph["bench.typed"]


def test_the_circle_check_finds_planted_circles(tmp_path: Path) -> None:
    """Circles through module-level, function-level, relative and ``from pkg import module`` imports are found and
    named; a package importing its children (and a child its own package) is not a circle."""
    files = {
        "app/__init__.py": "from .a import A\nfrom . import pkg\n",
        "app/a.py": "import app.b\nA = 1\n",
        "app/b.py": "def f():\n    from app import a\n",  # function-level, `from package import module`
        "app/pkg/__init__.py": "from .x import X\n",
        "app/pkg/x.py": "from . import y\nX = 1\n",
        "app/pkg/y.py": "def g():\n    from .z import Z\n",
        "app/pkg/z.py": "from .. import pkg\nfrom .x import X as Z\n",  # its own package: no edge
        "other/__init__.py": "",
        "other/leaf.py": "import app.pkg.x\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path, ("app", "other"))
    assert graph["app.b"] == {"app.a"} and graph["app.pkg.z"] == {"app.pkg.x"}
    assert sorted(import_circles(graph)) == [
        ["app.a", "app.b", "app.a"],
        ["app.pkg.x", "app.pkg.y", "app.pkg.z", "app.pkg.x"],
    ]
    (tmp_path / "app/b.py").write_text("B = 1\n")
    (tmp_path / "app/pkg/y.py").write_text("Y = 1\n")
    assert import_circles(import_graph(tmp_path, ("app", "other"))) == []


def _sources() -> list[Path]:
    roots = [ROOT / "unilog", ROOT / "services", ROOT / "bench"]  # not migrations: scripts of DDL
    return sorted(p for root in roots for p in root.rglob("*.py"))


def test_no_module_over_600_lines_and_no_function_over_60() -> None:
    too_long = []
    for path in _sources():
        text = path.read_text()
        lines = len(text.splitlines())
        name = path.relative_to(ROOT)
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}:{node.lineno} {node.name}() {length} lines")
    assert too_long == []


DOC = (ROOT / "ARCHITECTURE.md").read_text()


def test_every_function_architecture_md_names_exists() -> None:
    """``file::name`` and ``file::Class.method`` references point at code that exists."""
    refs = re.findall(r"`((?:unilog|services|tests)/[\w/]+\.py)::([\w.]+)`", DOC)
    assert len(refs) >= 15
    broken = []
    for rel, qualname in refs:
        tree = ast.parse((ROOT / rel).read_text())
        names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            names |= {
                f"{cls.name}.{m.name}" for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
        if qualname not in names:
            broken.append(f"{rel}::{qualname}")
    assert broken == []


# The library's public API as the docs name it (docs/reference/api.md): the facade and the documented modules.
PUBLIC_MODULES = {
    "unilog",
    "unilog.cli",
    "unilog.config",
    "unilog.errors",
    "unilog.log",
    "unilog.metrics",
    "unilog.tracing",
    "unilog.ops.admin",
    "unilog.ops.dashboard",
    "unilog.ops.dlq",
    "unilog.ops.exporter",
    "unilog.ops.schema",
    "unilog.ops.status",
    "unilog.produce.backfill",
    "unilog.spark",
    "unilog.spark.archive",
    "unilog.spark.reconcile",
}


def _imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:  # `from unilog.ops import admin` imports the module unilog.ops.admin
                sub = ROOT.joinpath(*f"{node.module}.{alias.name}".split("."))
                found.add(
                    f"{node.module}.{alias.name}" if sub.is_dir() or sub.with_suffix(".py").exists() else node.module
                )
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m == "unilog" or m.startswith("unilog.")}


def test_the_harness_imports_only_the_public_api() -> None:
    """An allow-list (import-linter's contract above forbids the rooms' internals; this names what is allowed)."""
    outside = {}
    for path in sorted((ROOT / "unilog" / "harness").rglob("*.py")):
        for module in _imported_modules(path):
            if module not in PUBLIC_MODULES and not module.startswith("unilog.harness"):
                outside.setdefault(module, []).append(path.relative_to(ROOT).as_posix())
    assert outside == {}


# The one edit allowed: the command's entry point puts the working directory first, as `python -m unilog` has it
ENTRY_POINT_PATH_EDIT = "unilog/cli/__init__.py"


def test_no_code_edits_sys_path() -> None:
    """Handlers and models are found by :func:`unilog.config.import_user_module` (the working directory searched
    without touching ``sys.path``); the processes a harness starts get ``PYTHONPATH``; only the ``unilog`` command's
    entry point puts its working directory on the path, as ``python -m`` does."""
    edits = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in {"insert", "append", "extend", "remove"}
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "path"
                and isinstance(node.value.value, ast.Name)
                and node.value.value.id == "sys"
            ):
                edits.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert [e for e in edits if not e.startswith(f"{ENTRY_POINT_PATH_EDIT}:")] == []
    assert len(edits) == 1, edits  # the entry point's, which test_console_script.py needs


# What may sit at the top of unilog/: the facade, errors, settings and the shared core. Everything else lives in a
# room by role (produce/, stream/, consume/, ops/, spark/, cli/, django/, harness/, and the adapters store/, engine/).
FACADE = {"__init__", "__main__"}
SHARED_CORE = {"config", "errors", "faults", "health", "log", "metrics", "routing", "tracing", "wire", "_acompat"}


def test_no_module_sits_at_the_top_but_the_facade_and_the_shared_core() -> None:
    top = {p.stem for p in (ROOT / "unilog").glob("*.py")}
    assert top - FACADE - SHARED_CORE == set()


def _room(module: str) -> str:
    """The room of a library module: its package below unilog, or "core" for a top-level module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else "core"


def test_the_shared_core_is_shared() -> None:
    """Each shared-core module is imported from at least two rooms (the top-level modules count as one): a module
    only one room uses belongs in that room."""
    importers: dict[str, set[str]] = {name: set() for name in SHARED_CORE}
    for path in (ROOT / "unilog").rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        package = module if rel.name == "__init__" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], *base.split(".")])
            names = [base.rstrip(".")] + [f"{base.rstrip('.')}.{a.name}" for a in node.names]
            for name in names:
                stem = name.removeprefix("unilog.")
                if stem in importers and name == f"unilog.{stem}" and module != name:
                    importers[stem].add(_room(module))
    assert {name: rooms for name, rooms in importers.items() if len(rooms) < 2} == {}
