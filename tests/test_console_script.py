"""Issue 47: every command finds the user's code the same way through the installed ``unilog`` console script, run
from the user's own folder, as ``python -m unilog`` does (the console script does not put the working directory on
``sys.path`` by itself). Issue 45: a command imports only what it uses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from unilog import Settings

SHOP = """
from dataclasses import dataclass

from unilog.contracts import record_type


@record_type(stream="orders", object="order", action="created", version=1)
@dataclass
class OrderCreated:
    order_id: int
"""


def console_script() -> str:
    found = Path(sys.executable).parent / "unilog"
    if found.exists():
        return str(found)
    which = shutil.which("unilog")
    if which is None:
        pytest.skip("the unilog console script is not installed beside this interpreter")
    return which


def test_schema_check_finds_the_users_package_in_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "records.py").write_text(SHOP)
    (tmp_path / "registry.json").write_text(json.dumps({"schemas": [], "modes": {}}))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    result = subprocess.run(
        [console_script(), "schema", "check", "shop.records", "--against", "registry.json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "OrderCreated" in result.stdout, result.stdout
    missing = subprocess.run(
        [console_script(), "schema", "check", "nowhere.records", "--against", "registry.json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert missing.returncode != 0 and "Traceback" not in missing.stderr, missing.stderr
    assert "nowhere" in missing.stderr


def run_script(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed ``unilog ARGS``, run from ``cwd`` (the user's folder) with no ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    return subprocess.run([console_script(), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def user_package(folder: Path, records: str = SHOP) -> None:
    (folder / "shop").mkdir()
    (folder / "shop" / "__init__.py").write_text("")
    (folder / "shop" / "records.py").write_text(records)


def test_backfill_type_and_asyncapi_module_find_the_users_package_in_the_working_directory(
    tmp_path: Path, settings: Settings, pg: Any
) -> None:
    user_package(tmp_path)
    urls = ["--database-url", settings.database_url, "--redis-url", settings.redis_url]
    pg.execute("CREATE TABLE orders (order_id int PRIMARY KEY)")
    pg.execute("INSERT INTO orders SELECT generate_series(1, 3)")
    backfill = run_script(
        tmp_path, "backfill", "orders", "--key", "order_id", "--type", "shop.records:OrderCreated", *urls
    )
    assert backfill.returncode == 0, backfill.stderr
    staged = pg.execute("SELECT stream, object, action, data FROM staged_log_records ORDER BY id").fetchall()
    assert [(r[0], r[1], r[2], r[3]) for r in staged] == [
        ("orders", "order", "created", {"order_id": i}) for i in (1, 2, 3)
    ]
    document = run_script(tmp_path, "asyncapi", "--module", "shop.records", "--out", "doc.json", *urls)
    assert document.returncode == 0, document.stderr
    messages = json.loads((tmp_path / "doc.json").read_text())["components"]["messages"]
    assert messages["OrderCreated_v1"]["x-unilog-registered"] is False


def test_a_users_module_imports_a_top_level_module_beside_it_as_python_m_finds_it(tmp_path: Path) -> None:
    """A flat layout: ``shop/records.py`` imports ``pricing`` (``pricing.py`` in the user's folder) by its top-level
    name, which ``python -m unilog`` finds (the working directory is on its path) and the console script must too."""
    user_package(tmp_path, "import pricing  # beside the package, in the user's folder\n" + SHOP)
    (tmp_path / "pricing.py").write_text("RATE = 3\n")
    (tmp_path / "registry.json").write_text(json.dumps({"schemas": [], "modes": {}}))
    result = run_script(tmp_path, "schema", "check", "shop.records", "--against", "registry.json")
    assert result.returncode == 0, result.stderr
    assert "OrderCreated" in result.stdout, result.stdout


def test_reconcile_model_finds_the_users_module_in_the_working_directory(tmp_path: Path) -> None:
    """Spark's entry point takes the user's code as ``--model module:object``; it is imported before Spark starts,
    so a module found without the object it names proves the module was found (no JVM needed), and the same
    command from another folder says the module is nowhere, in one line each."""
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "ridemodel.py").write_text("totals = None  # the user's reconcile model would be here\n")
    urls = ["--database-url", "postgresql://u@127.0.0.1:1/x", "--redis-url", "redis://127.0.0.1:1/0"]
    found = run_script(tmp_path / "app", "reconcile", "--model", "ridemodel:model", *urls)
    assert found.returncode == 6 and "Traceback" not in found.stderr, found.stderr
    assert "'ridemodel' has no 'model'" in found.stderr, found.stderr
    nowhere = run_script(tmp_path, "reconcile", "--model", "ridemodel:model", *urls)
    assert nowhere.returncode == 6 and "Traceback" not in nowhere.stderr, nowhere.stderr
    assert "ridemodel" in nowhere.stderr and "has no" not in nowhere.stderr, nowhere.stderr


# Issue 45: a process start is most of what many tests wait for, and most of a start was importing what the command
# never uses. Each command builds the whole parser, so parsing imports no adapter, no structlog; logging as JSON (off
# a terminal) imports no rich; and nothing imports the OpenTelemetry SDK, which redis-py 8 pulls in if it is there.
# (redis-py's own `import redis` imports redis.asyncio: a command that uses Redis cannot avoid that one.)
PARSING_ALONE = ("psycopg", "redis", "structlog", "rich", "opentelemetry", "asyncio", "prometheus_client")
JSON_LOGS = ("rich", "opentelemetry.sdk")

_MODULES_AT_EXIT = """
import atexit, runpy, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write("\\n".join(sorted(sys.modules))))
runpy.run_module("unilog", run_name="__main__", alter_sys=True)
"""


def modules_of(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, set[str]]:
    """``python -m unilog ARGS``'s exit code and every module it had imported when it exited."""
    out = tmp_path / "modules.txt"
    argv = [sys.executable, "-c", _MODULES_AT_EXIT, str(out), *args]
    result = subprocess.run(argv, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=120)
    assert out.exists(), result.stderr
    return result.returncode, set(out.read_text().split())


def imported(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(f"{n}.") for n in names))


@pytest.mark.parametrize(
    "args",
    [["--version"], ["--help"], ["status", "--help"], ["streamer", "--help"], ["consume", "--help"],
     ["schema", "mode", "--help"], ["backfill", "--help"]],
    ids=" ".join,
)  # fmt: skip
def test_parsing_a_command_imports_no_adapter_and_no_logging_library(tmp_path: Path, args: list[str]) -> None:
    code, modules = modules_of(tmp_path, *args)
    assert code == 0
    assert "unilog.cli" in modules  # the list is the real one
    assert imported(modules, PARSING_ALONE) == []


def test_a_command_logging_json_imports_neither_rich_nor_the_opentelemetry_sdk(
    tmp_path: Path, settings: Settings
) -> None:
    env = {"DATABASE_URL": settings.database_url, "REDIS_URL": settings.redis_url, "UNILOG_STREAM": settings.stream}
    code, modules = modules_of(tmp_path, "streamer", "--once", env=env)  # stdout is a pipe: JSON logs
    assert code == 0
    assert {"redis", "psycopg", "structlog", "unilog.stream.streamer"} <= modules  # it did stream
    assert imported(modules, JSON_LOGS) == []
