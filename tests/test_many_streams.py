"""Issue 46: a backlog spread over thousands of streams drains without a lock and a log line per stream, a pass
stays within its deadline, a deadline that fires is one line (and a named exit code in ``--once``), and the running
streamer makes progress past a stream that is stuck."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from dropped import assert_sessions_end, dropped, refcounting_only
from structlog.testing import capture_logs

from unilog import Settings, Streamer, StreamerConfig, emit_many, store
from unilog.cli.common import ExitCode
from unilog.errors import InjectedCrash, PublishError
from unilog.faults import Faults
from unilog.harness.chaos.report import recoveries
from unilog.harness.supervisor import Fleet
from unilog.runtime import Hook
from unilog.stream.capture_spread import DEPTH
from unilog.stream.publisher import Publisher
from unilog.stream.spread_parts import PIECES
from unilog.wire import hwm_key

STREAMS = 3000
STREAM_BUCKETS = 64  # unilog.store.STREAM_BUCKETS: the most ownership locks a streamer takes, whatever the streams


@pytest.fixture
def one_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass claims its sources in one share, however many (for a test of a batch's pieces and claims, which shares
    would cut differently; the shares have tests of their own)."""
    from unilog.stream import capture_spread

    monkeypatch.setattr(capture_spread, "SHARED_FROM", 1 << 30)


def _stage(settings: Settings, names: list[str], per_stream: int = 1) -> int:
    """``per_stream`` records on each of ``names``, staged with ``emit_many`` in transactions of 1,000, spread
    round-robin (each stream's records carry ascending ``i``)."""
    records = [
        {"action": "a", "object": "o", "data": {"i": i}, "stream": name, "key": f"{name}-{i}"}
        for i in range(per_stream)
        for name in names
    ]
    with psycopg.connect(settings.conninfo) as conn:
        for lo in range(0, len(records), 1000):
            emit_many(conn, records[lo : lo + 1000])
            conn.commit()
    return len(records)


def _command(settings: Settings, argv: list[str], pg_timeout: float | None) -> tuple[list[str], dict[str, str]]:
    """``unilog *argv`` and its environment; with ``pg_timeout``, the streamer's deadline set where the command builds
    its configuration (the same on any version, with or without --pg-timeout)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNILOG_")}
    env.update(DATABASE_URL=settings.database_url, REDIS_URL=settings.redis_url)
    if pg_timeout is None:
        return [sys.executable, "-m", "unilog", *argv], env
    driver = (
        "import sys, unilog.cli.streamer as c\n"
        "class Config(c.StreamerConfig):\n"
        f"    def __init__(self, **kw): super().__init__(**{{**kw, 'pg_timeout': {pg_timeout}}})\n"
        "c.StreamerConfig = Config\n"
        f"from unilog.cli import main; sys.exit(main({argv!r}))"
    )
    return [sys.executable, "-c", driver], env


def _once(settings: Settings, *args: str, pg_timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """``unilog --log-json streamer --once`` in a process of its own."""
    command, env = _command(settings, ["--log-json", "streamer", "--once", *args], pg_timeout)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def _assert_each_once_in_order(rds: redis.Redis, names: list[str], per_stream: int) -> None:
    pipe = rds.pipeline(transaction=False)
    for name in names:
        pipe.xrange(name)
    for name, entries in zip(names, pipe.execute(), strict=True):
        seqs = [int(f["seq"]) for _, f in entries]
        values = [json.loads(f["data"])["i"] for _, f in entries]
        assert seqs == list(range(1, per_stream + 1)), name
        assert values == list(range(per_stream)), name


@pytest.mark.parametrize("mode", ["table", "wal"])
def test_thousands_of_streams_drain_in_once_without_a_lock_per_stream(
    settings: Settings, pg: Any, rds: Any, mode: str, request: pytest.FixtureRequest
) -> None:
    if mode == "wal":
        request.getfixturevalue("wal")
    names = [f"s-{k:05d}" for k in range(STREAMS)]
    total = _stage(settings, names, per_stream=2)
    done = _once(settings)
    lines = done.stdout.splitlines() + done.stderr.splitlines()
    assert done.returncode == ExitCode.OK, lines[-5:]
    assert f"streamed {total} records" in done.stdout
    assert not any("Traceback" in line or "deadline" in line for line in lines)
    # ownership is by bucket: at most one line per round of buckets taken, never one per stream
    ownership = [line for line in lines if "lock acquired" in line or "buckets acquired" in line]
    assert len(ownership) <= STREAM_BUCKETS, len(ownership)
    # one batch (one claim, one send, one delete) per batch_size records, whatever the number of streams in it
    batches = [line for line in lines if '"batch streamed"' in line]
    assert len(batches) <= total // StreamerConfig.batch_size + 2, len(batches)
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0] == 0
    _assert_each_once_in_order(rds, names, 2)


def _lock_rows_of(settings: Settings, stream: str) -> psycopg.Connection[Any]:
    """A session holding the staged rows of ``stream`` (``FOR UPDATE``): the streamer's delete of them waits."""
    holder = psycopg.connect(settings.conninfo)
    holder.execute("SELECT id FROM staged_log_records WHERE stream = %s FOR UPDATE", (stream,)).fetchall()
    return holder


def test_a_deadline_in_once_is_one_line_and_the_unreachable_code(settings: Settings, pg: Any, rds: Any) -> None:
    """Another session holds one stream's staged rows: the other stream is published all the same, then the stuck
    delete outlives its deadline, and ``--once`` says so in one line naming the call, with exit code 4."""
    _stage(settings, ["a-stuck", "b-fine"], per_stream=3)
    holder = _lock_rows_of(settings, "a-stuck")
    try:
        done = _once(settings, pg_timeout=1.0)
    finally:
        holder.close()
    assert rds.xlen("b-fine") == 3  # the stuck stream held no other back
    lines = done.stdout.splitlines() + done.stderr.splitlines()
    assert done.returncode == ExitCode.UNREACHABLE, lines[-5:]
    assert not any("Traceback" in line for line in lines), done.stderr
    said = [line for line in lines if "deadline" in line]
    assert len(said) == 1, said
    assert said[0].startswith("unilog: error: ") and "delete_claimed" in said[0], said


