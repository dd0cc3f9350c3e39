"""``backfill``: ``unilog backfill`` over a table of ``profile.backfill_size`` rows, and what it costs producers.

A table ``bench_backfill`` (bigint primary key, text, numeric, timestamptz) of ``backfill_size`` rows is created once.
Each variant runs the real ``python -m unilog backfill`` as a process while a producer thread in this process
commits one record per transaction (``emit`` of a small record, then ``COMMIT``) at :data:`PRODUCER_RATE` per second,
each transaction also updating a random row of the table (the application writing to the rows being backfilled),
and records each transaction's latency (from its first statement to its commit's return):

* ``no backfill``: the producer alone, for the rate variant's window (the baseline);
* ``backfill``: as fast as it goes, pages of 200 rows (the default), the whole table;
* ``backfill --rate R``: paced at ``profile.backfill_rate`` rows/s (pages of a tenth of a second's rows, the
  default with ``--rate``), stopped with SIGTERM ``profile.backfill_window`` seconds after its first page (it
  finishes its page and exits 0).

``rows/s`` is from the cursor's creation (the interpreter's start and the checks left out) to the process's end.

No streamer runs: the records stay staged (publishing costs are the drain workload's), so Redis does no work here
and its memory is not reported. Reported: rows/s, the producer transactions' p50/p99/max latency in ms, and their
count, and Postgres's memory while the variant runs (:mod:`bench.pgmemory`: the peak summed PSS and RSS of the
server's processes and the PSS at the start; "not measured" for a server that is not local).

``backfill_fleet``: the fleet's commit-to-handler latency (:func:`bench.latency.latency_trial`: a producer at
:data:`PRODUCER_RATE`/s, a streamer, a checkpoint consumer) with no backfill, an unpaced one and a paced one running
beside it into a stream of its own (the streamer publishes both streams), for ``backfill_window`` seconds; with
Redis's ``used_memory`` and the staging table's size at the end, and Postgres's memory while it runs (as above).
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import psycopg

from unilog import emit

from .core import Measurement, Profile, Results, log, percentile
from .env import BenchEnv
from .latency import latency_trial
from .pgmemory import PostgresMemory

PRODUCER_RATE = 100  # producer transactions per second, each an UPDATE of a row and an emit
TABLE_DDL = """
DROP TABLE IF EXISTS bench_backfill;
CREATE TABLE bench_backfill (id bigint PRIMARY KEY, name text NOT NULL, amount numeric(12, 2), at timestamptz);
INSERT INTO bench_backfill SELECT i, 'row ' || i, i * 0.01, now() FROM generate_series(1, %s) i;
"""


class _Producer:
    """Commits one small transaction every 1/``rate`` s on its own connection; keeps each one's latency."""

    def __init__(self, database_url: str, rows: int, rate: float = PRODUCER_RATE) -> None:
        self.url, self.rows, self.interval = database_url, rows, 1.0 / rate
        self.latencies: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rng = random.Random(27)
        with psycopg.connect(self.url) as conn:
            due = time.perf_counter()
            while not self.stop.is_set():
                started = time.perf_counter()
                row = rng.randint(1, self.rows)
                conn.execute("UPDATE bench_backfill SET amount = amount + 1 WHERE id = %s", (row,))
                emit(conn, action="update", object="bench_backfill", data={"id": row}, key=str(row))
                conn.commit()
                self.latencies.append(time.perf_counter() - started)
                due += self.interval
                self.stop.wait(max(0.0, due - time.perf_counter()))

    def __enter__(self) -> _Producer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)

    def metrics(self) -> dict[str, float]:
        ordered = sorted(self.latencies)
        if not ordered:
            return {"producer transactions": 0.0}
        return {
            "producer p50 ms": percentile(ordered, 0.5) * 1000,
            "producer p99 ms": percentile(ordered, 0.99) * 1000,
            "producer max ms": ordered[-1] * 1000,
            "producer transactions": float(len(ordered)),
        }


def _backfill_argv(env: BenchEnv, name: str, rate: int | None) -> list[str]:
    argv = [sys.executable, "-m", "unilog", "--log-json", "backfill", "bench_backfill", "--key", "id", "--name", name]
    argv += ["--database-url", env.urls.database, "--redis-url", env.urls.redis, "--stream", "bench-backfill"]
    return argv


