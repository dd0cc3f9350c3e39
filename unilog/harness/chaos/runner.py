"""``run_chaos``: an application's fleet under a seeded schedule of faults, healed, quiesced, then judged."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

from unilog.config import Settings
from unilog.errors import ConfigurationError, UnilogError
from unilog.ops import admin
from unilog.ops.status import collect_status

from ..app import App
from ..embedded import EmbeddedPostgres, EmbeddedRedis, EmbeddedRedisCluster, ReplicatedPostgres, free_port
from ..proxy import FaultProxy
from ..supervisor import Fleet, ProcessSpec
from . import mirror, pgha, tables
from .checker import Verdict
from .config import ChaosConfig
from .injector import Injector
from .observe import collect, progress
from .report import consumer_report, format_summary, print_header, recoveries
from .schedule import build_schedule
from .specs import PRODUCERS, fleet_specs


@dataclass
class ChaosResult:
    verdict: Verdict
    report: dict[str, Any]
    report_path: Path | None


@dataclass
class _Servers:
    """The run's servers: URLs as the runner reaches them, as the fleet reaches them (through the fault proxies),
    the embedded servers (None when given by URL) and the proxies."""

    pg_url: str
    redis_url: str
    fleet_urls: dict[str, str]
    postgres: EmbeddedPostgres | None
    redis: EmbeddedRedis | None
    proxies: dict[str, FaultProxy]
    notes: list[str]
    cluster: EmbeddedRedisCluster | None = None
    pair: ReplicatedPostgres | None = None

    def kinds(self) -> list[str]:
        """The servers the schedule may restart, pause, (a cluster's masters) kill or (a pair) fail over."""
        kinds = ["postgres"] if self.postgres is not None else ["postgres_ha"] if self.pair is not None else []
        return kinds + (["redis"] if self.redis is not None else []) + (["redis_cluster"] if self.cluster else [])

    def describe(self) -> dict[str, str]:
        redis = "given"
        if self.redis is not None:
            redis = f"embedded {self.redis.version} (appendonly yes, appendfsync always)"
        elif self.cluster is not None:
            redis = f"embedded Redis Cluster {self.cluster.nodes[0].version}: 3 masters, 3 replicas"
        postgres = f"embedded {self.postgres.version}" if self.postgres else "given"
        if self.pair is not None:
            postgres = f"embedded {self.pair.binaries.version}: a primary and a synchronous streaming standby"
        return {"postgres": postgres, "redis": redis}


def run_chaos(
    app: App, config: ChaosConfig, *, out: TextIO | None = None, stop: threading.Event | None = None
) -> ChaosResult:
    """Run ``app``'s fleet under the seeded fault schedule, heal, quiesce, check; print a summary; write the report."""
    out = out or sys.stdout
    stop = stop or threading.Event()
    handler = config.handler or app.default_handler
    # fail now, not in every consumer process; found where the fleet's processes find it
    admin.load_handler(handler, search=[os.getcwd(), *config.pythonpath])
    compare = handler == app.default_handler if config.compare_states is None else config.compare_states
    log_dir = Path(config.log_dir) if config.log_dir else Path(tempfile.mkdtemp(prefix=f"unilog-chaos-{config.seed}-"))
    report: dict[str, Any] = {
        "seed": config.seed,
        "duration": config.duration,
        "handler": handler,
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
    }
    with contextlib.ExitStack() as stack:
        servers = _start_servers(stack, config)
        report["servers"] = servers.describe()
        _prepare(app, config, servers)
        verdict = _run(app, config, servers, log_dir, handler, compare, report, stop, out)
    return _finish(config, report, verdict, log_dir, out)


def _start_servers(stack: contextlib.ExitStack, config: ChaosConfig) -> _Servers:
    notes: list[str] = []
    pg = rd = cluster = pair = None
    if config.database_url and config.postgres_ha:
        raise ConfigurationError("--pg-ha runs its own Postgres pair: leave out --database-url")
    if config.database_url:
        pg_url = config.database_url
        notes.append("Postgres given by URL: its restarts are skipped")
    elif config.postgres_ha:
        pair = pgha.start_pair(stack)
        pg_url = pair.url
    else:
        pg = stack.enter_context(EmbeddedPostgres())
        pg_url = pg.url
    if config.redis_url:
        redis_url = config.redis_url
        notes.append("Redis given by URL: its restarts and pauses are skipped")
    elif config.redis_cluster:
        cluster = stack.enter_context(EmbeddedRedisCluster())
        redis_url = cluster.cluster_url
        notes.append("Redis Cluster: clients follow the nodes' own addresses, so no fault proxy; masters are killed")
    else:
        rd = stack.enter_context(EmbeddedRedis(appendonly=True, appendfsync="always"))
        redis_url = rd.url
    proxies: dict[str, FaultProxy] = {}
    fleet_urls = {}
    if pair is not None:
        pair_proxies, fleet_urls["postgres"] = pgha.start_proxies(stack, pair)
        proxies.update(pair_proxies)
        notes.append(
            "Postgres HA: a fault proxy in front of each node (postgres_a, postgres_b), the fleet on the multi-host "
            "URL over them; the primary fails over (pg_failover) instead of restarting"
        )
    for side, url in (("postgres", pg_url), ("redis", redis_url)):
        if side in fleet_urls:
            continue
        if side == "redis" and cluster is not None:
            fleet_urls[side] = url
            continue
        proxy = _proxy_for(url)
        if proxy is None:
            notes.append(f"{side} is not on a loopback TCP address: no fault proxy, its network faults skipped")
            fleet_urls[side] = url
            continue
        proxies[side] = stack.enter_context(proxy)
        fleet_urls[side] = proxy.url_for(url)
    return _Servers(pg_url, redis_url, fleet_urls, pg, rd, proxies, notes, cluster, pair)


def _prepare(app: App, config: ChaosConfig, servers: _Servers) -> None:
    """The app's tables and the chaos tables; refuse servers that already hold the app's data (they must be
    throw-away); then declare every consumer and the group before any traffic, as a deployment does: one that
    starts late (the Spark consumer's JVM takes seconds) must find its history still there."""
    app.prepare(servers.pg_url)
    consumers = config.consumers(app)
    with tables.connect(servers.pg_url, autocommit=True) as conn:
        tables.create(conn)
        found = tables.nonempty(conn, app)
    settings = Settings.from_dsn(servers.pg_url, servers.redis_url, app.stream)
    status = collect_status(settings)
    for stream in status.get("streams", []):
        if stream["name"] == app.stream and (stream["length"] or stream["dead_letters"]):
            found[f"redis {app.stream}"] = stream["length"]
    for checkpoint in status.get("consumers", []):  # a registration alone (never ran) is no checkpoint
        if checkpoint["name"] in consumers and not checkpoint.get("never_ran"):
            found["unilog_checkpoints"] = found.get("unilog_checkpoints", 0) + 1
    if found:
        raise ConfigurationError(
            "unilog chaos needs throw-away servers without the app's data, found: "
            + ", ".join(f"{k} ({v})" for k, v in found.items())
        )
    admin.declare(settings, app.stream, consumers=consumers, groups=[app.group])
    if config.backfill_rows:
        with tables.connect(servers.pg_url, autocommit=True) as conn:
            tables.create_accounts(conn, config.backfill_rows)
        admin.declare(settings, mirror.STREAM, consumers=[mirror.CONSUMER])
    if config.capture == "wal":
        admin.enable_wal_capture(settings)


def _run(
    app: App,
    config: ChaosConfig,
    servers: _Servers,
    log_dir: Path,
    handler: str,
    compare: bool,
    report: dict[str, Any],
    stop: threading.Event,
    out: TextIO,
) -> Verdict:
    history_dir, state_dir = log_dir / "history", log_dir / "state"
    for directory in (history_dir, state_dir):
        directory.mkdir(parents=True, exist_ok=True)
    api_port = free_port()
    fleet = Fleet(log_dir, cwd=Path.cwd(), base_env=_fleet_env(app, config, servers))
    specs = fleet_specs(app, config, handler, api_port=api_port, history_dir=history_dir, state_dir=state_dir)
    if config.backfill_rows:
        specs += mirror.specs(config, sys.executable, state_dir)
    names = [s.name for s in specs]
    schedule = build_schedule(
        config.seed, config.duration, names, config.faults, servers=servers.kinds(), proxies=list(servers.proxies)
    )
    report.update(notes=servers.notes, schedule=[e.to_dict() for e in schedule], log_dir=str(log_dir))
    print_header(config, handler, report, specs, schedule, out)
    injector = _injector(app, config, servers, fleet)
    consumers = config.consumers(app)
    outcome: dict[str, Any] = {"quiesced": False, "quiesce_seconds": 0.0}
    try:
        _start_fleet(app, fleet, specs, api_port)
        t0 = time.monotonic()
        injector.start(schedule, t0)
        _chaos_phase(app, config, servers, consumers, fleet, injector, stop, t0, out)
        print(f"[{time.monotonic() - t0:6.1f}s] healing: proxies pass, processes continued, servers up", file=out)
        injector.heal()
        for name in ("simulator", *PRODUCERS, "api", *(["updater"] if config.backfill_rows else [])):
            fleet.stop(name)
        print(f"[{time.monotonic() - t0:6.1f}s] producers stopped; waiting for the system to quiesce", file=out)
        began = time.monotonic()
        outcome["quiesced"] = _quiesce(app, servers, consumers, config.quiesce_timeout, out, t0)
        if config.backfill_rows:
            settings = Settings.from_dsn(servers.pg_url, servers.redis_url, app.stream)
            outcome["backfill_settled"] = mirror.settle(settings, config.quiesce_timeout, out, t0)
        outcome["quiesce_seconds"] = round(time.monotonic() - began, 1)
    finally:
        injector.heal()
        order = ["simulator", *PRODUCERS, "api", *app.streamers, *consumers, *app.group_workers]
        order += list(mirror.PROCESSES) if config.backfill_rows else []
        outcome["exit_codes"] = fleet.stop_all(order=order)
    verdict = _judge(app, servers, consumers, compare, history_dir, log_dir, fleet, injector, report, outcome)
    if config.backfill_rows:
        settings = Settings.from_dsn(servers.pg_url, servers.redis_url, app.stream)
        found, counts = mirror.judge(servers.pg_url, settings)
        verdict.violations += found
        verdict.counts.update(counts)
        report["verdict"] = verdict.to_dict()
    return verdict


def _injector(app: App, config: ChaosConfig, servers: _Servers, fleet: Fleet) -> Injector:
    return Injector(
        fleet,
        servers.postgres,
        servers.redis,
        servers.proxies,
        cluster=servers.cluster,
        stream=app.stream,
        pair=servers.pair,
        capture=config.capture,
        redis_url=servers.redis_url,
    )


def _judge(
    app: App,
    servers: _Servers,
    consumers: Sequence[str],
    compare: bool,
    history_dir: Path,
    log_dir: Path,
    fleet: Fleet,
    injector: Injector,
    report: dict[str, Any],
    outcome: dict[str, Any],
) -> Verdict:
    """Collect what the run left, check it, and complete the report."""
    observation = collect(
        app, servers.pg_url, servers.redis_url, [history_dir], consumers=consumers, compare_states=compare
    )
    verdict = observation.check()
    report.update(
        faults={"injected": injector.counts(), "library": dict(sorted(fleet.faults().items()))},
        executed=[
            {**e.event.to_dict(), "at_actual": e.at, "status": e.status, "detail": e.detail}
            for e in sorted(injector.executed, key=lambda e: e.at)
        ],
        recoveries=recoveries(fleet, log_dir),
        **outcome,
        consumers=consumer_report(observation, verdict),
        verdict=verdict.to_dict(),
    )
    if injector.failovers is not None:
        report["pg_failovers"] = pgha.figures(injector.failovers.done, servers.pg_url)
    return verdict


def _fleet_env(app: App, config: ChaosConfig, servers: _Servers) -> dict[str, str]:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("UNILOG_", "DATABASE_URL", "REDIS_URL"))}
    paths = [os.getcwd(), *config.pythonpath, *filter(None, [os.environ.get("PYTHONPATH")])]
    return {
        **inherited,
        "DATABASE_URL": servers.fleet_urls["postgres"],
        "REDIS_URL": servers.fleet_urls["redis"],
        "UNILOG_STREAM": app.stream,
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
    }


