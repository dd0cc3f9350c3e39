"""unilog's alert rules (compose/prometheus/alerts.yml, the one copy) pass ``promtool check rules``, the compose
stack's Prometheus config (which loads them) passes ``promtool check config``, and the operations guide shows that
file rather than a copy of its own. promtool comes with Debian's ``prometheus`` package (``.ci/run`` installs it where
it may); without it the promtool checks are skipped with the reason. Every alert is unit-tested by ``promtool test
rules`` on tests/prometheus/alerts_test.yml (it fires when it should, with the annotations a page shows, and not when
it should not: a fresh stack that never ran its optional processes stays quiet), and a new alert without such cases
fails here; every alert has a summary, a description and a runbook page of its own in the docs. That the running
stack fires UnilogProcessDown for a stopped consumer is checked by tests/test_compose_podman.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

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
    assert {"UnilogCaptureFailoverNotReady", "UnilogCaptureDecodingHeldBack", "UnilogCaptureRecordsLost"} <= alerts


# `promtool test rules` on tests/prometheus/alerts_test.yml: a case where each alert fires, one where it does not
RULE_TESTS = ROOT / "tests" / "prometheus" / "alerts_test.yml"


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"] if "alert" in rule]


def portable_rule_tests(tmp_path: Path, text: str | None = None) -> Path:
    """A copy of the rule tests (``text`` if given) in ``tmp_path`` that names the rules file by its full path."""
    copy = tmp_path / "alerts_test.yml"
    copy.write_text((text or RULE_TESTS.read_text()).replace("../../compose/prometheus/alerts.yml", str(RULES)))
    return copy


@needs_promtool
def test_every_alert_fires_when_it_should_and_not_otherwise() -> None:
    """The unit tests of every rule: labels and annotations of what fires, nothing where nothing should (among them a
    fresh stack that never ran its optional Spark consumer, and blips shorter than a rule's `for`)."""
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_the_rule_tests_can_fail(tmp_path: Path) -> None:
    """The unit tests can fail: expecting the failover alert before its 2 minutes is refused, and so is an optional
    process that never answered paging as down."""
    text = RULE_TESTS.read_text()
    early = text.replace(
        "      - eval_time: 3m\n        alertname: UnilogCaptureFailoverNotReady\n        exp_alerts:",
        "      - eval_time: 90s\n        alertname: UnilogCaptureFailoverNotReady\n        exp_alerts:",
        1,
    )
    assert early != text, "the case this test breaks is gone; update the test"
    result = promtool("test", "rules", str(portable_rule_tests(tmp_path, early)))
    assert result.returncode != 0 and "UnilogCaptureFailoverNotReady" in result.stdout + result.stderr
    old_rule = RULES.read_text().replace(
        'or (up{job="unilog-optional"} == 0 and on (job, instance) max_over_time(up{job="unilog-optional"}[1d]) == 1)',
        'or up{job="unilog-optional"} == 0',
    )
    assert old_rule != RULES.read_text(), "the rule this test breaks is gone; update the test"
    (tmp_path / "alerts.yml").write_text(old_rule)
    fresh = text.replace("../../compose/prometheus/alerts.yml", str(tmp_path / "alerts.yml"))
    (tmp_path / "fresh_test.yml").write_text(fresh)
    result = promtool("test", "rules", str(tmp_path / "fresh_test.yml"))
    assert result.returncode != 0 and "fresh stack, spark not run" in result.stdout + result.stderr


def test_every_alert_has_a_case_where_it_fires_and_one_where_it_does_not() -> None:
    """Each alert of the rules file is unit-tested both ways in tests/prometheus/alerts_test.yml (a new rule without
    tests fails here)."""
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert tests["rule_files"] == ["../../compose/prometheus/alerts.yml"]
    cases = [case for test in tests["tests"] for case in test.get("alert_rule_test", [])]
    fires = {case["alertname"] for case in cases if case["exp_alerts"]}
    quiet = {case["alertname"] for case in cases if not case["exp_alerts"]}
    names = [rule["alert"] for rule in alert_rules()]
    assert len(names) == len(set(names)) and len(names) >= 14, names
    assert not set(names) - fires, f"no case where these fire: {sorted(set(names) - fires)}"
    assert not set(names) - quiet, f"no case where these stay quiet: {sorted(set(names) - quiet)}"
    assert not (fires | quiet) - set(names), f"cases for alerts the rules file lacks: {(fires | quiet) - set(names)}"


def test_every_alert_explains_itself_and_links_its_runbook() -> None:
    """Every rule has a summary, a description and a runbook_url, the runbook a page of its own in the docs
    (docs/guides/runbooks/ALERT.md), listed in the site's navigation; every such page is an alert's."""
    nav = (ROOT / "mkdocs.yml").read_text()
    books = ROOT / "docs" / "guides" / "runbooks"
    for rule in alert_rules():
        annotations = rule.get("annotations") or {}
        missing = {"summary", "description", "runbook_url"} - set(annotations)
        assert not missing, f"{rule['alert']} lacks {sorted(missing)}"
        assert all(str(annotations[k]).strip() for k in ("summary", "description")), rule["alert"]
        assert annotations["runbook_url"] == f"docs/guides/runbooks/{rule['alert']}.md", annotations["runbook_url"]
        page = ROOT / annotations["runbook_url"]
        assert page.exists(), f"{rule['alert']}: no runbook at {page.relative_to(ROOT)}"
        assert page.read_text().startswith(f"# {rule['alert']}: "), page
        assert f"guides/runbooks/{rule['alert']}.md" in nav, f"{page.name} is not in mkdocs.yml's nav"
    pages = {p.stem for p in books.glob("*.md")} - {"index"}
    assert pages == {rule["alert"] for rule in alert_rules()}, pages


def test_only_the_optional_processes_are_scraped_as_optional() -> None:
    """Prometheus scrapes every process of the stack under a unilog-* job; those a stack may leave out (the Spark
    consumer) are in job unilog-optional, which UnilogProcessDown pages for only once the process answered."""
    config = yaml.safe_load(CONFIG.read_text())
    jobs = {
        job["job_name"]: [t for s in job["static_configs"] for t in s["targets"]] for job in config["scrape_configs"]
    }
    assert all(name.startswith("unilog-") for name in jobs), jobs
    assert jobs["unilog-optional"] == ["spark:9100"], jobs
    assert "spark:9100" not in jobs["unilog-processes"] + jobs["unilog-system"]
    (rule,) = [r for r in alert_rules() if r["alert"] == "UnilogProcessDown"]
    assert 'max_over_time(up{job="unilog-optional"}[1d])' in rule["expr"], rule["expr"]