class _Failures(Hook):
    """The failures the loop settled (a fired deadline among them), as one line each."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_failure(self, worker: Any, exc: BaseException, verdict: Any, delay: float) -> None:
        self.seen.append(f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}")


def test_the_running_streamer_gets_past_a_stuck_stream(settings: Settings, pg: Any, rds: Any) -> None:
    """Another session holds one stream's staged rows, so its delete keeps waiting: the other streams, even those of
    its bucket, are all published meanwhile with no deadline fired (a batch across streams lets the held one wait
    alone, within a share of the deadline) instead of a deadline a pass; left alone, the held one outlives the
    deadline and is retried; once it is freed, everything is there once."""
    names = [f"s-{k:04d}" for k in range(300)]
    _stage(settings, ["a-stuck", *names])
    holder = _lock_rows_of(settings, "a-stuck")
    config = StreamerConfig(pg_timeout=3.0, max_backoff=0.2, poll_interval=0.1)
    stop = threading.Event()
    failures = _Failures()
    with Streamer(settings, config, name="runner") as streamer:
        streamer.hooks.add(failures)
        runner = threading.Thread(target=streamer.run, args=(stop,))
        runner.start()
        try:
            deadline = time.monotonic() + 90
            while sum(rds.xlen(n) for n in names) < len(names):
                assert not failures.seen, failures.seen[:2]  # nothing broke while the others waited
                assert time.monotonic() < deadline, f"{sum(rds.xlen(n) for n in names)} of {len(names)} published"
                time.sleep(0.05)
        finally:
            holder.close()
            time.sleep(0.5)
            stop.set()
            runner.join(timeout=60)
    with Streamer(settings, StreamerConfig(pg_timeout=10.0)) as streamer:
        streamer.drain(timeout=60)
    _assert_each_once_in_order(rds, ["a-stuck", *names], 1)


def test_a_held_claim_whose_rows_another_session_deleted_leaves_its_positions_taken(
    settings: Settings, pg: Any, rds: Any
) -> None:
    """A batch across streams was sent, then its delete found one stream's rows held by another session, which kept
    that stream's claim (sent, positions 1-2 in Redis, not saved). That session deleted the rows itself (a clean-up
    job, not a streamer: no positions saved). The next pass drops the claim, and the stream's next records must take
    positions 3 and on: reused, Redis skipped them as already present (lost)."""
    _stage(settings, ["held", "free"], per_stream=2)
    holder = _lock_rows_of(settings, "held")
    with Streamer(settings, StreamerConfig(max_backoff=0.2), name="runner") as streamer:
        streamer.run_once()  # both streams sent; "held" kept its claim, its delete waited on the rows
        assert rds.xlen("held") == 2 and rds.xlen("free") == 2
        assert pg.execute("SELECT count(*) FROM unilog_claims").fetchone()[0] == 1
        holder.execute("DELETE FROM staged_log_records WHERE stream = 'held'")
        holder.commit()
        _stage(settings, ["held"], per_stream=2)
        streamer.drain(timeout=30)
    holder.close()
    seqs = [int(f["seq"]) for _id, f in rds.xrange("held")]
    assert seqs == [1, 2, 3, 4], "the records staged after the dropped claim are published, after its positions"
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0] == 0


def _advisory_locks(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """Advisory locks each streamer's session holds now, by application name."""
    rows = conn.execute(
        """
        SELECT a.application_name, count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
        WHERE l.locktype = 'advisory' AND l.granted AND a.application_name IN ('unilog-first', 'unilog-second')
        GROUP BY 1
        """
    ).fetchall()
    return {name: int(n) for name, n in rows}


def test_two_streamers_share_the_buckets_one_publisher_per_stream(settings: Settings, pg: Any, rds: Any) -> None:
    """Two streamers started together on a backlog over many streams: each stream is owned by at most one of them
    at any moment, neither holds more than a lock per bucket (not one per stream), and every record arrives once, in
    order."""
    names = [f"s-{k:04d}" for k in range(600)]
    _stage(settings, names, per_stream=2)
    first, second = Streamer(settings, name="first"), Streamer(settings, name="second")
    overlaps: list[set[str]] = []
    most: dict[str, int] = {}
    stop = threading.Event()

    def watch() -> None:
        with psycopg.connect(settings.conninfo, autocommit=True) as conn:
            while not stop.is_set():
                both = set(first.publisher.owned) & set(second.publisher.owned)
                if both:
                    overlaps.append(both)
                for name, n in _advisory_locks(conn).items():
                    most[name] = max(most.get(name, 0), n)
                time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        threads = [threading.Thread(target=s.drain, kwargs={"timeout": 120}) for s in (first, second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
    finally:
        stop.set()
        watcher.join()
        first.close()
        second.close()
    assert not overlaps, sorted(overlaps[0])[:3]
    assert most and max(most.values()) <= STREAM_BUCKETS + 2, most  # + the capture mode's and listener's, if any
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0] == 0
    _assert_each_once_in_order(rds, names, 2)


def test_a_streamer_of_listed_streams_does_not_stall_the_other_streams_of_its_buckets(
    settings: Settings, pg: Any, rds: Any
) -> None:
    """A streamer limited to listed streams (``--streams``) holds their buckets shared. A streamer of every stream
    that finds a bucket so held takes it shared too, and the own lock of each other stream in it: it publishes them
    (before, refused the bucket, it published none of them for as long as the listed one ran), never the listed
    streams the other holds."""
    names = [f"s-{k:03d}" for k in range(200)]
    listed_name = names[0]
    _stage(settings, names, per_stream=2)
    bucket = zlib.crc32(listed_name.encode()) % STREAM_BUCKETS
    same_bucket = [n for n in names[1:] if zlib.crc32(n.encode()) % STREAM_BUCKETS == bucket]
    assert same_bucket, "the test needs another stream in the listed stream's bucket"
    listed = Streamer(settings, StreamerConfig(streams=(listed_name,)), name="listed")
    every = Streamer(settings, name="every")
    try:
        assert listed.run_once().published == 2  # holds its bucket shared, and its stream's lock
        assert every.drain(timeout=60) == 2 * (len(names) - 1), "every stream but the listed one"
        assert listed_name not in every.publisher.owned
        assert set(same_bucket) <= every.publisher.owned
        _stage(settings, [listed_name, same_bucket[0]], per_stream=1)
        assert listed.run_once().published == 1, "the listed stream stays the listed streamer's"
        assert every.drain(timeout=60) == 1
    finally:
        listed.close()
        every.close()
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0] == 0


@pytest.mark.usefixtures("one_share")
def test_a_crash_after_a_batch_across_streams_was_sent_re_sends_it_once(settings: Settings, pg: Any, rds: Any) -> None:
    """One claim covers the batch's streams (a claim saved per stream, all in one statement, before anything is
    sent); a crash between the send and the delete leaves them all saved, and the next streamer re-sends them under
    the same positions, which Redis drops as already there: every record once, in order. The batch claims DEPTH
    batches' worth of records and is sent in script calls of a batch's worth: the crash follows all of them."""
    names = [f"s-{k:04d}" for k in range(400)]
    total = _stage(settings, names, per_stream=3)
    faults = Faults(script={"streamer.crash_after_publish": [True]})
    batch_size = 1000 // DEPTH
    crashing = Streamer(settings, StreamerConfig(batch_size=batch_size), faults=faults, name="crashing")
    with crashing, pytest.raises(InjectedCrash):
        crashing.run_once()
    claims = pg.execute("SELECT count(*), sum(records) FROM unilog_claims").fetchone()
    sent = batch_size * DEPTH  # the oldest of the 1,200 records, over all 400 streams
    assert tuple(claims) == (400, sent), claims
    assert sum(rds.xlen(n) for n in names) == sent  # sent, not deleted
    with Streamer(settings, name="successor") as streamer:
        assert streamer.drain(timeout=120) == total
    assert pg.execute("SELECT count(*) FROM unilog_claims").fetchone()[0] == 0
    _assert_each_once_in_order(rds, names, 3)


def test_the_chaos_report_counts_the_deadlines_that_fired(settings: Settings, pg: Any, tmp_path: Path) -> None:
    """A running streamer whose delete keeps outliving its deadline: the report of a chaos run (which reads the
    processes' logs) counts those breaks, from the failure the loop logs for each."""
    _stage(settings, ["a-stuck"], per_stream=2)
    holder = _lock_rows_of(settings, "a-stuck")
    log = tmp_path / "streamer.log"
    command, env = _command(settings, ["--log-json", "streamer"], pg_timeout=1.0)
    try:
        with log.open("w") as out:
            proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while log.read_text().count("exceeded its deadline") < 2:
                assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-3000:]
                time.sleep(0.2)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    finally:
        holder.close()
    found = recoveries(Fleet(tmp_path), tmp_path)
    assert found.get("deadline_breaks", 0) >= 2, found
    assert found["reconnects"] >= found["deadline_breaks"], found  # each break is a reconnect too


