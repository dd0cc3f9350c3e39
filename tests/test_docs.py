"""The documentation site (mkdocs.yml, docs/) builds in strict mode, so a warning or a broken link or anchor fails
the suite; the API reference documents every public name and the CLI reference every sub-command."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import unilog
from unilog.cli import _parser

ROOT = Path(__file__).resolve().parent.parent
MKDOCS = Path(sys.executable).parent / "mkdocs"
# MkDocs' plugins print a banner about MkDocs 2 on every build unless told not to
QUIET = {"NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, **QUIET},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    return out


def test_the_site_builds_in_strict_mode(site: Path) -> None:
    for page in ("index.html", "reference/api/index.html", "reference/cli/index.html", "benchmarks/results/index.html"):
        assert (site / page).is_file(), page


def test_every_public_name_is_in_the_api_reference(site: Path) -> None:
    page = (site / "reference" / "api" / "index.html").read_text()
    missing = [name for name in unilog.__all__ if f'id="unilog.{name}"' not in page]
    assert missing == []


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name)
                yield from _commands(sub, (*path, name))


def test_every_cli_subcommand_is_in_the_cli_reference(site: Path) -> None:
    page = (site / "reference" / "cli" / "index.html").read_text()
    commands = list(_commands(_parser()))
    assert ("capture", "wal") in commands  # the walk reaches nested sub-commands
    missing = [
        " ".join(c)
        for c in commands
        if f'id="unilog-{"-".join(c)}"' not in page or f"usage: unilog {' '.join(c)}" not in page
    ]
    assert missing == []


def test_the_readmes_relative_links_point_at_files_that_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    links = [target for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme) if "://" not in target]
    assert any(link.startswith("docs/") for link in links)
    assert [link for link in links if not (ROOT / link).exists()] == []
