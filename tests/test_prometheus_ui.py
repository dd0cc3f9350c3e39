"""The Prometheus pages ``tools/compose_podman.py up`` prints and docs/guides/compose.md names open on the stack's
Prometheus. Which paths serve them depends on the build: the official image the compose file pins (prom/prometheus
>= 2.34, when the classic UI was removed) serves its UI at /alerts, /targets and /rules; Debian's package, which the
Podman stand-in installs (2.42, built without the React UI), serves only the classic pages, under /classic/. The tool
asks the Prometheus it brought up which answer; here it asks a real one, Debian's binary (the stand-in's very build),
run on a free port with the stack's own configuration and rules."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from compose_tool import tool  # tests/ is on sys.path

from unilog.harness.embedded import free_port

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS = shutil.which("prometheus")


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture(scope="module")
def debian_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Debian's Prometheus (the stand-in's package) with compose/prometheus's config and rules, on a free port."""
    if PROMETHEUS is None:
        pytest.skip("Debian's prometheus is not installed (apt-get install prometheus, which brings promtool too)")
    port, data = free_port(), tmp_path_factory.mktemp("prometheus")
    argv = [PROMETHEUS, f"--config.file={ROOT / 'compose' / 'prometheus' / 'prometheus.yml'}"]
    argv += [f"--storage.tsdb.path={data}", f"--web.listen-address=127.0.0.1:{port}"]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if status(url + "/-/ready") == 200:
                    break
            except OSError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, "Prometheus did not start"
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_pages_printed_open_on_the_stand_ins_prometheus(debian_prometheus: str) -> None:
    """On Debian's build /alerts answers 404 (the pages the tool printed before); the URLs it prints now open the
    alerts, targets and rules pages, each naming what it shows."""
    assert status(debian_prometheus + "/alerts") == 404
    pages = tool.prometheus_pages(debian_prometheus)
    assert pages == [f"{debian_prometheus}/classic/{page}" for page in ("alerts", "targets", "rules")], pages
    for url, title in zip(pages, ("Alerts", "Targets", "Rules"), strict=True):
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200 and title in response.read().decode(), url
    with urllib.request.urlopen(pages[2], timeout=10) as response:
        assert "UnilogProcessDown" in response.read().decode()


def test_the_official_image_pinned_serves_the_pages_at_the_root() -> None:
    """The compose file pins prom/prometheus 2.23 or later (or 3.x): its UI serves /alerts, /targets and /rules, the
    first paths the tool tries, and the ones the compose guide names for it (with /classic/ for the stand-in)."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    image = compose["services"]["prometheus"]["image"]
    match = re.fullmatch(r"\$\{PROMETHEUS_IMAGE:-prom/prometheus:v(\d+)\.(\d+)\.\d+\}", image)
    assert match, image
    assert (int(match[1]), int(match[2])) >= (2, 23), f"{image}: its UI at the root is not the one the guide shows"
    assert tool.PROMETHEUS_UI_PREFIXES[0] == "/"
    guide = (ROOT / "docs" / "guides" / "compose.md").read_text()
    for page in ("alerts", "targets", "rules"):
        assert f"http://127.0.0.1:9090/{page}" in guide and f"http://127.0.0.1:9090/classic/{page}" in guide, page
