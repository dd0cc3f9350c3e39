"""``unilog demo``: an application's fleet on embedded Postgres and Redis, with a live view and a verdict.

:func:`run_demo` takes the application (:class:`~unilog.harness.app.App`; ``unilog demo`` passes Rocket Rides),
starts throw-away servers (Redis with ``appendfsync always``), prepares the database, declares the consumers, stages
one first record (``App.stage``), and runs the fleet as separate processes: the API under gunicorn, two streamers
(active and standby), the checkpoint consumers, the group's workers, the Spark consumer (when pyspark and Java are
present) and, once every consumer has applied that first record (:func:`warm_up`: a Spark consumer's first
micro-batch can take minutes on a busy machine, and no verdict may depend on it), the simulator. The warm-up waits
up to ``WARM_UP_SECONDS``, saying every ten seconds whom it waits for; a consumer still without the record then
ends the run before any traffic, ``did not catch up``, named. Faults are injected as in the reference design: the
streamer double-sends 10 % of its batches and each consumer crashes before committing 10 % of the time. A terminal
view refreshes every second. After ``duration`` seconds of traffic (or Ctrl-C) the simulator stops and the demo waits
for the consumers to catch up: as long as the backlog or some consumer's lag keeps falling (it gives up after
``STALL_SECONDS`` without progress, or ``CEILING_SECONDS`` in all). One verdict line then tells three outcomes
apart (:class:`Outcome`): ``AGREE`` (every consumer equals the canonical totals the app computes from its source
table), ``did not catch up in N s`` (some consumer still has entries to read, or records are still staged: it is
behind, not wrong) and ``DISAGREE`` (a consumer that has read everything holds something else). The processes' logs
go to ``log_dir``, else to a temporary folder removed after a run that agreed and kept (and named) otherwise.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any, TextIO

import psycopg

from unilog.config import Settings
from unilog.ops import admin
from unilog.ops.status import collect_status

from .app import App, spark_available, spark_env
from .chaos.runner import wait_for_api
from .embedded import EmbeddedPostgres, EmbeddedRedis, EmbeddedRedisCluster, free_port
from .supervisor import Fleet, ProcessSpec

CEILING_SECONDS = 300.0  # the longest wait for the consumers after the simulator stops
STALL_SECONDS = 60.0  # give up sooner once nothing has progressed for this long
WARM_UP_SECONDS = 600.0  # the longest wait for every consumer's first record, before traffic: a Spark consumer's
# first micro-batch began 46 s after its JVM started and took over 30 s more on a busy 2-core machine (issue 47)
WARM_UP_EVERY = 10.0  # seconds between the warm-up's lines naming whom it waits for
WARM_UP_CID = "unilog-demo-warm-up"  # the first record's cid (App.stage's)

DEFAULT_FAULTS = {
    "streamer": "streamer.double_send=0.1",
    "consumer": "consumer.crash_before_commit=0.1",
}


@dataclass
class Snapshot:
    """What the live view shows, read from the servers themselves."""

    rows: int  # in the app's source table
    staged: int
    stream_length: int
    consumers: dict[str, tuple[Any, int]]  # name -> (its totals, lag in entries)
    canonical: Any
    agree: bool

    def behind(self) -> list[str]:
        """The consumers that still have entries to read."""
        return [name for name, (_state, lag) in self.consumers.items() if lag]

    def wrong(self) -> list[str]:
        """The consumers that have read every entry and differ from the canonical totals (none while records are
        still staged: the totals then include rows not streamed yet)."""
        if self.staged:
            return []
        behind = set(self.behind())
        return [n for n, (state, _lag) in self.consumers.items() if n not in behind and state != self.canonical]

    def progress(self) -> tuple[int, ...]:
        """What falls while the system catches up: the staged backlog and each consumer's lag."""
        return (self.staged, *(lag for _state, lag in self.consumers.values()))


class Outcome(Enum):
    """The demo's verdict: the value is what the verdict line says."""

    AGREE = "AGREE"
    BEHIND = "did not catch up"
    DISAGREE = "DISAGREE"


def judge(snap: Snapshot) -> Outcome:
    """AGREE when every consumer equals the canonical totals; DISAGREE when one that has read every entry (with
    nothing left staged) holds something else; otherwise the consumers are behind, not wrong."""
    if snap.agree:
        return Outcome.AGREE
    return Outcome.DISAGREE if snap.wrong() else Outcome.BEHIND


