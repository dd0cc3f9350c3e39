"""The documentation site (mkdocs.yml, docs/) builds in strict mode, so a warning or a broken link or anchor fails
the suite; the API reference documents every public name and the CLI reference every sub-command."""

from __future__ import annotations

import argparse
import importlib.util
import json
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


@pytest.mark.slow(seconds=15, light=True)  # a MkDocs build: 12 s of the default run
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


def _modules() -> dict[str, str]:
    """docs/gen_pages.py's MODULES, the one list of the module reference's pages, as the nav hook reads it."""
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks.modules()


def test_every_module_of_the_module_reference_is_rendered_and_in_the_nav(site: Path) -> None:
    modules = _modules()
    assert {"unilog.ops.admin", "unilog.ops.status", "unilog.ops.dlq", "unilog.cli", "unilog.runtime"} <= set(
        modules.values()
    )
    home = (site / "index.html").read_text()
    for page, module in modules.items():
        html = (site / "reference" / "modules" / page / "index.html").read_text()
        assert f'id="{module}.' in html, f"{module}: no member rendered on its page"
        assert f'href="reference/modules/{page}/"' in home, f"{module}: not in the navigation"


def test_the_diataxis_pages_are_built(site: Path) -> None:
    for page in ("tutorial", "concepts", "glossary", "changelog", "guides/monitoring", "guides/migrations"):
        assert (site / page / "index.html").is_file(), page
    assert "Keep a Changelog" in (site / "changelog" / "index.html").read_text()


def test_the_record_table_lists_every_public_attribute_of_record() -> None:
    from unilog import Record

    page = (ROOT / "docs" / "reference" / "api.md").read_text()
    table = page.split("### Record attributes\n", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([a-z_]+)` \|", table, re.MULTILINE))
    public = {name for name in dir(Record) if not name.startswith("_") and not callable(getattr(Record, name))}
    public |= {name for name in Record.__slots__ if not name.startswith("_")}
    assert sorted(public - listed) == []
    assert sorted(listed - public) == []


def test_the_tutorial_includes_its_code_from_the_files_the_suite_runs() -> None:
    page = (ROOT / "docs" / "tutorial.md").read_text()
    included = re.findall(r'--8<-- "([^"]+)"', page)
    assert "examples/tutorial/test_shop.py" in included and "examples/tutorial/shop/api.py" in included
    assert all((ROOT / path).is_file() for path in included)


def test_the_asyncapi_page_renders_the_example_logs_document(site: Path) -> None:
    """docs/gen_asyncapi.py: the document of the demo's record types (services/records.py), as tables and as the
    raw JSON."""
    page = (site / "reference" / "asyncapi" / "index.html").read_text()
    for text in ("RideCreated v1", "rocket-rides-log.group.group0", "rocket-rides-log.consumer.spark0", "to the metre"):
        assert text in page, text
    assert 'href="../asyncapi.json"' in page
    document = json.loads((site / "reference" / "asyncapi.json").read_text())
    assert document["asyncapi"] == "3.0.0"
    assert set(document["channels"]["rocket-rides-log"]["messages"]) == {"RideCreated_v1"}