def _start_fleet(app: App, fleet: Fleet, specs: Sequence[ProcessSpec], api_port: int) -> None:
    by_name = {s.name: s for s in specs}
    fleet.start(by_name["api"])
    wait_for_api(api_port, fleet)
    for spec in specs:
        if spec.name != "api":
            fleet.start(spec)
    fleet.watch()


def _finish(config: ChaosConfig, report: dict[str, Any], verdict: Verdict, log_dir: Path, out: TextIO) -> ChaosResult:
    report_path = config.report_path or Path(f"chaos-report-{config.seed}.json")
    report_path.write_text(json.dumps(report, indent=2, default=str))
    print(format_summary(report, report_path), file=out, flush=True)
    keep = not verdict.ok or config.keep_logs is True or (config.keep_logs is None and config.log_dir is not None)
    if not keep:
        shutil.rmtree(log_dir, ignore_errors=True)
        print(f"logs removed (the run passed; give a log folder to keep them): {log_dir}", file=out, flush=True)
    return ChaosResult(verdict, report, report_path)


def _proxy_for(url: str) -> FaultProxy | None:
    parts = urlsplit(url)
    if parts.scheme.partition("+")[0] not in ("postgres", "postgresql", "redis"):
        return None
    port = parts.port or (6379 if parts.scheme.startswith("redis") else 5432)
    try:
        return FaultProxy(parts.hostname or "", port)
    except ValueError:
        return None


