"""``unilog demo``: the Rocket Rides fleet on embedded Postgres and Redis, with a live view and a verdict.

It starts throw-away servers (Redis with ``appendfsync always``), prepares the database, and runs the fleet from
``services/`` as separate processes: the API under gunicorn, two streamers (active and standby), two distance
consumers and the simulator. Faults are injected as in the reference design: the streamer double-sends 10 % of
its batches and each consumer crashes before committing 10 % of the time. A terminal view refreshes every
second. After ``duration`` seconds (or Ctrl-C) the simulator stops, the consumers catch up, and one verdict line
says whether every consumer equals the canonical totals of the ``rides`` table.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import psycopg

from . import engine, store
from .embedded import EmbeddedPostgres, EmbeddedRedis, free_port
from .errors import ConfigurationError
from .fleet import Fleet, ProcessSpec

STREAM = "rocket-rides-log"
CONSUMERS = ("consumer0", "consumer1")
GROUP = "group0"  # a consumer group of two workers, its state shared under the group's name
GROUP_WORKERS = ("group0-a", "group0-b")
SPARK_CONSUMER = "spark0"  # the distance consumer on Spark, when pyspark and Java are installed


def spark_available() -> bool:
    """Whether the Spark consumer can run here (pyspark importable, a Java runtime on PATH)."""
    import importlib.util
    import shutil

    return importlib.util.find_spec("pyspark") is not None and shutil.which("java") is not None


STREAMERS = ("streamer", "streamer2")  # one publishes, the other stands by
DEFAULT_FAULTS = {
    "streamer": "streamer.double_send=0.1",
    "consumer": "consumer.crash_before_commit=0.1",
}


def project_root() -> Path:
    """The checkout holding ``services/`` (the demo app is not part of the installed package)."""
    for candidate in (Path(__file__).resolve().parent.parent, Path.cwd()):
        if (candidate / "services" / "api.py").exists():
            return candidate
    raise ConfigurationError("the demo needs the unilog source checkout (services/ not found): run it from there")


@dataclass
class Snapshot:
    """What the live view shows, read from the servers themselves."""

    rides: int
    staged: int
    stream_length: int
    consumers: dict[str, tuple[str, int, int]]  # name -> (total distance, ride count, lag in entries)
    canonical: Any
    agree: bool


def fleet_specs(
    root: Path, api_port: int, rate: float, faults: bool, seed: int | None, spark: bool = False
) -> list[ProcessSpec]:
    """The demo's processes, as the Procfile runs them."""
    py = sys.executable
    streamer_faults = DEFAULT_FAULTS["streamer"] if faults else ""
    consumer_faults = DEFAULT_FAULTS["consumer"] if faults else ""
    seed_env = {} if seed is None else {"UNILOG_FAULT_SEED": str(seed)}
    specs = [
        ProcessSpec(
            "api",
            [
                py,
                "-m",
                "gunicorn",
                "--bind",
                f"127.0.0.1:{api_port}",
                "--workers",
                "2",
                "--threads",
                "4",
                "services.api:app",
            ],
        ),
        *(
            ProcessSpec(
                name,
                [py, "-m", "unilog", "--log-json", "streamer", "--name", name],
                {"UNILOG_FAULTS": streamer_faults, **seed_env},
            )
            for name in STREAMERS
        ),
    ]
    for i, name in enumerate(CONSUMERS):
        consumer_seed = {} if seed is None else {"UNILOG_FAULT_SEED": str(seed + 1 + i)}
        specs.append(
            ProcessSpec(
                name,
                [py, "-m", "services.consumer", name, "--log-json", "--block-ms", "250"],
                {"UNILOG_FAULTS": consumer_faults, **consumer_seed},
            )
        )
    for i, worker in enumerate(GROUP_WORKERS):
        worker_seed = {} if seed is None else {"UNILOG_FAULT_SEED": str(seed + 10 + i)}
        specs.append(
            ProcessSpec(
                worker,
                [
                    py,
                    "-m",
                    "services.consumer",
                    GROUP,
                    "--group",
                    "--worker",
                    worker,
                    "--log-json",
                    "--block-ms",
                    "250",
                    "--claim-idle-ms",
                    "2000",
                ],
                {"UNILOG_FAULTS": consumer_faults, **worker_seed},
            )
        )
    if spark:
        specs.append(
            ProcessSpec(
                SPARK_CONSUMER,
                [
                    py,
                    "-m",
                    "services.spark_consumer",
                    SPARK_CONSUMER,
                    "--master",
                    "local[2]",
                    "--checkpoint",
                    str(Path(tempfile.gettempdir()) / f"unilog-demo-spark-{os.getpid()}"),
                ],
            )
        )
    sim = [py, "-m", "services.simulator", "--api", f"http://127.0.0.1:{api_port}", "--rate", str(rate)]
    specs.append(ProcessSpec("simulator", sim + ([] if seed is None else ["--seed", str(seed)])))
    return specs