def test_a_row_naming_an_invalid_stream_stays_staged_and_names_no_other(unilog_settings: Settings) -> None:
    """A row staged by raw SQL under ``'a b'`` (not a stream name) must not be published as ``a`` or ``b``, nor
    stop them: batches across streams pass source names space-separated. It stays staged, named in one log line."""
    _stage(unilog_settings, ["a", "b"], per_stream=2)
    with psycopg.connect(unilog_settings.conninfo, autocommit=True) as conn:
        conn.execute("INSERT INTO staged_log_records (action, object, data, stream) VALUES ('a', 'o', '{}', 'a b')")
    argv, env = _command(unilog_settings, ["--log-json", "streamer", "--once"], None)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == ExitCode.OK, done.stderr
    rds = redis.Redis.from_url(unilog_settings.redis_url)
    assert (rds.xlen("a"), rds.xlen("b"), rds.exists("a b")) == (2, 2, 0)
    with psycopg.connect(unilog_settings.conninfo) as conn:
        left = conn.execute("SELECT stream FROM staged_log_records").fetchall()
    assert left == [("a b",)], "kept, not lost nor published elsewhere"
    said = [json.loads(ln) for ln in (done.stdout + done.stderr).splitlines() if "invalid stream" in ln]
    assert len(said) == 1 and said[0]["stream"] == "a b", done.stderr
    rds.close()


@pytest.mark.usefixtures("one_share")
def test_a_batch_refused_in_its_last_script_call_is_re_sent_once(settings: Settings, pg: Any, rds: Any) -> None:
    """A batch across streams goes in several script calls; Redis refusing one (here: a stream whose mark is of a
    later epoch) fails the pass after the calls before it were appended. Nothing is deleted; once the refusal is
    gone, the whole batch is re-sent under the same positions and the entries already there are skipped: every record
    once, in order, on every stream."""
    names = [f"s-{k:03d}" for k in range(40)]
    total = _stage(settings, names, per_stream=2)
    refused = names[-1]  # the last stream of the batch's first claim: its records go in the last call
    rds.xadd(refused, {"other": "entry"})  # a mark counts only on a stream that exists
    with Streamer(settings, StreamerConfig(batch_size=10), name="refused") as streamer:
        streamer.connect()
        producer = streamer.identity().producer_id
        rds.hset(hwm_key(refused), producer, "99:1")
        with pytest.raises(PublishError, match="UNILOG_STALE_EPOCH"):
            streamer.run_once()
        assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0] == total, "nothing deleted"
        appended_before = sum(rds.xlen(n) for n in names[:-1])
        assert 0 < appended_before < total, "the calls before the refused one were appended"
        rds.hdel(hwm_key(refused), producer)
        streamer.recover()
        assert streamer.drain(timeout=120) == total
    for name in names:
        entries = [f for _id, f in rds.xrange(name) if "seq" in f]
        assert [int(f["seq"]) for f in entries] == [1, 2], name
        assert [json.loads(f["data"])["i"] for f in entries] == [0, 1], name
    assert pg.execute("SELECT count(*) FROM unilog_claims").fetchone()[0] == 0


@pytest.mark.usefixtures("one_share")
def test_a_batch_across_streams_claims_at_most_a_batch_of_each(settings: Settings, pg: Any, rds: Any) -> None:
    """A batch across streams claims at most ``batch_size`` records of each stream (its lowest: its part goes in one
    script call, which this bounds); the rest of it follows in order. Over few streams (``batch_size`` of each fit in
    the batch), a stream whose records hold the lowest ids does not hold the others back: each gives its lowest. A
    claim that took the lowest DEPTH batches' worth of ids first took one record of each other stream here."""
    big = DEPTH * 5 - 10  # the lowest ids: a claim by ids alone would take all of it
    _stage(settings, ["big"], per_stream=big)
    total = big + _stage(settings, [f"s-{k}" for k in range(10)], per_stream=3)
    faults = Faults(script={"streamer.crash_after_claim": [True]})
    with Streamer(settings, StreamerConfig(batch_size=5), faults=faults) as crashing, pytest.raises(InjectedCrash):
        crashing.run_once()
    claimed = dict(pg.execute("SELECT source, records FROM unilog_claims").fetchall())
    assert claimed == {"big": 5} | {f"s-{k}": 3 for k in range(10)}, claimed
    with Streamer(settings, StreamerConfig(batch_size=5), name="successor") as streamer:
        assert streamer.drain(timeout=60) == total
    assert [json.loads(f["data"])["i"] for _id, f in rds.xrange("big")] == list(range(big))


def test_few_streams_go_as_one_streams_batches_each_once_in_order(
    settings: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog over fewer than SPREAD_FROM streams (``orders`` and ``payments`` side by side) goes as each stream's
    own batches, claimed by its own cursor while Redis appends the batch before: no claim across them, which cost
    twice a stream's claim a record with nothing overlapping it (0.5x one stream's rate over two streams). Every
    record once, in order."""
    calls: list[list[str]] = []
    claim_across = store.claim_across

    def across(conn: Any, sources: list[str], *args: Any, **kw: Any) -> Any:
        calls.append(sources)
        return claim_across(conn, sources, *args, **kw)

    monkeypatch.setattr(store, "claim_across", across)
    names = ["orders", "payments"]
    total = _stage(settings, names, per_stream=60)
    with Streamer(settings, StreamerConfig(batch_size=10), name="few") as streamer:
        assert streamer.drain(timeout=60) == total
    assert calls == [], "no claim across the streams"
    _assert_each_once_in_order(rds, names, 60)


def test_a_few_streams_pass_counts_what_it_published_before_a_batch_met_held_rows(
    settings: Settings, pg: Any, rds: Any
) -> None:
    """Over few streams, one stream's third batch meets rows another session holds: its first two batches were
    published (deleted), the held one's claim stays saved, and the other stream goes on. The pass counts all it
    published (a drain adds it up); released, the held records follow, each once, in order."""
    total = _stage(settings, ["a-long"], per_stream=40) + _stage(settings, ["b-short"], per_stream=5)
    holder = psycopg.connect(settings.conninfo)
    try:
        holder.execute(
            "SELECT id FROM staged_log_records WHERE id IN (SELECT id FROM staged_log_records WHERE stream = 'a-long' "
            "ORDER BY id OFFSET 20 LIMIT 10) FOR UPDATE"  # rows an OFFSET skips would be locked too
        ).fetchall()
        config = StreamerConfig(batch_size=10, pipeline_batches=4, max_backoff=0.2)
        with Streamer(settings, config, name="held") as streamer:
            first = streamer.run_once()
            assert first.published == 20 + 5, first
            assert rds.xlen("b-short") == 5
            holder.rollback()
            assert first.published + streamer.drain(timeout=60) == total
    finally:
        holder.close()
    _assert_each_once_in_order(rds, ["a-long"], 40)
    _assert_each_once_in_order(rds, ["b-short"], 5)


def test_a_claim_over_few_streams_reads_no_row_beyond_the_ones_it_takes(settings: Settings, pg: Any) -> None:
    """A claim over few streams (``batch_size`` of each fit in the batch) reads each stream's lowest rows by its index
    range: none of the table's other rows. Read in id order, each claim over two streams of 300 records read the
    ``limit`` lowest ids (160 rows here) for 10 of each, and over a larger table as much of it as the limit allows
    (``pg_stat_xact_user_tables``: the rows this transaction read)."""
    total = _stage(settings, ["a", "b"], per_stream=300)
    with psycopg.connect(settings.conninfo) as conn:
        across = store.claim_across(conn, ["a", "b"], DEPTH * 10, per_source=10)
        read = conn.execute(
            "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables "
            "WHERE relname = 'staged_log_records'"
        ).fetchone()[0]
        conn.rollback()
    assert {c.source: c.count for c in across.claims} == {"a": 10, "b": 10}
    assert read <= 2 * 10 + 2, f"{read} staged rows read for 20 (of {total})"


def test_saved_claims_of_one_stream_re_sent_in_a_batch_across_streams_keep_their_order(
    settings: Settings, pg: Any, rds: Any
) -> None:
    """A streamer over one stream pipelines its batches: a crash after a send can leave two claims of the stream
    saved. A successor that finds other streams staged too re-sends them in a batch across streams, each claim its
    own part of the batch, in claim order: every record once, in order, under the positions it was first sent with."""
    _stage(settings, ["big"], per_stream=40)
    faults = Faults(script={"streamer.crash_after_publish": [False, True]})
    config = StreamerConfig(batch_size=5, pipeline_batches=4)
    with Streamer(settings, config, faults=faults, name="crashing") as crashing, pytest.raises(InjectedCrash):
        crashing.run_once()
    saved = pg.execute("SELECT count(*) FROM unilog_claims WHERE source = 'big'").fetchone()[0]
    assert saved >= 2, saved  # the case this test is about: several saved claims of one source
    names = [f"s-{k}" for k in range(10)]
    _stage(settings, names, per_stream=3)
    with Streamer(settings, StreamerConfig(batch_size=5), name="successor") as streamer:
        streamer.drain(timeout=60)
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0] == 0
    _assert_each_once_in_order(rds, ["big"], 40)
    _assert_each_once_in_order(rds, names, 3)


def test_a_batch_across_streams_stops_at_its_byte_budget_and_the_rest_follows(
    settings: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's body is one Postgres value (capped at 1 GB): a batch across streams claims the lowest ids up to a
    byte budget of data (the first record always), says more is ready, and the next batches take the rest, each
    stream in order. The budget is lowered here so that a few records of a kilobyte cross it."""
    from unilog.store import spread
    from unilog.stream import capture_table

    monkeypatch.setattr(capture_table, "SPREAD_FROM", 2)  # its four streams claimed across, as many streams are

    names = [f"b-{k}" for k in range(4)]
    records = [
        {"action": "a", "object": "o", "data": {"i": i, "pad": "x" * 1000}, "stream": name}
        for i in range(10)
        for name in names
    ]
    with psycopg.connect(settings.conninfo) as conn:
        emit_many(conn, records)
        conn.commit()
    monkeypatch.setattr(spread, "BATCH_BYTES", 5000)
    with psycopg.connect(settings.conninfo) as conn:
        got = store.claim_across(conn, names, 1000)
        assert got.cut and sum(c.count for c in got.claims) == 5, [c.count for c in got.claims]  # 4 x 1 KB, then one
        conn.rollback()
    with Streamer(settings, StreamerConfig(pipeline_batches=1), name="budget") as streamer:
        first = streamer.run_once()  # one batch a pass here
        assert first.waiting and first.published == 5, first  # more is ready: the next pass goes on at once
        assert first.published + streamer.drain(timeout=60) == len(records)
    _assert_each_once_in_order(rds, names, 10)


