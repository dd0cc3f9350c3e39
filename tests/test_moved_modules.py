"""Modules that moved into a room still import under the names users know (``unilog.MOVED``): the very same module
object as under the new name, with no shim file left at the top of ``unilog/``, imported only when asked for."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import unilog

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("old", sorted(unilog.MOVED))
def test_an_old_name_imports_the_very_module_of_its_new_name(old: str) -> None:
    new = unilog.MOVED[old]
    moved = importlib.import_module(old)
    assert moved is importlib.import_module(new)
    assert moved.__name__ == new and moved.__spec__ is not None and moved.__spec__.name == new, "its own spec"
    assert sys.modules[old] is sys.modules[new]
    assert getattr(unilog, old.rpartition(".")[2]) is moved, "from unilog import <old> gives it too"


@pytest.mark.parametrize("old", sorted(unilog.MOVED))
def test_no_shim_is_left_at_the_old_path(old: str) -> None:
    path = ROOT.joinpath(*old.split("."))
    assert not path.with_suffix(".py").exists() and not path.is_dir()


def test_a_module_below_a_moved_package_is_the_same_module_too() -> None:
    old = importlib.import_module("unilog.dashboard.routes")  # by its dotted name: the finder maps the prefix
    from unilog.ops.dashboard import routes

    assert old is routes and sys.modules["unilog.dashboard.routes"] is routes


def test_old_names_are_imported_only_when_asked_for() -> None:
    """``import unilog`` (a web app that only emits) loads none of the moved modules, under either name."""
    code = (
        "import sys, unilog; "
        "print(sorted(m for m in sys.modules if m in unilog.MOVED or m in unilog.MOVED.values())); "
        "import unilog.status; print('unilog.ops.status' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:2] == ["[]", "True"], out


def test_the_documented_names_resolve_through_the_old_module() -> None:
    from unilog.backfill import BackfillConfig
    from unilog.dlq import DeadLetter
    from unilog.status import collect_status

    from unilog.ops.dlq import DeadLetter as NewDeadLetter
    from unilog.produce.backfill import BackfillConfig as NewBackfillConfig

    assert DeadLetter is NewDeadLetter and BackfillConfig is NewBackfillConfig
    assert collect_status.__module__ == "unilog.ops.status"


def test_an_unknown_name_is_still_an_import_error() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("unilog.no_such_module")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("unilog.dashboard.no_such_module")


def test_the_old_names_keep_no_python_m_entry_point_because_none_had_one() -> None:
    """None of the moved modules ran as ``python -m unilog.<old>`` (``unilog.health``, the compose file's probe,
    stays where it is): the commands are ``unilog status``, ``unilog dlq``, ... The probe still answers."""
    for old in unilog.MOVED:
        new = ROOT.joinpath(*unilog.MOVED[old].split("."))
        source = (new / "__init__.py" if new.is_dir() else new.with_suffix(".py")).read_text()
        assert '__name__ == "__main__"' not in source, old
    probe = subprocess.run([sys.executable, "-m", "unilog.health"], capture_output=True, text=True)
    assert probe.returncode == 2 and "usage: python -m unilog.health URL" in probe.stderr
