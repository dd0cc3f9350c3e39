"""Retention is visible: a consumer registered for retention (``unilog consumer register``) shows in ``unilog status``
(text and ``--json``), in ``unilog metrics`` and on the dashboard before it ever runs, with its lag (the whole
retained stream) and what it holds of the stream; once it runs and catches up it lags by nothing and holds nothing;
``unilog consumer unregister`` removes it from all three."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest
from cli import unilog
from handlers import record_applied

from unilog import Consumer, ConsumerConfig, Record, Settings, Streamer, emit
from unilog.harness.embedded import free_port
from unilog.ops.dashboard import History, create_app
from unilog.ops.exporter import SystemCollector

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def stage_and_publish(settings: Settings, n: int) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(n):
            emit(conn, action="create", object="ride", data={"n": i})
    with Streamer(settings) as streamer:
        streamer.drain()


def trim(settings: Settings) -> int:
    with Streamer(settings) as streamer:
        return streamer.trim(settings.stream)


def consumer(settings: Settings, name: str, batch_size: int = 1000) -> Consumer:
    def handler(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
        record_applied(name, conn, records)

    return Consumer(settings, ConsumerConfig(name=name, batch_size=batch_size), handler)


def status(settings: Settings) -> dict[str, Any]:
    result = unilog(settings, "status", "--json")
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def status_line(settings: Settings, name: str) -> str | None:
    """The consumer table's line of ``name`` in ``unilog status``'s text."""
    result = unilog(settings, "status")
    assert result.returncode == 0, result.stderr
    return next((line for line in result.stdout.splitlines() if line.split(" ", 1)[0] == name), None)


def row(consumers: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((c for c in consumers if c["name"] == name), None)


def scrape(settings: Settings) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """One scrape of the system exporter (what ``unilog metrics`` serves), in this process."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in SystemCollector(settings).collect()
        for s in family.samples
    }


