"""Operations over many streams (issue 46 item 4): ``unilog status``, the exporter and the dashboard read every stream
in a few round trips and stay readable, with totals over all of them and only the streams most behind listed or
labelled; counts stay exact past the survey's page; the dashboard's history stays bounded as streams come and go.
How fast is the bench's ``status`` workload's business (``python -m bench --only status``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from typing import Any

import psycopg
import pytest
from cli import unilog
from prometheus_client.parser import text_string_to_metric_families

from unilog import Settings
from unilog.engine import RedisStreams, connect
from unilog.engine.survey import COUNT_PAGE
from unilog.harness.embedded import free_port
from unilog.ops.dashboard import History
from unilog.ops.dashboard.history import ALL
from unilog.ops.status import collect_status

STREAMS = 60
BEHIND = "tenant-07"  # the one stream whose consumer is far behind


def _fleet(settings: Settings, streams: int = STREAMS) -> None:
    """``streams`` streams ``tenant-NN`` of 3 entries, each with a checkpoint consumer that read one; ``BEHIND`` has
    ``COUNT_PAGE`` + 500 entries instead, from an hour ago, unread (a count longer than one survey page), and a group
    with one pending."""
    rds = connect(settings.redis_url)
    pipe = rds.pipeline(transaction=False)
    for name in (f"tenant-{i:02d}" for i in range(streams)):
        for _ in range(3 if name != BEHIND else 0):
            pipe.xadd(name, {"data": "{}", "action": "a", "object": "o"})
    hour_ago = int(time.time() * 1000) - 3_600_000  # BEHIND's unread entries have waited an hour: the most behind
    for seq in range(COUNT_PAGE + 500):
        pipe.xadd(BEHIND, {"data": "{}", "action": "a", "object": "o"}, id=f"{hour_ago}-{seq + 1}")
    pipe.execute()
    rds.xgroup_create(BEHIND, "billing", id="0")
    rds.xreadgroup("billing", "w", {BEHIND: ">"}, count=1)
    rows = []
    for i in range(streams):
        first = rds.xrange(f"tenant-{i:02d}", count=1)[0][0].decode()
        rows.append((f"reader-{i:02d}", f"tenant-{i:02d}", first))
    rds.close()
    with psycopg.connect(settings.conninfo, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO unilog_checkpoints (name, stream, last_id) VALUES (%s, %s, %s)", rows)


def test_the_survey_counts_every_stream_exactly_past_its_page(unilog_settings: Settings) -> None:
    _fleet(unilog_settings)
    report = collect_status(unilog_settings)
    rds = connect(unilog_settings.redis_url)
    streams = {s["name"]: s for s in report["streams"]}
    assert {f"tenant-{i:02d}" for i in range(STREAMS)} <= set(streams)
    for name, row in streams.items():
        assert row["length"] == rds.xlen(name), name
    for c in report["consumers"]:
        after = rds.xrange(c["stream"], min="(" + c["last_id"])
        assert c["lag_entries"] == len(after), c  # BEHIND's lag is past one page: counted on exactly
    behind = next(c for c in report["consumers"] if c["stream"] == BEHIND)
    assert behind["lag_entries"] == COUNT_PAGE + 499
    (group,) = streams[BEHIND]["groups"]
    assert (group["name"], group["pending"], group["lag_entries"]) == ("billing", 1, COUNT_PAGE + 499)
    totals = report["totals"]
    assert totals["streams"] == len(streams) and totals["consumers"] == STREAMS and totals["groups"] == 1
    assert totals["lag_entries"] == sum(c["lag_entries"] for c in report["consumers"]) + group["lag_entries"]
    rds.close()


def test_counts_the_survey_answers_from_a_streams_ends_are_exact(unilog_settings: Settings) -> None:
    """The survey answers a count from the stream's ends where they suffice (an id before or at the first entry, at or
    past the last, an empty stream) and reads the range otherwise: every answer is what XRANGE counts."""
    rds = connect(unilog_settings.redis_url)
    ids = [rds.xadd("ends", {"n": str(i)}, id=f"{1_000 + i}-{i}").decode() for i in range(1, 6)]
    rds.xadd("emptied", {"n": "0"})
    rds.xtrim("emptied", maxlen=0)
    asked = [
        "0-0",
        "999-9",
        ids[0],
        "1002-1",
        ids[2],
        ids[-1],
        "1005-6",
        "99999999999999-0",
        "1004-18446744073709551615",
    ]
    api = RedisStreams(rds)
    surveyed = api.survey(["ends", "emptied", "missing"], {"ends": asked, "emptied": ["0-0"], "missing": ["0-0"]})
    for after_id in asked:
        entries = rds.xrange("ends", min="(" + after_id)
        expected = (len(entries), entries[0][0].decode() if entries else None)
        counted = surveyed["ends"].after[after_id]
        assert (counted.count, counted.first_id) == expected, after_id
    assert (surveyed["ends"].info.first_id, surveyed["ends"].info.last_id) == (ids[0], ids[-1])
    assert surveyed["ends"].info.length == 5
    for name in ("emptied", "missing"):
        assert surveyed[name].after["0-0"].count == 0 and surveyed[name].info.last_id is None, name
    rds.close()


def test_status_shows_totals_and_the_streams_most_behind(unilog_settings: Settings) -> None:
    _fleet(unilog_settings)
    text = unilog(unilog_settings, "status")
    assert text.returncode == 0, text.stderr
    listed = {line.split()[0] for line in text.stdout.splitlines() if line.startswith("tenant-")}
    assert BEHIND in listed and len(listed) == 20, text.stdout  # the default: the 20 most behind
    assert f"streams: {STREAMS + 1} (" in text.stdout and "most behind shown (--all: every one)" in text.stdout
    every = unilog(unilog_settings, "status", "--all")
    assert len({ln.split()[0] for ln in every.stdout.splitlines() if ln.startswith("tenant-")}) == STREAMS
    report = json.loads(unilog(unilog_settings, "status", "--json").stdout)
    assert len(report["streams"]) == STREAMS + 1 and report["omitted"] == {"streams": 0, "consumers": 0}
    few = json.loads(unilog(unilog_settings, "status", "--json", "--top", "3").stdout)
    assert few["streams"][0]["name"] == BEHIND and len(few["streams"]) == 3
    assert few["totals"]["streams"] == STREAMS + 1 and few["omitted"]["streams"] == STREAMS - 2
    refused = unilog(unilog_settings, "status", "--top", "0")
    assert refused.returncode == 2 and "must be at least 1" in refused.stderr


def _scrape(port: int) -> list[Any]:
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
                text = reply.read().decode()
            if "unilog_system_up 1" in text:
                return list(text_string_to_metric_families(text))
        except OSError:
            pass
        assert time.monotonic() < deadline, "the exporter never answered with the system up"
        time.sleep(0.2)


def test_the_exporter_labels_only_the_streams_most_behind(unilog_settings: Settings) -> None:
    _fleet(unilog_settings)
    port = free_port()
    argv = [sys.executable, "-m", "unilog", "metrics", "--port", str(port), "--max-streams", "5"]
    argv += ["--database-url", unilog_settings.database_url, "--redis-url", unilog_settings.redis_url]
    exporter = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        families = {f.name: f for f in _scrape(port)}
    finally:
        exporter.terminate()
        exporter.wait(30)
    labelled = {s.labels["stream"] for f in families.values() for s in f.samples if "stream" in s.labels}
    assert BEHIND in labelled and len(labelled) == 5, labelled
    totals = {f.name: f.samples[0].value for f in families.values() if f.samples and not f.samples[0].labels}
    assert totals["unilog_streams"] == STREAMS + 1
    lags = families["unilog_consumer_lag_entries"].samples
    assert max(s.value for s in lags) == COUNT_PAGE + 499  # the worst lag, which alerts watch, is labelled
    omitted = {s.labels["kind"]: s.value for s in families["unilog_series_omitted"].samples}
    assert omitted == {"streams": STREAMS + 1 - 5, "consumers": STREAMS - 5}


def test_the_dashboard_history_is_bounded_as_streams_come_and_go(unilog_settings: Settings) -> None:
    _fleet(unilog_settings)
    history = History(unilog_settings, interval=0.1, seconds=1.0, top=4)
    history.sample()
    history.sample()
    data = history.snapshot()
    assert len(data["status"]["streams"]) == 4 and data["status"]["totals"]["streams"] == STREAMS + 1
    assert ALL in data["lag"] and ALL in data["rates"]["in"] and ALL in data["rates"]["out"]
    keys = set(data["lag"]) - {ALL}
    assert 0 < len(keys) <= 5 and any(k.startswith(BEHIND) for k in keys), keys  # 4 streams' consumers and group
    with psycopg.connect(unilog_settings.conninfo, autocommit=True) as conn:
        conn.execute("DELETE FROM unilog_checkpoints")  # every consumer gone
    time.sleep(1.2)  # past the window: their series have no point left in it
    history.sample()
    data = history.snapshot()
    assert set(data["lag"]) - {ALL} <= {f"{BEHIND}/billing (group)"}, data["lag"].keys()


@pytest.mark.parametrize("flag", ["--top", "--max-streams"])
def test_bounds_refuse_bad_numbers_in_one_line(unilog_settings: Settings, flag: str) -> None:
    command = ["status", flag, "-1"] if flag == "--top" else ["metrics", flag, "-1"]
    refused = unilog(unilog_settings, *command)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr and "-1" in refused.stderr


def test_publishers_of_many_streams_are_each_streams_lock_holders(unilog_settings: Settings) -> None:
    """The publishers of many streams, read in one statement, are what each stream's own lookup finds: a bucket held
    exclusively, a stream's own lock, both by different sessions, and none."""
    from unilog import store

    streams = [f"pub-{i}" for i in range(40)]
    bucket_of = {s: store.stream_bucket(s) for s in streams}
    with (
        psycopg.connect(unilog_settings.conninfo, autocommit=True) as one,
        psycopg.connect(unilog_settings.conninfo, autocommit=True) as two,
        psycopg.connect(unilog_settings.conninfo, autocommit=True) as reader,
    ):
        store.try_bucket_locks(one, [bucket_of["pub-0"], bucket_of["pub-1"]])
        store.try_bucket_locks(two, [bucket_of["pub-2"]], shared=True)  # shared: a reader of it, not a publisher
        assert store.try_stream_lock(two, "pub-1") and store.try_stream_lock(two, "pub-3")
        many = store.stream_lock_holders_many(reader, streams)
        assert many == {s: store.stream_lock_holders(reader, s) for s in streams}
        assert many["pub-1"] == 2 and many["pub-0"] >= 1 and many["pub-3"] >= 1
