"""unilog's alert rules (compose/prometheus/alerts.yml, the one copy) pass ``promtool check rules``, the compose
stack's Prometheus config (which loads them) passes ``promtool check config``, and the operations guide shows that
file rather than a copy of its own. promtool comes with Debian's ``prometheus`` package (``.ci/run`` installs it where
it may); without it the promtool checks are skipped with the reason. That a rule fires is checked by
tests/test_compose_podman.py against the running stack, and, for the WAL capture rules whose states that stack cannot
reach (a failover not ready, logical decoding held back, records lost with a slot), by ``promtool test rules`` on
series written here: each fires when it should and not when it should not."""

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
    assert {"UnilogCaptureFailoverNotReady", "UnilogCaptureDecodingHeldBack", "UnilogCaptureRecordsLost"} <= alerts


# Series of the exporter's capture gauges (label slot) and when each alert must fire, for `promtool test rules`.
# Samples every 15 s: "0x8 1x20" is 0 from 0 s to 2 min, then 1. A slot that never meets the condition never fires.
CAPTURE_RULE_TESTS = f"""
rule_files:
  - {RULES}
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
      - series: 'unilog_capture_failover_ready{{slot="not_ready"}}'
        values: '0x20'
      - series: 'unilog_capture_failover_ready{{slot="ready_again"}}'
        values: '0x4 1x20'
      - series: 'unilog_capture_failover_ready{{slot="ready"}}'
        values: '1x20'
    alert_rule_test:
      - eval_time: 1m
        alertname: UnilogCaptureFailoverNotReady
        exp_alerts: []
      - eval_time: 3m
        alertname: UnilogCaptureFailoverNotReady
        exp_alerts:
          - exp_labels: {{slot: not_ready}}
  - interval: 15s
    input_series:
      - series: 'unilog_capture_decoding_held_back{{slot="held"}}'
        values: '0x4 1x20'
      - series: 'unilog_capture_decoding_held_back{{slot="blip"}}'
        values: '0 1 0x20'
      - series: 'unilog_capture_decoding_held_back{{slot="moving"}}'
        values: '0x20'
    alert_rule_test:
      - eval_time: 90s
        alertname: UnilogCaptureDecodingHeldBack
        exp_alerts: []
      - eval_time: 2m
        alertname: UnilogCaptureDecodingHeldBack
        exp_alerts:
          - exp_labels: {{slot: held}}
  - interval: 15s
    input_series:
      - series: 'unilog_capture_losses_unacknowledged{{slot="lost"}}'
        values: '0 0 1 1 0x10'
      - series: 'unilog_capture_losses_unacknowledged{{slot="whole"}}'
        values: '0x20'
    alert_rule_test:
      - eval_time: 15s
        alertname: UnilogCaptureRecordsLost
        exp_alerts: []
      - eval_time: 30s
        alertname: UnilogCaptureRecordsLost
        exp_alerts:
          - exp_labels: {{slot: lost}}
      - eval_time: 2m
        alertname: UnilogCaptureRecordsLost
        exp_alerts: []
"""


@needs_promtool
def test_the_capture_alerts_fire_when_they_should_and_not_otherwise(tmp_path: Path) -> None:
    """A failover not ready for 2 minutes, logical decoding held back for 30 s, and any unacknowledged loss of
    records (at once, and no longer once acknowledged); a blip, or a slot that is fine, fires nothing."""
    tests = tmp_path / "capture_rules_test.yml"
    tests.write_text(CAPTURE_RULE_TESTS)
    result = promtool("test", "rules", str(tests))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_the_capture_rule_tests_can_fail(tmp_path: Path) -> None:
    """The unit tests above can fail: expecting the failover alert before its 2 minutes is refused."""
    tests = tmp_path / "capture_rules_test.yml"
    tests.write_text(CAPTURE_RULE_TESTS.replace("eval_time: 3m", "eval_time: 90s", 1))
    result = promtool("test", "rules", str(tests))
    assert result.returncode != 0 and "UnilogCaptureFailoverNotReady" in result.stdout + result.stderr
