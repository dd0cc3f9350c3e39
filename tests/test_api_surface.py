"""``unilog.__all__`` is what the docs tell users to use: every name it lists is documented, every ``unilog.Name``
the README or a docs page mentions is importable from ``unilog``, and nothing is missing from ``__all__``."""

from __future__ import annotations

import re
from pathlib import Path

import unilog

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
# everything a user reads: the README and the pages of the documentation site
PAGES = "\n".join([README, *(page.read_text() for page in sorted(DOCS.rglob("*.md")))])


def _section(page: str, title: str) -> str:
    """The section ``title`` (a heading of any level) of ``docs/<page>``, up to the next second-level heading."""
    return (DOCS / page).read_text().split(f"# {title}\n", 1)[1].split("\n## ", 1)[0]


def test_every_exported_name_is_documented_in_the_public_api_section() -> None:
    documented = set(re.findall(r"`([A-Za-z_]+)`", _section("reference/api.md", "The public API")))
    missing = sorted(set(unilog.__all__) - documented - {"__version__"})
    assert missing == []


def test_every_name_the_readme_uses_from_unilog_is_exported() -> None:
    used = set(re.findall(r"\bunilog\.([A-Z][A-Za-z]+|emit)\b", PAGES))
    used |= set(re.findall(r"^\s*import unilog\b|from unilog import ([A-Za-z_, ]+)", PAGES, re.MULTILINE)) - {""}
    assert sorted(used - set(unilog.__all__)) == []
    for name in unilog.__all__:
        assert hasattr(unilog, name), name


def test_nothing_internal_is_exported() -> None:
    internal = {"FaultConfig", "Links", "serve", "store", "engine", "NO_FAULTS"}
    assert internal.isdisjoint(unilog.__all__)


def test_the_exit_code_table_is_the_exit_code_enum() -> None:
    from unilog.cli import ExitCode

    section = _section("guides/operations.md", "Operations: when something refuses")
    rows = re.findall(r"^\| (\d+) \| `([A-Z_]+)` \|", section, re.MULTILINE)
    assert [(int(code), name) for code, name in rows] == [(int(c), c.name) for c in ExitCode]


def test_every_metric_is_listed_in_the_readme() -> None:
    from prometheus_client import REGISTRY

    import unilog.metrics
    from unilog.ops import exporter

    section = _section("guides/operations.md", "Metrics")
    ours = {m.name for m in REGISTRY.collect() if m.name.startswith("unilog_")}
    ours |= set(re.findall(r'"(unilog_[a-z_]+)"', Path(exporter.__file__).read_text()))
    assert unilog.metrics.INFO is not None
    missing = sorted(name for name in ours if name not in section)
    assert missing == []