def fleet_specs(
    app: App,
    api_port: int,
    rate: float,
    faults: bool,
    seed: int | None,
    spark: bool,
    metrics: dict[str, int] | None = None,
    api: str = "flask",
) -> list[ProcessSpec]:
    """The app's processes, as its Procfile runs them; the simulator last. ``metrics`` maps a process name to the
    port it serves its Prometheus metrics on (``"metrics"``: the system exporter, ``unilog metrics``); ``api``:
    ``flask`` or ``fastapi`` (see :meth:`App.api_argv`)."""
    specs = [ProcessSpec("api", app.api_argv(api_port, api)), *_fleet_specs(app, api_port, rate, faults, seed, spark)]
    if metrics:
        specs = [
            replace(spec, argv=[*spec.argv, "--metrics-port", str(metrics[spec.name])])
            if spec.name in metrics
            else spec
            for spec in specs
        ]
        if "metrics" in metrics:
            exporter = [sys.executable, "-m", "unilog", "--log-json", "metrics", "--port", str(metrics["metrics"])]
            specs.insert(-1, ProcessSpec("metrics", exporter))
    return specs


def metrics_ports(app: App, spark: bool) -> dict[str, int]:
    """A free port for each process that serves metrics, and one for the system exporter."""
    names = [*app.streamers, *app.consumers, *app.group_workers, *([app.spark_name] if spark else []), "metrics"]
    return {name: free_port() for name in names}


def _fleet_specs(
    app: App, api_port: int, rate: float, faults: bool, seed: int | None, spark: bool
) -> list[ProcessSpec]:
    py = sys.executable
    specs = []
    streamer_env = _fault_env(DEFAULT_FAULTS["streamer"] if faults else "", seed)
    for name in app.streamers:
        specs.append(ProcessSpec(name, [py, "-m", "unilog", "--log-json", "streamer", "--name", name], streamer_env))
    consumer = [py, "-m", app.module(app.consumer)]
    consumer_faults = DEFAULT_FAULTS["consumer"] if faults else ""
    for i, name in enumerate(app.consumers):
        argv = [*consumer, name, "--log-json", "--block-ms", "250"]
        specs.append(ProcessSpec(name, argv, _fault_env(consumer_faults, seed, 1 + i)))
    for i, worker in enumerate(app.group_workers):
        argv = [*consumer, app.group, "--group", "--worker", worker, "--log-json", "--block-ms", "250"]
        specs.append(ProcessSpec(worker, [*argv, "--claim-idle-ms", "2000"], _fault_env(consumer_faults, seed, 10 + i)))
    if spark and app.spark_consumer is not None:
        checkpoint = str(Path(tempfile.gettempdir()) / f"unilog-demo-spark-{os.getpid()}")
        argv = [py, "-m", app.module(app.spark_consumer), app.spark_name, "--master", "local[2]"]
        specs.append(ProcessSpec(app.spark_name, [*argv, "--checkpoint", checkpoint], spark_env()))
    sim = [py, "-m", app.module(app.simulator), "--api", f"http://127.0.0.1:{api_port}", "--rate", str(rate)]
    specs.append(ProcessSpec("simulator", sim + ([] if seed is None else ["--seed", str(seed)])))
    return specs


def _fault_env(faults: str, seed: int | None, offset: int = 0) -> dict[str, str]:
    return {"UNILOG_FAULTS": faults, **({} if seed is None else {"UNILOG_FAULT_SEED": str(seed + offset)})}


