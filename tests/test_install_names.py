"""Issue 47, item 1: every install line a user reads names this project's distribution (pyproject's ``name``,
``unilog-outbox``), never ``unilog``: on the package index that is someone else's package (2.0.0, 2017,
"Representing complex object as unicode or simple string"), without our extras and without a ``unilog`` command.

Scanned: the README, CONTRIBUTING, the docs, the Dockerfiles, the compose files, the CI script, the examples, and
the library's and the demo's messages (the "install the X extra" lines). A ``pip install`` names the project (with
or without extras), a path (``-e .``, ``".[dev]"``, a requirements file), or a third-party package listed below; an
extra written as ``name[extra]`` with one of the project's extras names the project. The slow test installs the
tutorial's line as written, from the wheel of this tree, into a fresh virtualenv and runs the console script.
"""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

import unilog
from unilog.cli import extras
from unilog.config import DISTRIBUTION

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = set(PROJECT["optional-dependencies"])

# third-party packages the docs and messages legitimately install beside unilog (normalized names)
THIRD_PARTY = {
    "fastapi",  # the tutorial's API
    "uvicorn",  # the tutorial's server
    "msgspec",  # bench/codecs.py's optional variants
}

# where a user reads install lines: documents, container and CI files, and the messages of the library and the demo
DOCUMENTS = ["README.md", "CONTRIBUTING.md", "ARCHITECTURE.md", "Dockerfile", "docker-compose.yml", "Procfile"]
TREES = {
    "docs": ("*.md", "*.py"),
    "compose": ("*",),
    ".ci": ("*",),
    "examples": ("*.py", "*.md", "*.txt", "*.ini", "*.toml"),
    "unilog": ("*.py", "*.mjs"),
    "services": ("*.py",),
    "tools": ("*.py", "*.mjs", "*.sh"),
    "bench": ("*.py", "*.md"),
}

PIP_INSTALL = re.compile(r"pip3? install\b(?P<rest>[^\n`]*)")
# name[extra,...] where every extra is one of the project's: a mention of the project with its extras
WITH_EXTRAS = re.compile(r"(?<![\w.\-/{])(?P<name>[A-Za-z][\w.\-]*)\[(?P<extras>[a-z][a-z,\s]*)\]")
# options of pip install that take a value (the value is not a requirement)
VALUED = {"-r", "--requirement", "-c", "--constraint", "-t", "--target", "--prefix", "-i", "--index-url", "-f"}


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sources() -> Iterator[Path]:
    for name in DOCUMENTS:
        if (ROOT / name).is_file():
            yield ROOT / name
    for tree, patterns in TREES.items():
        for pattern in patterns:
            for path in sorted((ROOT / tree).rglob(pattern)):
                if path.is_file() and "node_modules" not in path.parts and "__pycache__" not in path.parts:
                    yield path


def requirements(rest: str) -> Iterator[str]:
    """The requirement arguments of one ``pip install`` command line (options, their values and paths left out)."""
    rest = re.split(r"&&|\|\||;|\)|#|\\$", rest)[0]
    skip = False
    for raw in rest.split():
        token = raw.strip("\"'`,")
        if skip:
            skip = False
            continue
        if token in VALUED:
            skip = True
            continue
        if not token or token.startswith("-") or token.startswith((".", "/", "~", "$")) or "://" in token:
            continue
        if re.match(r"\w+=(?!=)", token):  # a keyword argument after the message (name="django"), not a pin
            continue
        yield token


def requirement_name(token: str) -> str:
    return re.split(r"[\[<>=!~;@ ]", token, maxsplit=1)[0]


def wrong_names(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    where = path.relative_to(ROOT)
    found = []
    own = normalized(PROJECT["name"])
    for match in PIP_INSTALL.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        for token in requirements(match.group("rest")):
            name = requirement_name(token)
            if name == "{DISTRIBUTION}" or normalized(name) in (own, *THIRD_PARTY):
                continue
            found.append(f"{where}:{line}: pip install {token}")
    for match in WITH_EXTRAS.finditer(text):
        named = {e.strip() for e in match.group("extras").split(",")}
        if named <= EXTRAS and normalized(match.group("name")) != own:
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{where}:{line}: {match.group(0)}")
    return found


def test_the_project_is_named_unilog_outbox_and_the_library_knows_its_distribution() -> None:
    assert PROJECT["name"] == DISTRIBUTION == "unilog-outbox"
    assert PROJECT["scripts"] == {"unilog": "unilog.cli:main"}, "the command stays `unilog`"


def test_every_install_line_names_this_projects_distribution() -> None:
    scanned = list(sources())
    assert len(scanned) > 100, "the scan reaches the docs and the library"
    wrong = [line for path in scanned for line in wrong_names(path)]
    assert wrong == [], "\n".join(wrong)


def test_the_scan_sees_a_wrong_name() -> None:
    """The scanner itself: the lines issue 47 found are caught, the right ones pass."""
    assert list(requirements(" unilog                 # extras: embedded")) == ["unilog"]
    assert list(requirements(' "unilog[testing,contracts]" fastapi uvicorn')) == [
        "unilog[testing,contracts]", "fastapi", "uvicorn"
    ]  # fmt: skip
    assert list(requirements(' -q -e ".[dev]" && .venv/bin/unilog demo')) == []
    assert list(requirements(" --no-cache-dir -r /tmp/requirements.txt \\")) == []
    assert WITH_EXTRAS.search("installed by `unilog[testing]`") is not None
    assert WITH_EXTRAS.search('"redis[hiredis]>=5.0"') is not None  # found, but hiredis is not our extra


def test_the_missing_extra_line_names_the_distribution() -> None:
    error = extras.missing(ModuleNotFoundError("No module named 'rich'", name="rich"), (), "unilog backfill")
    assert error is not None
    assert str(error).endswith("pip install 'unilog-outbox[progress]'"), error


@pytest.mark.slow(light=True)
def test_the_tutorials_install_line_installs_this_project_and_its_command(tmp_path: Path, this_wheel: Path) -> None:
    """``pip install "unilog-outbox[testing,contracts]" fastapi uvicorn`` as the tutorial writes it, with this tree's
    wheel offered beside the index (as the published one will be): every extra exists, and `unilog` runs."""
    line = next(m for m in PIP_INSTALL.finditer((ROOT / "docs" / "tutorial.md").read_text()))
    args = [a.strip("\"'") for a in match_args(line.group("rest"))]
    wheels = this_wheel.parent
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    result = subprocess.run(
        [python, "-m", "pip", "install", "--find-links", str(wheels), *args],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "does not provide the extra" not in result.stderr, result.stderr
    shop = tmp_path / "shop-app"
    shop.mkdir()
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATABASE_URL", "REDIS_URL")}
    version = subprocess.run(
        [str(env_dir / "bin" / "unilog"), "--version"], cwd=shop, env=clean, capture_output=True, text=True
    )
    assert version.returncode == 0 and version.stdout.strip() == f"unilog {unilog.__version__}", version
    shown = subprocess.run([python, "-m", "pip", "show", PROJECT["name"]], capture_output=True, text=True)
    assert f"Name: {PROJECT['name']}" in shown.stdout, shown


def match_args(rest: str) -> list[str]:
    return re.split(r"&&|;|#", rest)[0].split()
