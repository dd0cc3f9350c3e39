"""The dashboard in a real headless browser (Debian's chromium with its chromedriver, through Selenium): the page
shows a consumer's lag and sees it fall after the consumer catches up; a dead letter is replayed from the page and
applied once. A screenshot is kept with the test's artifacts (test-artifacts/dashboard.png)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from unilog import Consumer, ConsumerConfig, Record, Settings, Streamer, emit
from unilog.harness.embedded import free_port

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
DRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None,
    reason="no headless browser: install Debian's chromium and chromium-driver (.ci/run does where it may)",
)


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = check()
        except Exception:  # the page is mid-redraw: an element went stale
            found = None
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def dashboard(settings: Settings) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "DATABASE_URL": settings.database_url, "REDIS_URL": settings.redis_url}
    proc = subprocess.Popen(
        [sys.executable, "-m", "unilog", "--log-json", "dashboard", "--port", str(port), "--interval", "0.5"],
        env={**env, "UNILOG_STREAM": settings.stream},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/"

    def up() -> bool:
        try:
            return urllib.request.urlopen(url, timeout=2).status == 200
        except OSError:
            return False

    try:
        wait_for(up, 30, "the dashboard")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """One browser for the module: starting Chromium and its driver is seconds of CPU a test (issue 45)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(DRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(chromium: Any) -> Iterator[Any]:
    """The module's browser, as a fresh one would be for each test: a blank page (the last test's page polled a
    dashboard that is gone), no cookies, no storage."""
    yield chromium
    chromium.get("about:blank")
    chromium.delete_all_cookies()


class Poisoned:
    def __init__(self, bad: set[int]) -> None:
        self.bad = bad

    def __call__(self, conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
        for r in records:
            if r.data["n"] in self.bad:
                raise ValueError(f"cannot apply {r.data['n']}")
            conn.execute(
                "INSERT INTO applied (consumer, producer, entry_id, n) VALUES ('late', '', %s, %s)", (r.id, r.data["n"])
            )


def test_the_page_shows_lag_falling_and_replays_a_dead_letter_once(
    settings: Settings, pg: Any, dashboard: str, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    with psycopg.connect(settings.conninfo) as conn:
        for n in range(20):
            emit(conn, action="create", object="ride", data={"n": n})
    with Streamer(settings) as streamer:
        streamer.drain()
    pg.execute("INSERT INTO unilog_checkpoints (name, stream) VALUES ('late', %s)", (settings.stream,))
    browser.get(dashboard)
    key = f"{settings.stream}/late"

    def lag() -> str:
        return str(browser.find_element(By.CSS_SELECTOR, f'tr[data-consumer="{key}"] .lag-entries').text)

    assert wait_for(lambda: lag() == "20", 20, "the lag of 20 entries")
    config = ConsumerConfig(name="late", max_attempts=1, on_poison="dead-letter")
    handler = Poisoned({5})
    with Consumer(settings, config, handler) as consumer:
        consumer.drain()
    assert wait_for(lambda: lag() == "0", 20, "the lag to fall to 0")
    replay = wait_for(lambda: browser.find_element(By.CSS_SELECTOR, "#letters tbody tr button.replay"), 20, "a letter")
    ARTIFACTS.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "dashboard.png"))
    handler.bad.clear()  # the fix, then the replay from the page
    replay.click()
    browser.switch_to.alert.accept()
    wait_for(lambda: not browser.find_elements(By.CSS_SELECTOR, "#letters tbody tr"), 20, "the letter to go")
    with Consumer(settings, config, handler) as consumer:
        consumer.drain()
    applied = [r[0] for r in pg.execute("SELECT n FROM applied WHERE consumer = 'late' ORDER BY n")]
    assert applied == list(range(20)), "the replayed record once, every other once"


def test_actions_need_the_pages_token_and_read_only_refuses_them(settings: Settings, dashboard: str) -> None:
    request = urllib.request.Request(f"{dashboard}api/dlq/{settings.stream}/1-0/drop", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 403
    page = urllib.request.urlopen(dashboard, timeout=5).read().decode()
    assert settings.redis_url not in page and settings.database_url not in page, "no secrets on the page"


def test_the_page_shows_each_streams_record_types_and_versions(
    settings: Settings, pg: Any, dashboard: str, browser: Any
) -> None:
    """The registry's types (unilog_schemas), by stream: the default stream's under its name, a retired version
    marked."""
    from selenium.webdriver.common.by import By

    from unilog.store import schemas

    rows = [("RideCreated", 1, "rides", "created"), ("RideCreated", 2, "rides", "created"), ("Paid", 1, "", "paid")]
    with psycopg.connect(settings.conninfo) as conn:
        for name, version, stream, action in rows:
            schema = {"type": "object", "properties": {"v": {"const": version}}}
            schemas.register(
                conn, schemas.SchemaRow(name, version, stream, "ride", action, schema, f"sha256:{version}")
            )
        schemas.retire(conn, "RideCreated", 1)
    browser.get(dashboard)

    def versions(key: str) -> str:
        return str(browser.find_element(By.CSS_SELECTOR, f'#types tr[data-type="{key}"] .versions').text)

    assert wait_for(lambda: versions("rides/RideCreated") == "v1 (retired), v2", 20, "RideCreated's versions")
    assert versions(f"{settings.stream}/Paid") == "v1"


def test_the_charts_draw_records_per_second_in_and_out_and_lag_with_axes(
    settings: Settings, pg: Any, dashboard: str, browser: Any
) -> None:
    """Records added to the stream show as its rate in, a consumer catching up as its rate out and its lag falling,
    on charts of the last hour with their axes (minutes back to now; records/s and entries from 0 up), scales and
    legends. The charts' screenshot is kept (test-artifacts/dashboard-charts.png; docs/guides/img/dashboard.png is
    one)."""
    from selenium.webdriver.common.by import By

    def emit_and_stream(count: int, start: int) -> None:
        with psycopg.connect(settings.conninfo) as conn:
            for n in range(start, start + count):
                emit(conn, action="create", object="ride", data={"n": n})
        with Streamer(settings) as streamer:
            streamer.drain()

    # read in one script, so a chart redrawn between two WebDriver calls (every sample) is never half-read
    def peak(chart: str, series: str) -> float:
        selector = f'#{chart} polyline[data-series="{series}"]'
        found = browser.execute_script(
            "const e = document.querySelector(arguments[0]); return e ? e.getAttribute('data-max') : null", selector
        )
        return -1.0 if found is None else float(found)

    def texts(selector: str) -> list[str]:
        script = "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.textContent.trim())"
        return list(browser.execute_script(script, selector))

    emit_and_stream(5, 0)  # the stream exists: entries added after its last id are counted from the next sample on
    pg.execute("INSERT INTO unilog_checkpoints (name, stream) VALUES ('late', %s)", (settings.stream,))
    browser.get(dashboard)
    key = f"{settings.stream}/late"
    wait_for(lambda: peak("chart-lag", key) == 5, 20, "the lag chart to show 5 entries")
    emit_and_stream(30, 5)
    assert wait_for(lambda: peak("chart-rates", f"in: {settings.stream}") > 0, 20, "records per second in")
    assert wait_for(lambda: peak("chart-lag", key) == 35, 20, "the lag chart to show 35 entries")
    with Consumer(settings, ConsumerConfig(name="late"), Poisoned(set())) as consumer:
        consumer.drain()
    assert wait_for(lambda: peak("chart-rates", f"out: {key}") > 0, 20, "records per second out")
    for chart, unit in (("chart-rates", "records/s"), ("chart-lag", "lag (entries)")):
        labels = texts(f"#{chart} text")
        assert unit in labels and "time" in labels, labels
        assert texts(f"#{chart} text.xtick") == [
            "-60 min",
            "-45 min",
            "-30 min",
            "-15 min",
            "now",
        ]
        scale = [float(text) for text in texts(f"#{chart} text.ytick")]
        assert scale[0] == 0 and scale == sorted(scale) and len(set(scale)) == 5, scale
        assert scale[-1] >= max(
            peak(chart, s.get_attribute("data-series"))
            for s in browser.find_elements(By.CSS_SELECTOR, f"#{chart} polyline")
        ), scale
    assert peak("chart-lag", key) == 35 and f"{key}" in [
        e.text for e in browser.find_elements(By.CSS_SELECTOR, "#chart-lag text.legend")
    ]
    ARTIFACTS.mkdir(exist_ok=True)
    charts = browser.find_element(By.CSS_SELECTOR, ".charts")
    browser.execute_script("arguments[0].scrollIntoView()", charts)
    assert charts.screenshot(str(ARTIFACTS / "dashboard-charts.png"))