def run_demo(
    app: App,
    *,
    duration: float = 30.0,
    rate: float = 50.0,
    seed: int | None = None,
    faults: bool = True,
    spark: bool | None = None,
    log_dir: Path | None = None,
    out: TextIO | None = None,
    dashboard: int | None = None,
    redis_cluster: bool = False,
    api: str = "flask",
    stall: float = STALL_SECONDS,
    ceiling: float = CEILING_SECONDS,
    warm_up_limit: float = WARM_UP_SECONDS,
) -> Outcome:
    """Run the demo; print the live view and the verdict to ``out``; return the verdict (see :func:`judge`).

    ``spark`` None: include the Spark consumer when pyspark and Java are installed. ``dashboard``: serve
    ``unilog dashboard`` on this port while the demo runs. ``redis_cluster``: on a real Redis Cluster (three
    masters, three replicas) instead of one Redis. ``api``: ``flask`` (gunicorn) or ``fastapi`` (uvicorn, asyncio).
    ``stall`` and ``ceiling``: the catch-up wait's bounds (see :func:`settle`); ``warm_up_limit``: the longest wait
    for every consumer's first record before traffic (see :func:`warm_up`).
    """
    out = out or sys.stdout
    spark = app.spark_consumer is not None and (spark_available() if spark is None else spark)
    redis_server = EmbeddedRedisCluster() if redis_cluster else EmbeddedRedis()
    with EmbeddedPostgres() as pg, redis_server as rd:
        redis_url = rd.cluster_url if isinstance(rd, EmbeddedRedisCluster) else rd.url
        app.prepare(pg.url)
        settings = Settings.from_dsn(pg.url, redis_url, app.stream)
        consumers = [*app.consumers, *([app.spark_name] if spark else [])]
        admin.declare(settings, app.stream, consumers=consumers, groups=[app.group])
        stage_first_record(app, settings, seed)
        api_port = free_port()
        env = {**_clean_env(), "DATABASE_URL": pg.url, "REDIS_URL": redis_url, "UNILOG_STREAM": app.stream}
        logs = log_dir or Path(tempfile.mkdtemp(prefix="unilog-demo-logs-"))
        fleet = Fleet(logs, cwd=Path.cwd(), base_env=env)
        ports = metrics_ports(app, spark)
        specs = fleet_specs(app, api_port, rate, faults, seed, spark, ports, api=api)
        if dashboard is not None:
            board = [sys.executable, "-m", "unilog", "--log-json", "dashboard", "--port", str(dashboard)]
            specs.insert(-1, ProcessSpec("dashboard", board))
        try:
            for spec in specs[:-1]:
                fleet.start(spec)
            wait_for_api(api_port, fleet, timeout=30.0)
            fleet.watch()  # a process that exits is restarted from here on, the warm-up's included
            _announce(ports, dashboard, out)
            waits = _Waits(warm_up_limit, duration, stall, ceiling)
            snap, waited = _drive(app, settings, fleet, specs[-1], waits, out, spark)
        finally:
            fleet.stop_all(order=["simulator", "api", *app.streamers, *consumers, *app.group_workers])
        outcome = print_verdict(app, snap, fleet.faults(), waited, out)
    _keep_or_remove(logs, keep=log_dir is not None or outcome is not Outcome.AGREE, announce=log_dir is None, out=out)
    return outcome


@dataclass(frozen=True)
class _Waits:
    """A run's clocks, in seconds: the warm-up's bound, the traffic, the catch-up wait's stall window and ceiling."""

    warm_up: float
    traffic: float
    stall: float
    ceiling: float


def _drive(
    app: App, settings: Settings, fleet: Fleet, simulator: ProcessSpec, waits: _Waits, out: TextIO, spark: bool
) -> tuple[Snapshot, float]:
    """The fleet started: wait for every consumer's first record, then run the traffic with its live view, then wait
    for the consumers to catch up; return the last snapshot and the seconds of the wait it ended. A consumer not
    warmed up in time (or Ctrl-C first) ends the run there, before any traffic: the verdict names it behind."""
    stop = _stop_on_signals()
    late, warmed = warm_up(app, settings, stop, out, spark, limit=waits.warm_up, fleet=fleet)
    if late:
        return snapshot(app, settings, spark), warmed
    fleet.start(simulator)
    _live(app, settings, fleet, stop, waits.traffic, out, spark)
    fleet.stop(simulator.name)
    # on a machine where the first record took longer than the stall window to reach every consumer, one batch of
    # the slowest may take that long too: the window is at least the warm-up's time (the ceiling still bounds it)
    stall = min(max(waits.stall, warmed), waits.ceiling)
    return settle(app, settings, out, spark, stall=stall, ceiling=waits.ceiling)


def _announce(ports: dict[str, int], dashboard: int | None, out: TextIO) -> None:
    """Where the metrics (and the dashboard) are served."""
    print(
        f"metrics: the system at http://127.0.0.1:{ports['metrics']}/metrics; each process at "
        + ", ".join(f"{name} :{port}" for name, port in ports.items() if name != "metrics"),
        file=out,
    )
    if dashboard is not None:
        print(f"dashboard: http://127.0.0.1:{dashboard}/", file=out)


def stage_first_record(app: App, settings: Settings, seed: int | None) -> None:
    """Stage the app's first record before the fleet starts (``App.stage``, its cid ``WARM_UP_CID``), committed:
    the record every consumer must apply before traffic starts (:func:`warm_up`). Its source row counts in the
    canonical totals like any other."""
    with psycopg.connect(settings.conninfo) as conn:
        app.stage(conn, WARM_UP_CID, random.Random(seed), app.stream)