def wait_for_api(port: int, fleet: Fleet, timeout: float = 60.0) -> None:
    """Wait until the app's API (process ``api``, started and not yet watched) answers ``GET /health``; refuse once
    it has exited or after ``timeout`` seconds, with the last line of its log (the log is kept: the caller keeps
    its log folder when it fails)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            if not fleet.running("api"):
                break
            time.sleep(0.2)
    child = fleet.children.get("api")
    code = child.popen.poll() if child is not None else None
    if child is not None:
        child.reader.join(2)  # what it printed before it exited, into its log
    how = f"it exited with code {code}" if code is not None else f"no answer on port {port} in {timeout:g} s"
    path = fleet.log_dir / "api.log"
    raise UnilogError(f"the API did not come up ({how}); its log's last line: {_last_line(path)}; whole log: {path}")


def _last_line(path: Path) -> str:
    """The last non-empty line of a log, whitespace collapsed (for a one-line error)."""
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError as exc:
        return f"(unreadable: {exc.strerror or exc})"
    return " ".join(lines[-1].split()) if lines else "(empty)"


def _chaos_phase(
    app: App,
    config: ChaosConfig,
    servers: _Servers,
    consumers: Sequence[str],
    fleet: Fleet,
    injector: Injector,
    stop: threading.Event,
    t0: float,
    out: TextIO,
) -> None:
    next_status = t0 + config.status_interval
    while not stop.wait(min(1.0, max(0.0, t0 + config.duration - time.monotonic()))):
        now = time.monotonic()
        if now - t0 >= config.duration:
            return
        if now >= next_status:
            next_status += config.status_interval
            line = _status_line(app, now - t0, servers, consumers, fleet, injector)
            print(line, file=out, flush=True)


def _status_line(
    app: App, elapsed: float, servers: _Servers, consumers: Sequence[str], fleet: Fleet, injector: Injector
) -> str:
    try:
        p = progress(app, servers.pg_url, servers.redis_url, consumers=consumers)
        lags = " ".join(f"{n}={lag}" for n, lag in p.lag.items())
        state = (
            f"{app.source_table}={p.rows} staged={p.staged} stream={p.stream_length} lag {lags} "
            f"pending={sum(p.pending.values())}"
        )
    except Exception as exc:
        state = f"(servers unavailable: {type(exc).__name__})"
    done = Counter(e.event.kind for e in injector.executed if e.status == "done")
    faults = " ".join(f"{k}={v}" for k, v in sorted(done.items())) or "none yet"
    restarts = sum(v for k, v in fleet.events.items() if k.startswith("restart:"))
    return f"[{elapsed:6.1f}s] {state} | faults {faults} | process restarts {restarts}"


def _quiesce(app: App, servers: _Servers, consumers: Sequence[str], timeout: float, out: TextIO, t0: float) -> bool:
    """Wait until nothing is staged, every consumer is at the end and nothing is pending, three polls in a row."""
    deadline = time.monotonic() + timeout
    quiet_polls, last_print = 0, time.monotonic()
    while True:
        try:
            now = progress(app, servers.pg_url, servers.redis_url, consumers=consumers)
            quiet_polls = quiet_polls + 1 if now.quiet else 0
            summary = f"staged={now.staged} lag={now.lag} pending={now.pending} dead letters={now.dead_letters}"
        except Exception as exc:
            quiet_polls, summary = 0, f"servers unavailable: {exc!r}"
        if quiet_polls >= 3:
            return True
        if time.monotonic() > deadline:
            print(f"[{time.monotonic() - t0:6.1f}s] did not quiesce within {timeout:.0f}s: {summary}", file=out)
            if "staged=0 " not in summary:
                for line in tables.staged_diagnosis(servers.pg_url):
                    print(f"  diagnosis: {line}", file=out)
            return False
        if time.monotonic() - last_print >= 10:
            last_print = time.monotonic()
            print(f"[{time.monotonic() - t0:6.1f}s] quiescing: {summary}", file=out, flush=True)
        time.sleep(0.5)
