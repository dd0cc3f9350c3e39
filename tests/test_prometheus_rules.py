"""unilog's alert rules (compose/prometheus/alerts.yml, the one copy) pass ``promtool check rules``, the compose
stack's Prometheus config (which loads them) passes ``promtool check config``, and the operations guide shows that
file rather than a copy of its own. promtool comes with Debian's ``prometheus`` package (``.ci/run`` installs it where
it may); without it the promtool checks are skipped with the reason. That a rule fires is checked by
tests/test_compose_podman.py against the running stack."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "compose" / "prometheus" / "alerts.yml"
CONFIG = ROOT / "compose" / "prometheus" / "prometheus.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus; .ci/run does)"
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


@needs_promtool
def test_promtool_accepts_the_rules_and_the_config() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    result = promtool("check", "config", str(CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_rejects_a_broken_rule(tmp_path: Path) -> None:
    """The check can fail: a rule whose expression does not parse is refused, naming it."""
    text = RULES.read_text()
    broken = tmp_path / "alerts.yml"
    broken.write_text(text.replace("expr: unilog_system_up == 0", "expr: unilog_system_up == == 0", 1))
    assert broken.read_text() != text, "the rule this test breaks is gone; update the test"
    result = promtool("check", "rules", str(broken))
    assert result.returncode != 0 and "parse error" in result.stdout + result.stderr, result.stdout + result.stderr


def test_the_operations_guide_includes_the_rules_file() -> None:
    """One copy: the guide shows alerts.yml through a snippet (mkdocs fails its strict build if the file is gone),
    and no page of the docs carries alert rules of its own."""
    guide = (ROOT / "docs" / "guides" / "operations.md").read_text()
    assert '--8<-- "compose/prometheus/alerts.yml"' in guide
    copies = [p.relative_to(ROOT) for p in (ROOT / "docs").rglob("*.md") if re.search(r"- alert: ", p.read_text())]
    assert not copies, f"alert rules copied into {copies}: include compose/prometheus/alerts.yml instead"
    alerts = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    assert {"UnilogProcessDown", "UnilogConsumerLagging", "UnilogNobodyPublishes"} <= alerts, alerts