def warm_up(
    app: App,
    settings: Settings,
    stop: threading.Event,
    out: TextIO,
    spark: bool,
    *,
    limit: float = WARM_UP_SECONDS,
    every: float = WARM_UP_EVERY,
    poll: float = 0.5,
    fleet: Fleet | None = None,
) -> tuple[list[str], float]:
    """Wait until every consumer holds the canonical totals of the first record (:func:`stage_first_record`):
    each has connected, read and committed once, and a Spark consumer has run its first micro-batch, which on a
    busy machine takes minutes (its JVM, its Python workers, its jobs' code generation). Traffic starts after this,
    so the catch-up wait's verdict never depends on how fast a consumer warms up. Every ``every`` seconds one line
    names whom it still waits for (and, given the ``fleet``, how often their processes were restarted: a consumer
    that fails at once is told from a slow one). Returns the consumers still without it once ``limit`` seconds have
    passed (or ``stop`` is set), with one line naming them, and the seconds waited; no consumer when all are ready."""
    started = told = time.monotonic()
    first = f"the first {app.source_object}"
    while True:
        snap = snapshot(app, settings, spark)
        waiting = [name for name, (state, _lag) in snap.consumers.items() if state != snap.canonical]
        now = time.monotonic()
        if not waiting:
            print(f"unilog demo: every consumer applied {first} in {now - started:.0f} s; traffic starts", file=out)
            return [], now - started
        if stop.is_set() or now - started >= limit:
            why = "stopped" if stop.is_set() else f"in {limit:.0f} s"
            print(f"unilog demo: {_names(waiting)} did not apply {first} ({why}); no traffic started", file=out)
            return waiting, now - started
        if now - told >= every:
            whom = _names([_restarted(app, name, fleet) for name in waiting])
            print(f"unilog demo: waiting for {whom} to apply {first} ({now - started:.0f} s)", file=out)
            out.flush()
            told = now
        stop.wait(poll)


def _restarted(app: App, name: str, fleet: Fleet | None) -> str:
    """A consumer's name, with how often its processes (a group's: its workers) were restarted, if they were."""
    processes = app.group_workers if name == app.group else (name,)
    restarts = sum(fleet.events[f"restart:{p}"] for p in processes) if fleet is not None else 0
    return f"{name} (restarted {restarts} times: see its log)" if restarts else name


def _names(names: list[str]) -> str:
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]


def _keep_or_remove(logs: Path, keep: bool, announce: bool, out: TextIO) -> None:
    """The processes' logs: a temporary folder is removed only after a run that agreed, else kept and named
    (``announce``: the user did not choose the folder); an error on the way out leaves it in place (the error may
    name a log in it). The verdict stays the last line of a run that agreed."""
    if not keep:
        shutil.rmtree(logs, ignore_errors=True)
    elif announce:
        print(f"logs: {logs}", file=out, flush=True)


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("UNILOG_", "DATABASE_URL", "REDIS_URL"))}


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return stop


def snapshot(app: App, settings: Settings, spark: bool = False) -> Snapshot:
    """Read the demo's state: the app's totals from Postgres, lag from ``unilog status``'s report."""
    with psycopg.connect(settings.conninfo, autocommit=True) as conn:
        canonical = app.canonical_totals(conn)
        states = app.consumer_totals(conn)
        row = conn.execute("SELECT count(*) FROM staged_log_records").fetchone()
    report = collect_status(settings)
    stream = next((s for s in report["streams"] if s["name"] == app.stream), None)
    length = stream["length"] if stream else 0
    lag = {c["name"]: c["lag_entries"] for c in report["consumers"]}
    for group in stream["groups"] if stream else []:
        lag[group["name"]] = group["lag_entries"] + group["pending"]
    names = [*app.consumers, app.group, *([app.spark_name] if spark else [])]
    consumers = {name: (states.get(name), lag.get(name, length)) for name in names}
    agree = all(state == canonical for state, _lag in consumers.values())
    return Snapshot(_rows(canonical), int(row[0]) if row else 0, length, consumers, canonical, agree)


def _rows(totals: Any) -> int:
    """How many source rows the totals cover (their first count-like field), for the view."""
    fields = totals.as_dict() if hasattr(totals, "as_dict") else {}
    return next((int(v) for k, v in fields.items() if k.endswith("count")), 0)


def _show(totals: Any) -> str:
    if totals is None:
        return "(nothing applied)"
    fields = totals.as_dict() if hasattr(totals, "as_dict") else {"totals": totals}
    return " ".join(f"{k}={v}" for k, v in fields.items())


