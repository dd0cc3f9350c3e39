"""Issue 47: every command finds the user's code the same way through the installed ``unilog`` console script, run
from the user's own folder, as ``python -m unilog`` does (the console script does not put the working directory on
``sys.path`` by itself)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