def _backfill(env: BenchEnv, name: str, rate: int | None, window: float | None) -> dict[str, float]:
    """Run ``unilog backfill`` (stopped by SIGTERM after ``window`` seconds, if given); its rows and rows/s."""
    argv = _backfill_argv(env, name, None)
    if rate is not None:
        argv += ["--rate", str(rate)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while proc.poll() is None and _rows(env, name) is None:  # the interpreter's start and the checks
        time.sleep(0.01)
    started = time.perf_counter()  # the cursor exists: pages start now
    try:
        proc.wait(window)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the page in progress commits, then it exits 0
        proc.wait(60)
    seconds = time.perf_counter() - started
    if proc.returncode:
        stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        log(f"  WARNING backfill {name}: exited {proc.returncode}: {stderr[-500:]}")
    rows = float(_rows(env, name) or 0)
    return {"rows": rows, "rows/s": rows / seconds, "seconds": seconds}


def _rows(env: BenchEnv, name: str) -> int | None:
    row = env.admin.execute("SELECT rows_done FROM unilog_backfills WHERE name = %s", (name,)).fetchone()
    return None if row is None else int(row[0])


def _trial(env: BenchEnv, profile: Profile, variant: str) -> tuple[dict[str, float], dict[str, Any]]:
    env.reset()
    env.admin.execute("DELETE FROM unilog_backfills")
    env.settle()
    size = profile.backfill_size
    metrics: dict[str, float] = {}
    with _Producer(env.urls.database, size) as producer:
        time.sleep(0.5)  # the producer's connection and first transactions before the measured part
        producer.latencies.clear()
        with PostgresMemory(env.postmaster_pid) as memory:
            if variant == "no backfill":
                time.sleep(profile.backfill_window)
            elif variant == "backfill":
                metrics = _backfill(env, "bench-full", None, None)
            else:
                metrics = _backfill(env, "bench-rate", profile.backfill_rate, profile.backfill_window)
    metrics.update(producer.metrics())
    metrics.update(memory.metrics())
    notes = {"staged": env.staged(), "table_rows": size, "postgres_memory": memory.note()}
    return metrics, notes


def _fleet_trial(env: BenchEnv, profile: Profile, rate: int | None, backfill: bool) -> tuple[dict[str, float], Any]:
    """The fleet's commit-to-handler latency for ``backfill_window`` s, a backfill running beside it if asked."""
    with tempfile.TemporaryFile() as stderr:  # the backfill's log: its last lines go in the notes if it failed
        return _fleet_trial_logged(env, profile, rate, backfill, stderr)


def _fleet_trial_logged(
    env: BenchEnv, profile: Profile, rate: int | None, backfill: bool, stderr: Any
) -> tuple[dict[str, float], Any]:
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        env.admin.execute("DELETE FROM unilog_backfills")
        if backfill:
            argv = _backfill_argv(env, "bench-fleet", None) + (["--rate", str(rate)] if rate else [])
            procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr))
            while _rows(env, "bench-fleet") is None and procs[0].poll() is None:
                time.sleep(0.01)

    try:
        with PostgresMemory(env.postmaster_pid) as pg_memory:
            metrics, notes = latency_trial(env, "unilog", PRODUCER_RATE, profile.backfill_window, before_producer=start)
    finally:
        exited = [proc.poll() for proc in procs]  # before the SIGTERM: None while it ran to the window's end
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    if any(code not in (None, 0) for code in exited):
        stderr.seek(0)
        notes["backfill_failed"] = {"exit": exited, "log": stderr.read().decode(errors="replace")[-2000:]}
        log(f"backfill_fleet: the backfill exited with {exited}: {notes['backfill_failed']['log'][-300:]}")
    memory = env.rds.info("memory")
    row = env.admin.execute("SELECT pg_total_relation_size('staged_log_records')").fetchone()
    keep = ("p50 ms", "p99 ms", "max ms", "missing")
    out = {f"handler {k}": v for k, v in metrics.items() if k in keep}
    out["backfill rows"] = float(_rows(env, "bench-fleet") or 0)
    out["Redis used_memory MB"] = int(memory["used_memory"]) / 1e6  # at the end (the peak is the server's, all run)
    out["staging table MB"] = (int(row[0]) if row else 0) / 1e6
    out.update(pg_memory.metrics())
    return out, {**notes, "postgres_memory": pg_memory.note()}


def run_backfill_fleet(env: BenchEnv, profile: Profile, results: Results) -> None:
    size = profile.backfill_size
    log(f"backfill_fleet: commit-to-handler at {PRODUCER_RATE}/s beside a backfill of {size:,} rows")
    env.admin.execute(TABLE_DDL.replace("%s", str(int(size))))
    variants: dict[str, tuple[int | None, bool]] = {"no backfill": (None, False), "backfill": (None, True)}
    variants[f"backfill --rate {profile.backfill_rate}"] = (profile.backfill_rate, True)
    try:
        for variant, (rate, backfill) in variants.items():
            metrics, notes = _fleet_trial(env, profile, rate, backfill)
            results.add(Measurement("backfill_fleet", backfill_case(size), variant, 0, metrics, notes))
    finally:
        env.admin.execute("DROP TABLE IF EXISTS bench_backfill")


def backfill_case(size: int) -> str:
    return f"{size:,} rows"


def backfill_variants(profile: Profile) -> tuple[str, ...]:
    return ("no backfill", "backfill", f"backfill --rate {profile.backfill_rate}")


def run_backfill(env: BenchEnv, profile: Profile, results: Results) -> None:
    size = profile.backfill_size
    log(
        f"backfill: unilog backfill over {size:,} rows, with a producer committing {PRODUCER_RATE}/s beside it "
        f"(alone; unpaced; --rate {profile.backfill_rate} for {profile.backfill_window:g} s)"
    )
    env.admin.execute(TABLE_DDL.replace("%s", str(int(size))))
    try:
        for variant in backfill_variants(profile):
            metrics, notes = _trial(env, profile, variant)
            results.add(Measurement("backfill", backfill_case(size), variant, 0, metrics, notes))
    finally:
        env.admin.execute("DROP TABLE IF EXISTS bench_backfill")