def metric(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def dashboard_consumers(settings: Settings) -> list[dict[str, Any]]:
    """The consumers the dashboard's ``/api/status`` serves after one sample."""
    history = History(settings)
    history.sample()
    assert history.error is None, history.error
    reply = create_app(settings, history).test_client().get("/api/status")
    assert reply.status_code == 200
    consumers: list[dict[str, Any]] = reply.get_json()["status"]["consumers"]
    return consumers


def test_a_consumer_registered_before_its_first_run_is_seen_and_holds_the_whole_stream(
    settings: Settings, rds: Any
) -> None:
    s = settings.stream
    stage_and_publish(settings, 5)
    assert unilog(settings, "consumer", "register", "late").returncode == 0
    first_s = int(rds.xrange(s, count=1)[0][0].split("-")[0]) / 1000
    waited_before = time.time() - first_s
    late = row(status(settings)["consumers"], "late")
    waited_after = time.time() - first_s
    assert late is not None, "a registration without a checkpoint is listed"
    assert late["last_id"] is None and late["never_ran"] is True and late["registered_id"] == "0-0"
    assert late["lag_entries"] == 5 == rds.xlen(s), "it lags by the whole retained stream"
    assert waited_before - 0.001 <= late["lag_seconds"] <= waited_after + 0.001, "the oldest retained entry's age"
    assert late["holds_entries"] == 5 and late["holds_oldest"] is True
    line = status_line(settings, "late")
    assert line is not None and "registered, never ran" in line
    assert line.endswith("holds 5 entries (the oldest retained)")
    samples = scrape(settings)
    labels = {"stream": s, "consumer": "late"}
    assert metric(samples, "unilog_consumer_lag_entries", **labels, kind="checkpoint") == 5
    lag_seconds = metric(samples, "unilog_consumer_lag_seconds", **labels, kind="checkpoint")
    assert lag_seconds is not None and lag_seconds >= waited_before - 0.001
    assert metric(samples, "unilog_consumer_held_entries", **labels) == 5
    assert metric(samples, "unilog_consumer_registered_never_ran", **labels) == 1
    assert metric(samples, "unilog_consumer_registration_age_seconds", **labels) == lag_seconds
    seen = row(dashboard_consumers(settings), "late")
    assert seen is not None and seen["never_ran"] is True and seen["holds_entries"] == 5
    assert trim(settings) == 0 and rds.xlen(s) == 5, "retention keeps everything for it"


def test_once_it_runs_and_catches_up_it_lags_by_nothing_and_holds_nothing(settings: Settings, rds: Any) -> None:
    s = settings.stream
    stage_and_publish(settings, 5)
    assert unilog(settings, "consumer", "register", "late").returncode == 0
    assert trim(settings) == 0
    with consumer(settings, "late") as late_consumer:
        assert late_consumer.drain() == 5
    last_id = rds.xrevrange(s, count=1)[0][0]
    late = row(status(settings)["consumers"], "late")
    assert late is not None and late["never_ran"] is False and late["last_id"] == last_id
    assert late["registered_id"] == last_id and late["lag_entries"] == 0 and late["lag_seconds"] == 0
    assert late["holds_entries"] == 0 and late["holds_oldest"] is False
    line = status_line(settings, "late")
    assert line is not None and "never ran" not in line and line.endswith("holds nothing")
    samples = scrape(settings)
    labels = {"stream": s, "consumer": "late"}
    assert metric(samples, "unilog_consumer_lag_entries", **labels, kind="checkpoint") == 0
    assert metric(samples, "unilog_consumer_held_entries", **labels) == 0
    assert metric(samples, "unilog_consumer_registered_never_ran", **labels) == 0
    assert metric(samples, "unilog_consumer_registration_age_seconds", **labels) == 0
    seen = row(dashboard_consumers(settings), "late")
    assert seen is not None and seen["never_ran"] is False and seen["holds_entries"] == 0
    assert trim(settings) == 4 and rds.xlen(s) == 1, "retention trims up to its last entry"


def test_unregister_removes_it_from_status_metrics_and_the_dashboard(settings: Settings, rds: Any) -> None:
    s = settings.stream
    stage_and_publish(settings, 3)
    assert unilog(settings, "consumer", "register", "late").returncode == 0
    assert row(status(settings)["consumers"], "late") is not None
    assert unilog(settings, "consumer", "unregister", "late").returncode == 0
    assert row(status(settings)["consumers"], "late") is None
    assert status_line(settings, "late") is None
    assert not [key for key in scrape(settings) if ("consumer", "late") in key[1]], "no series of it"
    assert row(dashboard_consumers(settings), "late") is None
    assert rds.xlen(s) == 3


def test_each_registration_holds_the_entries_up_to_the_next_holder(settings: Settings, rds: Any) -> None:
    """Registrations and a group with pending entries: the lowest registration holds the oldest retained entries up
    to the next holder's position; a registration older than the first retained entry lags by every entry."""
    s = settings.stream
    stage_and_publish(settings, 10)
    with consumer(settings, "early", batch_size=4) as early:
        early.run_once(block_ms=-1)  # read 4 of 10
    ids = [eid for eid, _ in rds.xrange(s)]
    assert trim(settings) == 3 and rds.xlen(s) == 7, "kept from early's checkpoint entry on"
    assert unilog(settings, "consumer", "register", "late").returncode == 0  # at 0-0: before the first retained
    rds.xgroup_create(s, "g", id=ids[5])
    rds.xreadgroup("g", "w", {s: ">"}, count=2)  # the 7th and 8th entries pending: the group needs them on
    consumers = status(settings)["consumers"]
    late, early_row = row(consumers, "late"), row(consumers, "early")
    assert late is not None and early_row is not None
    assert late["lag_entries"] == 7 and late["never_ran"] is True, "every retained entry"
    assert (late["holds_entries"], late["holds_oldest"]) == (1, True), "the 4th: early has read it"
    assert (early_row["holds_entries"], early_row["holds_oldest"]) == (2, False), "the 5th and 6th: not the group's"
    assert early_row["lag_entries"] == 6 and early_row["registered_id"] == ids[3]
    assert (status_line(settings, "late") or "").endswith("holds 1 entry (the oldest retained)")
    assert (status_line(settings, "early") or "").endswith("holds 2 entries")
    samples = scrape(settings)
    assert metric(samples, "unilog_consumer_held_entries", stream=s, consumer="late") == 1
    assert metric(samples, "unilog_consumer_held_entries", stream=s, consumer="early") == 2


# -- the dashboard's page, drawn by a real browser -------------------------------------------------------------------


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
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                with urllib.request.urlopen(url + "api/status", timeout=2) as reply:
                    if json.load(reply)["status"]:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the dashboard did not come up"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def drawn(url: str) -> str:
    """The page's DOM once its script drew it (headless Chromium's ``--dump-dom``)."""
    argv = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000"]
    result = subprocess.run([*argv, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def sampled(url: str, name: str, timeout: float = 30) -> None:
    """Wait until the dashboard's last sample has consumer ``name`` (its ``/api/status``, which the page draws)."""
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(url + "api/status", timeout=5) as reply:
            if any(c["name"] == name for c in json.load(reply)["status"]["consumers"]):
                return
        assert time.monotonic() < deadline, f"the dashboard never sampled {name}"
        time.sleep(0.1)


def cells(dom: str, key: str) -> list[str] | None:
    """The text of the consumers table's row ``key``, cell by cell (the chart's cell is empty)."""
    found = re.search(rf'<tr data-consumer="{re.escape(key)}"([^>]*)>(.*?)</tr>', dom, re.S)
    if found is None:
        return None
    return [re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", found.group(2), re.S)]


@pytest.mark.skipif(CHROMIUM is None, reason="no headless browser: install Debian's chromium")
def test_the_dashboard_page_shows_a_registration_that_never_ran(settings: Settings, dashboard: str) -> None:
    stage_and_publish(settings, 4)
    assert unilog(settings, "consumer", "register", "late").returncode == 0
    sampled(dashboard, "late")  # the page draws the dashboard's last sample (one every 0.5 s)
    shown = cells(drawn(dashboard), f"{settings.stream}/late")
    assert shown is not None, "the registration has a row"
    assert shown[1] == "registered, never ran" and shown[2] == "4"
    assert shown[-1] == "holds 4 entries (the oldest retained)"