def test_the_ids_of_many_streams_are_listed_on_one_client_in_bounded_pipelines(
    settings: Settings, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``engine.ids_many`` (the Spark source's listing over several streams): a first page of every stream, then
    deeper pages of the streams that had a full one, never more entries asked for at once than its bound (lowered
    here so that the listing takes several pipelines); each stream's ids in order, within its range."""
    from unilog.engine import bulk

    monkeypatch.setattr(bulk, "IDS_IN_FLIGHT", 150)
    monkeypatch.setattr(bulk, "FIRST_PAGE", 50)
    sizes = {"ids-big": 260, "ids-small": 3, "ids-empty": 0, **{f"ids-{k}": 60 for k in range(5)}}
    for stream, n in sizes.items():
        for i in range(n):
            rds.xadd(stream, {"i": i})
    every = {s: [entry_id for entry_id, _ in rds.xrange(s)] for s in sizes}
    after = every["ids-big"][9]
    ranges = {s: ("0-0", "+") for s in sizes} | {"ids-big": (after, every["ids-big"][199])}
    found = bulk.ids_many(settings.redis_url, ranges, 100)
    assert found == {s: ids for s, ids in every.items() if s != "ids-big"} | {"ids-big": every["ids-big"][10:200]}


def test_wal_batches_spread_over_many_streams_grow_deeper_yet_hold_at_most_a_batch_of_a_stream(
    wal: Settings, pg: Any, rds: Any
) -> None:
    """A WAL batch over many streams with few records each costs a position, a script section and a metric child
    per stream: such a backlog is taken up to WAL_DEPTH batches' worth at a time from its first batch (fewer of
    those costs), never more than ``batch_size`` records of one stream (its part is one script call), and the rows
    held stay bounded."""
    from unilog.stream.capture_wal import WAL_DEPTH, WalCapture

    batch = 100
    names = [f"w-{k:03d}" for k in range(300)]
    total = _stage(wal, names, per_stream=3)
    # the hot stream is the default one, its records staged half with no stream, half naming it: one stream's
    with psycopg.connect(wal.conninfo) as conn:
        emit_many(
            conn,
            [
                {"action": "a", "object": "o", "data": {"i": i}, "stream": wal.stream if i % 2 else None}
                for i in range(250)
            ],
        )
        conn.commit()
    total += 250
    total += _stage(wal, names[:50], per_stream=1)  # after the hot stream's records: a batch goes past them
    sent: list[dict[str, int]] = []
    with Streamer(wal, StreamerConfig(batch_size=batch, restart_after_crash=False)) as streamer:
        send_all = streamer.publisher.send_all

        def observed(targets: dict[str, Any], *args: Any, **kw: Any) -> Any:
            sent.append({stream: payload.count for stream, payload in targets.items()})
            return send_all(targets, *args, **kw)

        streamer.publisher.send_all = observed  # type: ignore[method-assign]
        assert streamer.drain(timeout=60) == total
        capture = streamer.capture
        assert isinstance(capture, WalCapture)
        assert batch < capture.held_peak <= 2 * WAL_DEPTH * batch
    assert sum(sum(s.values()) for s in sent) == total
    assert sum(sent[0].values()) > batch, "the backlog's first batch, spread over 300 streams, was deep already"
    assert max(max(s.values()) for s in sent) <= batch, "never more than batch_size records of one stream"
    hot = [(int(f["seq"]), json.loads(f["data"])["i"]) for _id, f in rds.xrange(wal.stream)]
    assert hot == [(i + 1, i) for i in range(250)]
    _assert_each_once_in_order(rds, names[50:], 3)
    for name in names[:50]:
        entries = [(int(f["seq"]), json.loads(f["data"])["i"]) for _id, f in rds.xrange(name)]
        assert entries == [(1, 0), (2, 1), (3, 2), (4, 0)], name


def test_a_claim_across_streams_saves_each_streams_runs_of_consecutive_ids(settings: Settings, pg: Any) -> None:
    """A claim keeps its rows as runs of consecutive ids (a re-send reads them back by these): a run breaks where
    another stream's row sits between, and the last row a source may take ends one."""
    order = ["a", "a", "a", "b", "a", "a", "c", "c", "c", "c", "c"]
    with psycopg.connect(settings.conninfo) as conn:
        emit_many(conn, [{"action": "x", "object": "o", "data": {}, "stream": s} for s in order])
        conn.commit()
    ids = [r[0] for r in pg.execute("SELECT id FROM staged_log_records ORDER BY id").fetchall()]
    with psycopg.connect(settings.conninfo) as conn:
        across = store.claim_across(conn, ["a", "b", "c"], 100, per_source=4)
        conn.commit()
    assert sorted((c.source, c.count) for c in across.claims) == [("a", 4), ("b", 1), ("c", 4)]
    saved = {r[0]: (r[1], r[2]) for r in pg.execute("SELECT source, lo, hi FROM unilog_claims").fetchall()}
    assert saved == {
        "a": ([ids[0], ids[4]], [ids[2], ids[4]]),  # 1-3, then 5: its fourth row, though 6 follows it
        "b": ([ids[3]], [ids[3]]),
        "c": ([ids[6]], [ids[9]]),  # its first four of five
    }


@pytest.mark.usefixtures("one_share")
def test_a_batch_across_streams_is_deleted_piece_by_piece_while_redis_appends_the_next(
    settings: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of several batches' worth goes to Redis in PIECES pieces, one after another; each piece's claims are
    deleted as soon as Redis confirmed it, while the next is sent (the delete no longer waits for the whole send).
    Each send after the first here waits until the piece before it is deleted: a streamer that deleted only after
    the whole batch was sent would keep it waiting, and this test fails."""
    names = [f"s-{k:03d}" for k in range(40)]
    total = _stage(settings, names, per_stream=2)
    deleted: list[threading.Event] = [threading.Event() for _ in range(PIECES)]
    waited: list[bool] = []
    calls = {"send": 0, "delete": 0}
    send_batches, delete_across = Publisher.send_batches, store.delete_across

    def send(self: Publisher, batches: Any, identity: Any, per_call: Any) -> int:
        k = calls["send"]
        calls["send"] += 1
        if 0 < k < PIECES:
            waited.append(deleted[k - 1].wait(10))
        return send_batches(self, batches, identity, per_call)

    def delete(conn: Any, claims: list[int], **kw: Any) -> int | None:
        got = delete_across(conn, claims, **kw)
        if calls["delete"] < PIECES:
            deleted[calls["delete"]].set()
        calls["delete"] += 1
        return got

    monkeypatch.setattr(Publisher, "send_batches", send)
    monkeypatch.setattr(store, "delete_across", delete)
    with Streamer(settings, StreamerConfig(batch_size=10), name="pieces") as streamer:
        assert streamer.run_once().published == total
    assert calls == {"send": PIECES, "delete": PIECES}, calls
    assert waited == [True] * (PIECES - 1), "each piece was sent after the one before it was deleted"
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0] == 0
    assert pg.execute("SELECT count(*) FROM unilog_claims").fetchone()[0] == 0
    _assert_each_once_in_order(rds, names, 2)


def test_a_share_of_the_streams_is_claimed_and_sent_while_the_one_before_is_sent_and_deleted_and_a_crash_re_sends_once(
    settings: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over many streams (SHARED_FROM, lowered here) a pass claims its first batch over one share of them, and the
    next share's batch while Redis appends the first one's pieces; Redis appends the second right after the first,
    while the first is deleted. Here the first piece's send waits until the second share's claims are saved, and the
    first share's last delete waits until the second share's send has begun: a streamer that claimed or sent the
    second share only after the first was deleted keeps one of them waiting, and this test fails. A crash after the
    first share was sent (the second maybe partly) leaves the claims saved; the successor re-sends them: every
    record once, in order."""
    from unilog.stream import capture_spread

    monkeypatch.setattr(capture_spread, "SHARED_FROM", 4)
    names = [f"s-{k:03d}" for k in range(40)]
    first, second = names[:20], names[20:]  # the sources in name order, cut in SHARES (2) shares
    total = _stage(settings, names, per_stream=3)  # 60 records a share: PIECES pieces of batch_size 10 or more
    send_batches, delete_across, claim_across = Publisher.send_batches, store.delete_across, store.claim_across
    read_across = store.read_across
    claimed: list[list[str]] = []
    saw: dict[str, bool] = {}
    deletes = [0]
    second_sent = threading.Event()

    def second_share_saved() -> bool:
        with psycopg.connect(settings.conninfo, autocommit=True) as conn:
            rows = conn.execute("SELECT DISTINCT source FROM unilog_claims").fetchall()
        return {r[0] for r in rows} >= set(second)

    def send(self: Publisher, batches: Any, identity: Any, per_call: Any) -> int:
        targets = {t for t, _first, _payload in batches}
        if targets <= set(second):
            second_sent.set()
        elif "claimed" not in saw:  # the first piece of the first share
            deadline = time.monotonic() + 10
            while not second_share_saved() and time.monotonic() < deadline:
                time.sleep(0.05)
            saw["claimed"] = second_share_saved()
        return send_batches(self, batches, identity, per_call)

    def delete(conn: Any, claims: list[int], **kw: Any) -> int | None:
        deletes[0] += 1
        if deletes[0] == PIECES:  # the first share's last piece
            saw["sent"] = second_sent.wait(10)
        return delete_across(conn, claims, **kw)

    def claim(conn: Any, sources: list[str], *args: Any, **kw: Any) -> Any:
        claimed.append(sorted(sources))
        return claim_across(conn, sources, *args, **kw)

    def read(conn: Any, sources: list[str], *args: Any, **kw: Any) -> Any:  # the side session's (saved by the owner)
        claimed.append(sorted(sources))
        return read_across(conn, sources, *args, **kw)

    monkeypatch.setattr(Publisher, "send_batches", send)
    monkeypatch.setattr(store, "delete_across", delete)
    monkeypatch.setattr(store, "claim_across", claim)
    monkeypatch.setattr(store, "read_across", read)
    faults = Faults(script={"streamer.crash_after_publish": [True]})
    crashing = Streamer(settings, StreamerConfig(batch_size=10), faults=faults, name="crashing")
    with crashing, pytest.raises(InjectedCrash):
        crashing.run_once()
    assert sorted(claimed) == [first, second], "a batch over each share (the second read while the first is claimed)"
    assert saw == {"claimed": True, "sent": True}, "the second share claimed, then sent, while the first was in flight"
    saved = dict(pg.execute("SELECT source, records FROM unilog_claims").fetchall())
    assert saved == dict.fromkeys(names, 3), saved
    order = [r[0] for r in pg.execute("SELECT source FROM unilog_claims ORDER BY claim").fetchall()]
    assert order == first + second, "the first share's claims saved (and so re-sent) before the second's"
    assert sum(rds.xlen(n) for n in first) == 60 and sum(rds.xlen(n) for n in second) <= 60
    with Streamer(settings, StreamerConfig(batch_size=10), name="successor") as streamer:
        assert streamer.drain(timeout=60) == total
    assert pg.execute("SELECT count(*) FROM unilog_claims").fetchone()[0] == 0
    _assert_each_once_in_order(rds, names, 3)


def test_the_partition_counts_are_read_while_the_first_share_is_claimed_and_a_failed_read_re_sends_once(
    settings: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over many streams (SHARED_FROM, lowered here) a pass reads its streams' partition counts from Redis in the
    helper thread while Postgres claims the first share's batch: here the read waits until that claim has begun, so
    a streamer that read them before claiming (Redis idle meanwhile) fails this test. A read Redis fails fails the
    pass after the claim was committed: its claims stay saved, and the next pass re-sends them, every record once,
    in order."""
    from unilog.stream import capture_spread

    monkeypatch.setattr(capture_spread, "SHARED_FROM", 4)
    names = [f"p-{k:03d}" for k in range(40)]
    total = _stage(settings, names, per_stream=2)
    partitions_of, claim_across = Publisher.partitions_of, store.claim_across
    claiming = threading.Event()
    seen: list[tuple[str, bool]] = []
    failing = [True]

    def read(self: Publisher, streams: Any) -> dict[str, int]:
        if len(set(streams)) == len(names):  # the pass's read of every stream's count
            seen.append((threading.current_thread().name, claiming.wait(10)))
            if failing[0]:
                failing[0] = False
                raise redis.ConnectionError("injected: Redis went away while the counts were read")
        return partitions_of(self, streams)

    def claim(conn: Any, sources: list[str], *args: Any, **kw: Any) -> Any:
        claiming.set()
        return claim_across(conn, sources, *args, **kw)

    monkeypatch.setattr(Publisher, "partitions_of", read)
    monkeypatch.setattr(store, "claim_across", claim)
    first = Streamer(settings, StreamerConfig(batch_size=10), name="first")
    with first, pytest.raises(redis.ConnectionError, match="injected"):
        first.run_once()
    [(thread, while_claiming)] = seen
    assert thread != threading.main_thread().name and while_claiming, "read in the helper while Postgres claimed"
    saved = pg.execute("SELECT count(*) FROM unilog_claims").fetchone()[0]
    assert saved == len(names) // 2, "the first share's claims were committed before the read failed"
    assert sum(rds.xlen(n) for n in names) == 0
    with Streamer(settings, StreamerConfig(batch_size=10), name="successor") as streamer:
        assert streamer.drain(timeout=60) == total
    assert pg.execute("SELECT count(*) FROM unilog_claims").fetchone()[0] == 0
    _assert_each_once_in_order(rds, names, 2)


def test_the_default_streams_two_sources_stay_in_one_share_and_each_record_is_published_once(
    settings: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row staged with no stream and one naming the default stream are the same stream's. Over many streams
    (SHARED_FROM lowered here) the sources are cut in shares by stream: cut by source name, '' sorts first and the
    default stream's name (``test-stream``) after the ``s-...`` streams, in the other share, whose positions would be
    read before the first share's were saved and reused; Redis skipped the second share's records as already there
    and their rows were deleted: lost."""
    from unilog.stream import capture_spread

    monkeypatch.setattr(capture_spread, "SHARED_FROM", 4)
    names = [f"s-{k:03d}" for k in range(40)]
    assert max(names) < settings.stream  # the default stream's own name sorts after the others
    _stage(settings, names, per_stream=3)
    records = [{"action": "a", "object": "o", "data": {"i": i}} for i in range(6)]  # no stream: the default one
    named = [{"action": "a", "object": "o", "data": {"i": i}, "stream": settings.stream} for i in range(6, 12)]
    with psycopg.connect(settings.conninfo) as conn:
        emit_many(conn, records[:3])
        emit_many(conn, named[:3])
        emit_many(conn, records[3:])
        emit_many(conn, named[3:])
        conn.commit()
    sources = {r[0] for r in pg.execute("SELECT DISTINCT stream FROM staged_log_records").fetchall()}
    assert {"", settings.stream} <= sources
    with Streamer(settings, StreamerConfig(batch_size=10), name="shares") as streamer:
        assert streamer.drain(timeout=60) == 40 * 3 + 12
    entries = rds.xrange(settings.stream)
    assert [int(f["seq"]) for _, f in entries] == list(range(1, 13))
    assert sorted(json.loads(f["data"])["i"] for _, f in entries) == list(range(12))
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0] == 0
    _assert_each_once_in_order(rds, names, 3)


def test_a_streamer_whose_batch_sent_ahead_failed_too_ends_its_session_when_dropped(
    settings: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis refuses the first share's first piece, and the second share's batch, queued behind it, fails too before
    the pass stops it (held here until it did). The caller drops the streamer: its session must end with its last
    reference. The second send's error, left in its queue, held the helper's frame, which holds the queue and the
    streamer's passes: a cycle that kept the streamer until a full garbage collection."""
    from unilog.stream import capture_spread, spread_parts

    monkeypatch.setattr(capture_spread, "SHARED_FROM", 4)
    names = [f"s-{k:03d}" for k in range(40)]
    first, second = set(names[:20]), set(names[20:])
    _stage(settings, names, per_stream=3)
    queued, second_failed = threading.Event(), threading.Event()
    start, end = capture_spread.SpreadPasses._start, spread_parts.Sending.end

    def started(self: Any, ready: Any) -> None:
        start(self, ready)
        if {c.source for c in ready.claims} <= second:
            queued.set()

    def send(self: Publisher, batches: Any, identity: Any, per_call: Any) -> int:
        targets = {t for t, _first, _payload in batches}
        if targets <= second:
            second_failed.set()
            raise InjectedCrash("the second share's send (test)")
        assert targets <= first and queued.wait(10), "the second share was queued behind the first"
        raise InjectedCrash("the first share's first piece (test)")

    def ended(self: Any) -> Any:
        second_failed.wait(10)
        return end(self)

    monkeypatch.setattr(capture_spread.SpreadPasses, "_start", started)
    monkeypatch.setattr(Publisher, "send_batches", send)
    monkeypatch.setattr(spread_parts.Sending, "end", ended)
    with refcounting_only():
        dropped(
            lambda: Streamer(settings, StreamerConfig(batch_size=10), name="ahead").drain(timeout=60), InjectedCrash
        )
        assert second_failed.is_set()
        assert_sessions_end(pg, "unilog-ahead", "the dropped streamer's session")
    assert pg.execute("SELECT count(*) FROM unilog_claims").fetchone()[0] == 40  # both shares' claims saved


def test_a_stream_named_like_a_partition_of_another_stays_in_its_share_and_each_record_is_published_once(
    settings: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stream ``orders`` has two partitions: its records of partition 1 go to the stream ``orders.p1``, which is also
    a stream name staged here. Over many streams (SHARED_FROM lowered here) the two stay in one share: in name order
    they fall in different ones, and the second share's positions on ``orders.p1`` were read before the first's were
    saved, reused, and the second's records skipped by Redis as already there (their rows deleted: lost)."""
    from unilog.engine import RedisStreams, connect
    from unilog.routing import partition_of
    from unilog.stream import capture_spread

    monkeypatch.setattr(capture_spread, "SHARED_FROM", 4)
    RedisStreams(connect(settings.redis_url)).set_partitions("orders", 2)
    names = [f"m-{k:03d}" for k in range(20)] + [f"z-{k:03d}" for k in range(20)]
    _stage(settings, names, per_stream=3)
    keys = [f"k-{i}" for i in range(10)]
    assert {partition_of(k, 2) for k in keys} == {0, 1}
    orders = [
        {"action": "a", "object": "o", "data": {"i": i}, "stream": "orders", "key": k} for i, k in enumerate(keys)
    ]
    named = [{"action": "a", "object": "o", "data": {"i": 100 + i}, "stream": "orders.p1"} for i in range(5)]
    with psycopg.connect(settings.conninfo) as conn:
        emit_many(conn, orders[:5] + named[:3] + orders[5:] + named[3:])
        conn.commit()
    with Streamer(settings, StreamerConfig(batch_size=10), name="partitions") as streamer:
        assert streamer.drain(timeout=60) == 40 * 3 + 15
    into_p1 = sum(1 for k in keys if partition_of(k, 2) == 1) + len(named)
    entries = rds.xrange("orders.p1")
    assert [int(f["seq"]) for _, f in entries] == list(range(1, into_p1 + 1)), entries
    assert rds.xlen("orders.p0") == sum(1 for k in keys if partition_of(k, 2) == 0)
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0] == 0
    _assert_each_once_in_order(rds, names, 3)


def test_held_rows_of_a_stream_named_like_a_partition_hold_back_the_partitioned_stream_too(
    settings: Settings, pg: Any, rds: Any
) -> None:
    """Stream ``orders`` has two partitions, and ``orders.p1`` is also a stream name staged here, whose rows another
    session holds locked. Both send to the stream ``orders.p1``: the held claims keep ``orders``'s claims of the batch
    back with them (its positions on ``orders.p1`` are past the held records'). Before, ``orders``'s claims were
    settled and its positions saved past the held records', which a later pass re-sent under new positions: twice."""
    from unilog.engine import RedisStreams, connect
    from unilog.routing import partition_of

    RedisStreams(connect(settings.redis_url)).set_partitions("orders", 2)
    names = [f"m-{k:03d}" for k in range(20)]
    _stage(settings, names, per_stream=3)
    keys = [f"k-{i}" for i in range(10)]
    orders = [
        {"action": "a", "object": "o", "data": {"i": i}, "stream": "orders", "key": k} for i, k in enumerate(keys)
    ]
    named = [{"action": "a", "object": "o", "data": {"i": 100 + i}, "stream": "orders.p1"} for i in range(5)]
    with psycopg.connect(settings.conninfo) as conn:
        emit_many(conn, named + orders)
        conn.commit()
    holder = _lock_rows_of(settings, "orders.p1")
    try:
        with Streamer(settings, StreamerConfig(batch_size=10, max_backoff=0.2), name="named") as streamer:
            with capture_logs() as logs:
                assert streamer.run_once().published == 20 * 3, "orders waits with the held stream"
            waits = [e for e in logs if e["event"] == "staged rows locked by another session: their streams wait"]
            assert [(e["streams"], e["first"]) for e in waits] == [(1, "orders.p1")], "the held stream is named"
            holder.rollback()
            assert streamer.drain(timeout=60) == 15
    finally:
        holder.close()
    into_p1 = sum(1 for k in keys if partition_of(k, 2) == 1) + len(named)
    entries = rds.xrange("orders.p1")
    assert [int(f["seq"]) for _, f in entries] == list(range(1, into_p1 + 1)), entries
    assert sorted(json.loads(f["data"])["i"] for _, f in entries) == sorted(
        [i for i, k in enumerate(keys) if partition_of(k, 2) == 1] + [100 + i for i in range(5)]
    )
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0] == 0
    _assert_each_once_in_order(rds, names, 3)


def test_a_pass_past_its_share_of_the_deadline_claims_no_further_share(
    settings: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass that used its share of the deadline claims no more (the next pass goes on at once): over many streams
    (SHARED_FROM lowered here) with every pass late, a pass publishes its first share's batch only and says more is
    ready, the second share following in the next pass. Before, a first batch that ended late left its pass to claim
    and publish the second share as well."""
    from unilog.stream import capture_spread

    monkeypatch.setattr(capture_spread, "SHARED_FROM", 4)
    monkeypatch.setattr(capture_spread.SpreadPasses, "_late", lambda self, started: True)
    names = [f"s-{k:03d}" for k in range(40)]
    total = _stage(settings, names, per_stream=3)
    with Streamer(settings, StreamerConfig(batch_size=10), name="late") as streamer:
        first = streamer.run_once()
        assert (first.published, first.waiting) == (60, True), first  # one share: 20 streams of 3
        assert first.published + streamer.drain(timeout=60) == total
    _assert_each_once_in_order(rds, names, 3)


def test_late_passes_start_at_the_next_share_so_a_busy_share_keeps_no_other_waiting(
    settings: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every pass late (past its share of the deadline), a pass claims its first share only. Over many streams
    (SHARED_FROM lowered here) whose first share in name order gets new records before every pass, the second share
    is published all the same: each pass starts at the next share. Before, every pass started at the first share, and
    the second waited as long as the first had records."""
    from unilog.stream import capture_spread

    monkeypatch.setattr(capture_spread, "SHARED_FROM", 4)
    monkeypatch.setattr(capture_spread.SpreadPasses, "_late", lambda self, started: True)
    names = [f"t-{k:03d}" for k in range(40)]
    first, second = names[:20], names[20:]
    _stage(settings, names, per_stream=1)
    with Streamer(settings, StreamerConfig(batch_size=10), name="turns") as streamer:
        for _ in range(4):
            _stage(settings, first, per_stream=1)  # the first share is never out of records
            streamer.run_once()
    assert all(rds.xlen(n) == 1 for n in second), "the second share was published"


def test_a_claim_over_few_sources_takes_rows_staged_with_no_stream_once(settings: Settings, pg: Any) -> None:
    """A claim over few sources reads each by its index range: rows staged with no stream ('') are a source of their
    own, beside rows naming the default stream, each giving its lowest ``per_source`` rows once."""
    records = [
        {"action": "a", "object": "o", "data": {"i": i}, "stream": stream}
        for i in range(8)
        for stream in (None, settings.stream, "other")
    ]
    with psycopg.connect(settings.conninfo) as conn:
        emit_many(conn, records)
        conn.commit()
        across = store.claim_across(conn, ["", settings.stream, "other"], DEPTH * 5, per_source=5)
        claimed = {c.source: [json.loads(d)["i"] for d in _bodies(c)] for c in across.claims}
        conn.rollback()
    assert claimed == {"": [0, 1, 2, 3, 4], settings.stream: [0, 1, 2, 3, 4], "other": [0, 1, 2, 3, 4]}, claimed


def _bodies(claim: Any) -> list[str]:
    """The ``data`` of each record of a packed claim (its first RESP bulk string of each ``stride``)."""
    parts = claim.body.split(b"\r\n")
    bulks = [parts[k + 1].decode() for k in range(0, len(parts) - 1, 2)]
    return bulks[:: claim.stride]


@pytest.mark.usefixtures("one_share")
def test_rows_held_in_a_later_piece_keep_only_their_stream_back(
    settings: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch sent in pieces: the third piece's delete meets one stream's rows another session holds locked. The
    pieces deleted before are rolled back with it and the batch is settled as a whole: every other stream's claim is
    deleted with its positions, the held stream keeps its claim; released, it follows, each record once, in order."""
    names = [f"s-{k:03d}" for k in range(40)]
    total = _stage(settings, names, per_stream=2)
    held = names[25]  # claims go in stream order: 20 records a piece, so its claim is in the third piece
    holder = _lock_rows_of(settings, held)
    deletes: list[int | None] = []
    delete_across = store.delete_across

    def delete(conn: Any, claims: list[int], **kw: Any) -> int | None:
        deletes.append(got := delete_across(conn, claims, **kw))
        return got

    monkeypatch.setattr(store, "delete_across", delete)
    try:
        with Streamer(settings, StreamerConfig(batch_size=10, max_backoff=0.2), name="pieces") as streamer:
            assert streamer.run_once().published == total - 2
            assert deletes == [20, 20, None, total - 2], "the third piece met the lock; the rest settled at once"
            assert sum(rds.xlen(n) for n in names) == total, "every piece was sent"
            kept = pg.execute("SELECT source, records FROM unilog_claims").fetchall()
            assert [tuple(r) for r in kept] == [(held, 2)], kept
            assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0] == 2
            holder.rollback()
            assert streamer.drain(timeout=60) == 2
    finally:
        holder.close()
    assert pg.execute("SELECT count(*) FROM unilog_claims").fetchone()[0] == 0
    _assert_each_once_in_order(rds, names, 2)


@pytest.mark.usefixtures("one_share")
def test_a_piece_redis_refused_ends_the_sending_and_deletes_nothing(
    settings: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis refuses the second piece of a batch: the pieces after it are never sent (they would land past a gap in
    their streams' positions), the first piece's delete is rolled back with the rest, every claim stays saved; the
    next pass re-sends the batch under the same positions, each record once, in order."""
    names = [f"s-{k:03d}" for k in range(40)]
    total = _stage(settings, names, per_stream=2)
    sends: list[int] = []
    send_batches = Publisher.send_batches

    def send(self: Publisher, batches: Any, identity: Any, per_call: Any) -> int:
        sends.append(len(batches))
        if len(sends) == 2:
            raise PublishError("Redis did not confirm a piece (injected)")
        return send_batches(self, batches, identity, per_call)

    with Streamer(settings, StreamerConfig(batch_size=10), name="refused") as streamer:
        monkeypatch.setattr(Publisher, "send_batches", send)
        with pytest.raises(PublishError, match="injected"):
            streamer.run_once()
        assert len(sends) == 2, "nothing was sent after the refused piece"
        assert sum(rds.xlen(n) for n in names) == 20, "the first piece only"
        assert pg.execute("SELECT count(*), sum(records) FROM unilog_claims").fetchone() == (40, total)
        assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0] == total, "nothing deleted"
        monkeypatch.setattr(Publisher, "send_batches", send_batches)
        streamer.recover()
        assert streamer.drain(timeout=60) == total
    assert pg.execute("SELECT count(*) FROM unilog_claims").fetchone()[0] == 0
    _assert_each_once_in_order(rds, names, 2)


def test_a_server_that_ends_idle_transactions_lets_a_batch_wait_for_its_pieces(
    settings: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transaction that deletes a batch's pieces stays open while Redis appends the next piece. A server with
    ``idle_in_transaction_session_timeout`` set (here 100 ms; each piece takes 300 ms) must not end it: else every
    retry would meet the same timeout and the backlog would never drain."""
    names = [f"s-{k:03d}" for k in range(40)]
    total = _stage(settings, names, per_stream=2)
    send_batches = Publisher.send_batches

    def slow(self: Publisher, batches: Any, identity: Any, per_call: Any) -> int:
        time.sleep(0.3)
        return send_batches(self, batches, identity, per_call)

    database = pg.execute("SELECT current_database()").fetchone()[0]
    pg.execute(f'ALTER DATABASE "{database}" SET idle_in_transaction_session_timeout = 100')
    pg.commit()
    try:
        monkeypatch.setattr(Publisher, "send_batches", slow)
        with Streamer(settings, StreamerConfig(batch_size=10), name="patient") as streamer:
            assert streamer.run_once().published == total
    finally:
        pg.execute(f'ALTER DATABASE "{database}" RESET idle_in_transaction_session_timeout')
        pg.commit()
    _assert_each_once_in_order(rds, names, 2)


@pytest.mark.parametrize(("mode", "streams"), [("table", 1), ("table", 40), ("wal", 40)])
def test_a_streamer_dropped_without_close_ends_its_session_at_once(
    settings: Settings, pg: Any, rds: Any, mode: str, streams: int, request: pytest.FixtureRequest
) -> None:
    """``Streamer(settings).drain()`` in a script, then another streamer: the first one's session (and the stream
    locks it holds) must end when its last reference goes, not at some later garbage collection. A reference cycle
    in the capture (its passes over many streams referring back to it) kept it open, and the next streamer waited
    on its locks for ever (the default suite hung, 2026-11-30)."""
    if mode == "wal":
        request.getfixturevalue("wal")
    names = [f"s-{k:03d}" for k in range(streams)]
    total = _stage(settings, names, per_stream=2)
    with refcounting_only():
        assert (
            dropped(lambda: Streamer(settings, StreamerConfig(batch_size=10), name="dropped").drain(timeout=60))
            == total
        )
        assert_sessions_end(pg, "unilog-dropped", "the dropped streamer's session")
        assert_sessions_end(pg, "unilog-dropped-side", "the dropped streamer's side session")


def test_a_streamer_whose_drain_failed_ends_its_session_when_dropped(settings: Settings, pg: Any, rds: Any) -> None:
    """A drain that raises (here an injected crash after its claim) and a caller that catches it and goes on: the
    streamer's session must end with its last reference. The raised error's traceback holds the loop's frames; a
    local there that held the error too made a cycle, and the failed streamer (its session, its stream locks) lived
    until a full garbage collection."""
    _stage(settings, [f"s-{k:03d}" for k in range(40)], per_stream=2)
    faults = Faults(script={"streamer.crash_after_claim": [True]})
    with refcounting_only():
        dropped(
            lambda: Streamer(settings, StreamerConfig(batch_size=10), faults=faults, name="failed").drain(timeout=60),
            InjectedCrash,
        )
        assert_sessions_end(pg, "unilog-failed", "the failed streamer's session")
        assert_sessions_end(pg, "unilog-failed-side", "the failed streamer's side session")


def test_a_streamer_that_let_go_of_its_streams_reads_their_positions_again(
    settings: Settings, pg: Any, rds: Any
) -> None:
    """A streamer lets go of its streams (what a WAL-mode streamer refused the slot does, in the same Postgres
    session), another publishes them, then the first takes them again: it must read their positions again. A streamer
    that kept the positions it remembered gave new records positions already used, Redis skipped them as present,
    and they were lost (a chaos run with failovers lost 84 records so)."""
    names = ["let-go"]
    with (
        Streamer(settings, StreamerConfig(), name="first") as first,
        Streamer(settings, StreamerConfig(), name="second") as second,
    ):
        _stage(settings, names, per_stream=3)
        assert first.drain(timeout=60) == 3
        assert first.links.pg_open is not None
        first.publisher.let_go(first.links.pg_open)
        records = [{"action": "a", "object": "o", "data": {"i": i}, "stream": "let-go"} for i in range(3, 9)]
        with psycopg.connect(settings.conninfo) as conn:
            emit_many(conn, records[:3])
            conn.commit()
        assert second.drain(timeout=60) == 3
        assert second.links.pg_open is not None
        second.publisher.let_go(second.links.pg_open)
        with psycopg.connect(settings.conninfo) as conn:
            emit_many(conn, records[3:])
            conn.commit()
        assert first.drain(timeout=60) == 3
    _assert_each_once_in_order(rds, names, 9)


@pytest.mark.parametrize("scan_bytes", [0, 64 << 20], ids=["big table: scanned on loosely", "small table: read once"])
def test_the_sources_of_many_streams_are_found_whole_by_either_path(
    settings: Settings, pg: Any, monkeypatch: pytest.MonkeyPatch, scan_bytes: int
) -> None:
    """The loose index scan that finds the staged sources stops at SKIP_UP_TO of them (lowered here to 4); past them a
    small table is read once (its sources hashed) and a big one (SCAN_BYTES lowered to 0 here) is scanned on, loosely,
    from the last source found: either way every source is found, once, the default stream's '' included."""
    from unilog.store import staging

    monkeypatch.setattr(staging, "SKIP_UP_TO", 4)
    monkeypatch.setattr(staging, "SCAN_BYTES", scan_bytes)
    names = [f"f-{k:02d}" for k in range(13)]
    _stage(settings, names, per_stream=3)
    with psycopg.connect(settings.conninfo) as conn:
        emit_many(conn, [{"action": "a", "object": "o", "data": {}}])  # no stream: the default one, staged as ''
        conn.commit()
    found = store.staged_sources(pg)
    assert len(found) == len(set(found)) and set(found) == {*names, ""}, found


def test_the_stream_locks_another_session_holds_are_found_among_thousands_of_names(settings: Settings) -> None:
    """A streamer of every stream that took a bucket whole still leaves the streams whose own lock another session
    holds (a streamer limited to listed streams, or one of a version before buckets): the other sessions' locks are
    read once and matched against the names (no look at the lock table per name), its own locks never count."""
    names = [f"h-{k:04d}" for k in range(3000)]
    with psycopg.connect(settings.conninfo, autocommit=True) as other, psycopg.connect(settings.conninfo) as mine:
        assert store.stream_locks_held_elsewhere(mine, names) == set()
        assert store.try_stream_lock(other, names[7]) and store.try_stream_lock(other, names[2999])
        assert store.try_stream_lock(mine, names[8])
        assert store.stream_locks_held_elsewhere(mine, names) == {names[7], names[2999]}
        assert store.stream_locks_held_elsewhere(other, names) == {names[8]}
        assert store.stream_locks_held_elsewhere(mine, names[:5]) == set()