def run_demo(
    *,
    duration: float = 30.0,
    rate: float = 50.0,
    seed: int | None = None,
    faults: bool = True,
    spark: bool | None = None,
    log_dir: Path | None = None,
    out: TextIO | None = None,
) -> bool:
    """Run the demo; print the live view and the verdict to ``out``; return True iff every consumer agrees.

    ``spark`` None: include the Spark consumer when pyspark and Java are installed.
    """
    out = out or sys.stdout
    spark = spark_available() if spark is None else spark
    root = project_root()
    sys.path.insert(0, str(root))
    from services.migrate import prepare

    with tempfile.TemporaryDirectory(prefix="unilog-demo-") as tmp, EmbeddedPostgres() as pg, EmbeddedRedis() as rd:
        prepare(pg.url)
        _declare_consumers(rd.url, spark)
        api_port = free_port()
        env = {"DATABASE_URL": pg.url, "REDIS_URL": rd.url, "UNILOG_STREAM": STREAM, "PYTHONPATH": str(root)}
        fleet = Fleet(log_dir or Path(tmp) / "logs", cwd=root, base_env={**_clean_env(), **env})
        stop = _stop_on_signals()
        specs = fleet_specs(root, api_port, rate, faults, seed, spark)
        try:
            for spec in specs[:-1]:
                fleet.start(spec)
            _wait_for_api(api_port, fleet)
            fleet.start(specs[-1])
            fleet.watch()
            _live(pg.url, rd.url, fleet, stop, duration, out, spark)
            fleet.stop("simulator")
            snap = _settle(pg.url, rd.url, fleet, out, spark)
        finally:
            codes = fleet.stop_all(
                order=["simulator", "api", *STREAMERS, *CONSUMERS, *GROUP_WORKERS, *([SPARK_CONSUMER] if spark else [])]
            )
        _print_verdict(snap, fleet, codes, out)
        return snap.agree


def _declare_consumers(redis_url: str, spark: bool) -> None:
    """Register every consumer before traffic starts (a deploy step): retention must not trim what a consumer that
    starts later (the Spark one takes seconds) has not read."""
    api = engine.RedisStreams(engine.connect(redis_url))
    try:
        for name in (*CONSUMERS, *([SPARK_CONSUMER] if spark else [])):
            api.register(STREAM, name, "0-0")
        api.ensure_group(STREAM, GROUP)
    finally:
        api.close()


def _clean_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("UNILOG_", "DATABASE_URL", "REDIS_URL"))}


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return stop