def _render(app: App, snap: Snapshot, fleet: Fleet, elapsed: float, tty: bool) -> str:
    faults = fleet.faults()
    fault_text = ", ".join(f"{k}={v}" for k, v in sorted(faults.items())) or "none yet"
    restarts = sum(v for k, v in fleet.events.items() if k.startswith("restart:"))
    if not tty:
        per = " ".join(f"{n}(lag {lag})" for n, (_state, lag) in snap.consumers.items())
        return (
            f"[{elapsed:5.1f}s] {app.source_table}={snap.rows} staged={snap.staged} stream={snap.stream_length} "
            f"{per} faults={sum(faults.values())}"
        )
    lines = [
        f"unilog demo — {app.name}   {elapsed:5.1f}s",
        "",
        f"  {app.source_table:<15} {snap.rows:>10}   canonical {_show(snap.canonical)}",
        f"  staged backlog  {snap.staged:>10}",
        f"  stream length   {snap.stream_length:>10}   ({app.stream})",
        "",
        f"  {'consumer':<12}{'lag':>8}  totals",
    ]
    lines += [f"  {n:<12}{lag:>8}  {_show(state)}" for n, (state, lag) in snap.consumers.items()]
    lines += ["", f"  faults injected: {fault_text}", f"  process restarts: {restarts}", "", "  Ctrl-C to stop"]
    return "\x1b[H\x1b[J" + "\n".join(lines)


def _live(
    app: App, settings: Settings, fleet: Fleet, stop: threading.Event, duration: float, out: TextIO, spark: bool
) -> None:
    started = time.monotonic()
    tty = out.isatty()
    while not stop.wait(1.0):
        elapsed = time.monotonic() - started
        print(_render(app, snapshot(app, settings, spark), fleet, elapsed, tty), file=out, flush=True)
        if elapsed >= duration:
            return


def settle(
    app: App,
    settings: Settings,
    out: TextIO,
    spark: bool,
    *,
    ceiling: float = CEILING_SECONDS,
    stall: float = STALL_SECONDS,
    poll: float = 0.25,
) -> tuple[Snapshot, float]:
    """Wait until the backlog is streamed and every consumer equals the canonical totals, or until nothing has
    progressed (no new low of the staged backlog or of a consumer's lag, no consumer's totals changed) for ``stall``
    seconds, or ``ceiling`` seconds in all; return the last snapshot and the seconds waited."""
    started = time.monotonic()
    bounds = f"up to {ceiling:.0f} s, or {stall:.0f} s without progress"
    print(f"unilog demo: producers stopped; letting the consumers catch up ({bounds})...", file=out, flush=True)
    best: tuple[int, ...] | None = None
    states: list[Any] = []
    progressed = started
    while True:
        snap = snapshot(app, settings, spark)
        now = time.monotonic()
        if (snap.agree and snap.staged == 0) or now - started >= ceiling:
            return snap, now - started
        lows = snap.progress() if best is None else tuple(map(min, best, snap.progress()))
        applied = [state for state, _lag in snap.consumers.values()]
        # a lower lag or backlog, or any consumer's totals changing (a reader whose lag status cannot see)
        if lows != best or applied != states:
            best, states, progressed = lows, applied, now
        elif now - progressed >= stall:
            return snap, now - started
        time.sleep(poll)


def print_verdict(app: App, snap: Snapshot, faults: dict[str, int], waited: float, out: TextIO) -> Outcome:
    """Print each consumer's state and the verdict line; return the verdict (:func:`judge`)."""
    fault_text = ", ".join(f"{k}={v}" for k, v in sorted(faults.items())) or "none"
    print(f"faults injected: {fault_text}", file=out)
    for name, (state, lag) in snap.consumers.items():
        print(f"  {name}: {_show(state)} lag={lag}", file=out)
    print(f"  canonical: {_show(snap.canonical)}", file=out)
    outcome = judge(snap)
    versus = f"the canonical totals of {snap.rows} {app.source_table} ({_show(snap.canonical)})"
    if outcome is Outcome.BEHIND:
        behind = [f"{n} (lag {snap.consumers[n][1]})" for n in snap.behind()]
        behind += [f"{snap.staged} records still staged"] if snap.staged else []
        detail = f"still behind: {', '.join(behind)}; none that caught up differs from {versus}"
        verdict = f"{outcome.value} in {waited:.0f} s — {detail}"
    else:
        verdict = f"{outcome.value} — {len(snap.consumers)} consumers vs {versus}"
        if outcome is Outcome.DISAGREE:
            verdict += f"; read everything and differ: {', '.join(snap.wrong())}"
    print(f"unilog demo verdict: {verdict}, {sum(faults.values())} faults injected", file=out, flush=True)
    return outcome
