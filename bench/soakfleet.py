"""The soak's fleet (its processes, the fault proxies, the producer) and one sample of every series it watches.

See :mod:`bench.soak` for the workload: what runs, what is sampled and how it is judged.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from unilog import emit
from unilog.harness.demo import DEFAULT_FAULTS
from unilog.harness.embedded import free_port
from unilog.harness.proxy import FaultProxy
from unilog.ops.status import collect_status

from .core import SPAWN, log, worker_init
from .env import BenchEnv
from .growth import Tolerance
from .memory import ROOT

REDIS_CUT_EVERY = 60.0
PG_CUT_EVERY = 300.0
CHECKPOINT, GROUP = "soak-checkpoint", "soak-group"
DASHBOARD_POLLED = ("/api/status", "/api/types", "/readyz")
STATS_SQL = """
    SELECT relname, pg_total_relation_size(relid), n_dead_tup, n_live_tup
    FROM pg_stat_user_tables
    WHERE relname IN ('staged_log_records', 'unilog_processed', 'unilog_checkpoints', 'unilog_group_watermarks',
                      'bench_state')
"""


@dataclass
class Child:
    """One long-lived fleet process, restarted (and its exit counted) if it dies."""

    name: str
    argv: list[str]
    env: dict[str, str]
    port: int
    log_path: Path
    polled: tuple[str, ...] = ("/metrics",)  # fetched at every sample, as Prometheus or a browser would
    popen: subprocess.Popen[bytes] | None = None
    exits: list[int] = field(default_factory=list)

    def start(self) -> None:
        with self.log_path.open("ab") as out:
            self.popen = subprocess.Popen(self.argv, cwd=ROOT, stdout=out, stderr=out, env=self.env)

    @property
    def pid(self) -> int:
        return self.popen.pid if self.popen else 0


def tolerances(rate: int) -> dict[str, Tolerance]:
    """Per series kind (the name before ':'): what a rise between the run's halves may be without counting as growth.
    Entries-counted series allow 10 s of the rate (a consumer's restart, a proxy cut), dead tuples two minutes of it
    (autovacuum's naptime is one), sizes a megabyte or two, retained WAL a 16 MB segment."""
    return {
        "RSS MB": Tolerance(2.0, 0.05),
        "lag entries": Tolerance(max(500.0, 10.0 * rate), 0.5),
        "lag s": Tolerance(10.0, 0.5),
        "pending": Tolerance(max(500.0, 10.0 * rate), 0.5),
        "staged records": Tolerance(max(500.0, 10.0 * rate), 0.5),
        "stream length": Tolerance(max(1000.0, 10.0 * rate), 0.1),
        "Redis used_memory MB": Tolerance(2.0, 0.1),
        "staging table MB": Tolerance(1.0, 0.1),
        "staging dead tuples": Tolerance(max(1000.0, 120.0 * rate), 0.5),
        "unilog_processed MB": Tolerance(1.0, 0.1),
        "unilog_processed rows": Tolerance(max(1000.0, 60.0 * rate), 0.5),
        "checkpoints+state MB": Tolerance(1.0, 0.1),
        "WAL retained MB": Tolerance(16.0, 0.25),
    }


def _produce(url: str, rate: int, stop: Any, produced: Any) -> None:
    """The producer process: ``rate`` single-record transactions a second on an open-loop schedule (behind by more
    than a second, it drops the backlog rather than burst)."""
    worker_init()
    with psycopg.connect(url) as conn:
        conn.execute("SET synchronous_commit = off")  # the soak is about the fleet, not the producer's fsync
        conn.commit()
        due = time.monotonic()
        i = 0
        while not stop.is_set():
            i += 1
            emit(conn, action="create", object="ride", data={"id": i, "distance": round(1 + (i % 1000) / 100, 2)})
            conn.commit()
            produced.value = i
            due = max(due + 1.0 / rate, time.monotonic() - 1.0)
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)


class SoakFleet:
    """The soak's processes, the proxies in front of the servers with faults on, and what they sampled."""

    def __init__(self, env: BenchEnv, variant: str, rate: int, log_dir: Path) -> None:
        self.env, self.variant, self.rate, self.log_dir = env, variant, rate, log_dir
        self.faults = variant.endswith("-faults")
        self.proxies: dict[str, FaultProxy] = {}
        self.cuts = {"redis": 0, "postgres": 0}
        self.children: list[Child] = []
        self.stop_producing = SPAWN.Event()
        self.produced = SPAWN.Value("l", 0)
        self.producer: Any = None
        self._stop_cutting = threading.Event()
        self._cutter: threading.Thread | None = None

    def start(self) -> None:
        urls = self.env.urls
        database, redis_url = urls.database, urls.redis
        if self.faults:
            pg_port, redis_port = (int(u.rsplit(":", 1)[1].split("/")[0]) for u in (database, redis_url))
            self.proxies = {"postgres": FaultProxy("127.0.0.1", pg_port), "redis": FaultProxy("127.0.0.1", redis_port)}
            for proxy in self.proxies.values():
                proxy.start()
            database, redis_url = self.proxies["postgres"].url_for(database), self.proxies["redis"].url_for(redis_url)
            self._cutter = threading.Thread(target=self._cut, daemon=True)
            self._cutter.start()
        connection = ["--database-url", database, "--redis-url", redis_url, "--default-stream", urls.stream]
        streamer_faults = DEFAULT_FAULTS["streamer"] if self.faults else ""
        consumer_faults = DEFAULT_FAULTS["consumer"] if self.faults else ""
        self._child("streamer", ["streamer", "--name", "soak-streamer"], connection, streamer_faults, 1)
        consume = ["consume", "--block-ms", "250"]
        handler = "soak_leaky" if self.variant.endswith("-leak") else "soak_checkpoint"
        checkpoint = [*consume, f"bench.handlers:{handler}", "--name", CHECKPOINT]
        self._child("checkpoint", checkpoint, connection, consumer_faults, 2)
        group = [*consume, "bench.handlers:soak_group", "--group", GROUP, "--worker", "w0", "--claim-idle-ms", "2000"]
        self._child("group", group, connection, consumer_faults, 3)
        # the operators' processes run for months too; they sample the servers directly (faults cut them as well)
        self._child("exporter", ["metrics"], connection, "", 4, port_flag="--port")
        dashboard = ["dashboard", "--read-only", "--interval", "2"]
        self._child("dashboard", dashboard, connection, "", 5, port_flag="--port", polled=DASHBOARD_POLLED)
        time.sleep(3.0)  # connected and registered before the first record
        self.producer = SPAWN.Process(
            target=_produce, args=(urls.database, self.rate, self.stop_producing, self.produced), daemon=True
        )
        self.producer.start()

    def _child(
        self,
        name: str,
        command: list[str],
        connection: list[str],
        faults: str,
        seed: int,
        port_flag: str = "--metrics-port",
        polled: tuple[str, ...] = ("/metrics",),
    ) -> None:
        port = free_port()
        argv = [sys.executable, "-m", "unilog", *command, *connection, port_flag, str(port)]
        env = {**os.environ, "UNILOG_LOG_LEVEL": "warning", "UNILOG_FAULTS": faults, "UNILOG_FAULT_SEED": str(seed)}
        child = Child(name, argv, env, port, self.log_dir / f"{self.variant}-{name}.log", polled)
        child.start()
        self.children.append(child)

    def _cut(self) -> None:
        started = time.monotonic()
        next_cut = {"redis": REDIS_CUT_EVERY, "postgres": PG_CUT_EVERY}
        every = dict(next_cut)
        while not self._stop_cutting.wait(1.0):
            elapsed = time.monotonic() - started
            for server, due in next_cut.items():
                if elapsed >= due:
                    self.proxies[server].cut()
                    self.cuts[server] += 1
                    next_cut[server] = due + every[server]

    def revive(self) -> list[str]:
        """Restart any process that exited (counted as a failure of the run); names those restarted."""
        revived = []
        for child in self.children:
            code = child.popen.poll() if child.popen else None
            if code is not None:
                child.exits.append(code)
                log(f"  soak {self.variant}: {child.name} exited with code {code}; restarted (see {child.log_path})")
                child.start()
                revived.append(child.name)
        return revived

    def pids(self) -> dict[str, int]:
        pids = {c.name: c.pid for c in self.children}
        if self.producer is not None and self.producer.pid:
            pids["producer"] = self.producer.pid
        return pids

    def stop_producer(self) -> None:
        self.stop_producing.set()
        if self.producer is not None:
            self.producer.join(30)
        self._stop_cutting.set()
        if self._cutter is not None:
            self._cutter.join(5)

    def poll(self) -> int:
        """Fetch every process's polled pages once (the exporter's and the workers' ``/metrics``, the dashboard's
        JSON), so the soak's RSS covers serving too; how many fetches failed (a process restarting, a server away)."""
        failed = 0
        for child in self.children:
            for path in child.polled:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{child.port}{path}", timeout=5) as reply:
                        reply.read()
                except OSError:
                    failed += 1
        return failed

    def scrape(self) -> dict[str, dict[str, float]]:
        """Per process, its counters of faults injected, restarts, retries and errors (``/metrics``)."""
        wanted = re.compile(r"^(unilog_(?:faults_injected|restarts|retries|errors)_total)(\{[^}]*\})? ([0-9.e+]+)$")
        out: dict[str, dict[str, float]] = {}
        for child in self.children:
            if "/metrics" not in child.polled:
                continue
            counters: dict[str, float] = {}
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{child.port}/metrics", timeout=5) as reply:
                    text = reply.read().decode()
            except OSError as exc:
                out[child.name] = {f"unreachable: {exc}": 0.0}
                continue
            for line in text.splitlines():
                if m := wanted.match(line):
                    key = m.group(1).removeprefix("unilog_").removesuffix("_total") + (m.group(2) or "")
                    counters[key] = float(m.group(3))
            out[child.name] = counters
        return out

    def stop(self) -> None:
        self.stop_producer()
        for child in self.children:
            if child.popen and child.popen.poll() is None:
                child.popen.send_signal(signal.SIGTERM)
        for child in self.children:
            if child.popen is None:
                continue
            try:
                child.popen.wait(30)
            except subprocess.TimeoutExpired:
                child.popen.kill()
                child.popen.wait()
        for proxy in self.proxies.values():
            proxy.stop()


def _proc(pid: int) -> tuple[float | None, float | None]:
    """(VmRSS in MB, CPU seconds: user + system) of ``pid``; None when it is gone."""
    try:
        rss = next(
            int(line.split()[1]) / 1024
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if line.startswith("VmRSS:")
        )
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None, None
    return rss, cpu


def sample(env: BenchEnv, fleet: SoakFleet) -> tuple[dict[str, float | None], dict[str, float | None]]:
    """One sample of every series (None where a value was not available), and every process's CPU seconds."""
    values: dict[str, float | None] = {}
    cpu: dict[str, float | None] = {}
    for name, pid in fleet.pids().items():
        values[f"RSS MB: {name}"], cpu[name] = _proc(pid)
    values.update(_status_series(env))
    memory = env.rds.info("memory")
    values["Redis used_memory MB"] = int(memory["used_memory"]) / 2**20
    values["stream length: rides"] = float(env.xlen(env.urls.stream))
    sizes, dead, live = {}, {}, {}
    for name, size, n_dead, n_live in env.admin.execute(STATS_SQL).fetchall():
        sizes[name], dead[name], live[name] = int(size), int(n_dead), int(n_live)
    values["staging table MB"] = sizes.get("staged_log_records", 0) / 2**20
    values["staging dead tuples"] = float(dead.get("staged_log_records", 0))
    values["unilog_processed MB"] = sizes.get("unilog_processed", 0) / 2**20
    values["unilog_processed rows"] = float(live.get("unilog_processed", 0))  # pruned every 10 s behind a watermark
    state_tables = ("unilog_checkpoints", "unilog_group_watermarks", "bench_state")
    values["checkpoints+state MB"] = sum(sizes.get(t, 0) for t in state_tables) / 2**20
    return values, cpu


def _status_series(env: BenchEnv) -> dict[str, float | None]:
    """Lag as ``unilog status --json`` reports it (the library's public status API), and the slot's retained WAL."""
    report = collect_status(env.urls.settings())
    values: dict[str, float | None] = {"staged records": float(report["staged"]["records"])}
    for consumer in report["consumers"]:
        if consumer["name"] == CHECKPOINT:
            values["lag entries: checkpoint"] = float(consumer["lag_entries"])
            values["lag s: checkpoint"] = float(consumer["lag_seconds"])
    for stream in report["streams"]:
        for group in stream["groups"]:
            if group["name"] == GROUP:
                values["lag entries: group"] = float(group["lag_entries"])
                values["lag s: group"] = float(group["lag_seconds"])
                values["pending: group"] = float(group["pending"])
    capture = report["capture"]
    if capture.get("mode") == "wal":
        retained = capture.get("retained_bytes")
        values["WAL retained MB"] = None if retained is None else retained / 2**20
    return values