def _wait_for_api(port: int, fleet: Fleet, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise ConfigurationError(f"the demo API did not come up; see {fleet.log_dir / 'api.log'}")


def snapshot(pg_url: str, redis_url: str, spark: bool = False) -> Snapshot:
    """Read the demo's state from Postgres and Redis."""
    from services.rides import canonical_totals, consumer_totals

    with psycopg.connect(pg_url, autocommit=True) as conn:
        canonical = canonical_totals(conn)
        states = consumer_totals(conn)
        staged, _age = store.staged_backlog(conn)
        checkpoints = {cp.name: cp for cp in store.list_checkpoints(conn)}
    client = engine.connect(redis_url)
    try:
        streams = engine.RedisStreams(client)
        length = streams.info(STREAM).length
        consumers = {}
        for name in CONSUMERS:
            cp = checkpoints.get(name)
            consumers[name] = _row(states.get(name), streams.entries_after(STREAM, cp.last_id) if cp else length)
        group = next((g for g in streams.groups(STREAM) if g["name"] == GROUP), None)
        group_lag = streams.entries_after(STREAM, str(group["last-delivered-id"])) if group else length
        consumers[GROUP] = _row(states.get(GROUP), group_lag + (int(group["pending"]) if group else 0))
        if spark:
            cp = checkpoints.get(SPARK_CONSUMER)
            lag = streams.entries_after(STREAM, cp.last_id) if cp else length
            consumers[SPARK_CONSUMER] = _row(states.get(SPARK_CONSUMER), lag)
    finally:
        client.close()
    agree = all(states.get(n) == canonical for n in consumers)
    return Snapshot(canonical.ride_count, staged, length, consumers, canonical, agree)


def _row(state: Any, lag: int) -> tuple[str, int, int]:
    return (str(state.total_distance) if state else "0", state.ride_count if state else 0, lag)


def _render(snap: Snapshot, fleet: Fleet, elapsed: float, tty: bool) -> str:
    faults = fleet.faults()
    fault_text = ", ".join(f"{k}={v}" for k, v in sorted(faults.items())) or "none yet"
    restarts = sum(v for k, v in fleet.events.items() if k.startswith("restart:"))
    if not tty:
        per = " ".join(f"{n}={c[1]}(lag {c[2]})" for n, c in snap.consumers.items())
        return (
            f"[{elapsed:5.1f}s] rides={snap.rides} staged={snap.staged} stream={snap.stream_length} {per} "
            f"faults={sum(faults.values())}"
        )
    lines = [
        f"unilog demo — Rocket Rides   {elapsed:5.1f}s",
        "",
        f"  rides created   {snap.rides:>10}   canonical distance {snap.canonical.total_distance}",
        f"  staged backlog  {snap.staged:>10}",
        f"  stream length   {snap.stream_length:>10}   ({STREAM})",
        "",
        f"  {'consumer':<12}{'total distance':>18}{'rides':>10}{'lag':>8}",
    ]
    lines += [f"  {n:<12}{c[0]:>18}{c[1]:>10}{c[2]:>8}" for n, c in snap.consumers.items()]
    lines += ["", f"  faults injected: {fault_text}", f"  process restarts: {restarts}", "", "  Ctrl-C to stop"]
    return "\x1b[H\x1b[J" + "\n".join(lines)


def _live(
    pg_url: str, redis_url: str, fleet: Fleet, stop: threading.Event, duration: float, out: TextIO, spark: bool
) -> None:
    started = time.monotonic()
    tty = out.isatty()
    while not stop.wait(1.0):
        elapsed = time.monotonic() - started
        print(_render(snapshot(pg_url, redis_url, spark), fleet, elapsed, tty), file=out, flush=True)
        if elapsed >= duration:
            return


def _settle(pg_url: str, redis_url: str, fleet: Fleet, out: TextIO, spark: bool, timeout: float = 120.0) -> Snapshot:
    """Wait until the backlog is streamed and every consumer equals the canonical totals (or the timeout)."""
    deadline = time.monotonic() + timeout
    print("unilog demo: producers stopped; letting the consumers catch up...", file=out, flush=True)
    while True:
        snap = snapshot(pg_url, redis_url, spark)
        if (snap.agree and snap.staged == 0) or time.monotonic() > deadline:
            return snap
        time.sleep(0.25)


def _print_verdict(snap: Snapshot, fleet: Fleet, codes: dict[str, int | None], out: TextIO) -> None:
    faults = fleet.faults()
    fault_text = ", ".join(f"{k}={v}" for k, v in sorted(faults.items())) or "none"
    print(f"faults injected: {fault_text}", file=out)
    for name, (total, count, lag) in snap.consumers.items():
        print(f"  {name}: total_distance={total} rides={count} lag={lag}", file=out)
    c = snap.canonical
    print(f"  canonical: total_distance={c.total_distance} rides={c.ride_count} checksum={c.checksum}", file=out)
    verdict = "AGREE" if snap.agree else "DISAGREE"
    print(
        f"unilog demo verdict: {verdict} — {len(snap.consumers)} consumers vs canonical totals of {c.ride_count} rides "
        f"(total, count and checksum), {sum(faults.values())} faults injected",
        file=out,
        flush=True,
    )
