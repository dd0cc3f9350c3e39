"""``python -m bench [--quick] [--only drain,latency] [--out FILE]``: run the benchmarks, print the table and targets,
write the JSON (default ``bench/results/<timestamp>.json``). The soak runs only when named: ``python -m bench --only
soak --minutes 60`` (exit 1, with one line naming what failed, if a series grows without bound)."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from unilog.harness.embedded import SERVERS_DIR_ENV

from . import sysinfo
from .backfill import run_backfill, run_backfill_fleet
from .bigtx import run_bigtx
from .commits import run_commits
from .consume import run_consume
from .consume_streams import run_consume_streams
from .core import FULL, QUICK, Profile, Results, log, preload, worker_init
from .curves import run_curves
from .drain import run_drain, run_drain_streams
from .env import BenchEnv
from .horizon import run_horizon
from .latency import run_latency
from .many_streams import run_many_streams
from .memory import run_memory
from .observe import run_observe
from .produce import run_produce, run_produce_clients
from .report import render, targets, write_json
from .shards import run_shards
from .soak import VARIANTS as SOAK_VARIANTS
from .soak import failures as soak_failures
from .soak import run_soak
from .spark import run_spark
from .status import run_status
from .typed import run_typed

Workload = Callable[[BenchEnv, Profile, Results], None]

WORKLOADS: dict[str, Workload] = {
    "drain": run_drain,
    "drain_streams": run_drain_streams,
    "many_streams": run_many_streams,
    "latency": run_latency,
    "horizon": run_horizon,
    "produce": run_produce,
    "produce_clients": run_produce_clients,
    "consume": run_consume,
    "consume_streams": run_consume_streams,
    "memory": run_memory,
    "bigtx": run_bigtx,
    "backfill": run_backfill,
    "backfill_fleet": run_backfill_fleet,
    "commits": run_commits,
    "spark": run_spark,
    "observe": run_observe,
    "shards": run_shards,
    "curves": run_curves,
    "typed": run_typed,
    "soak": run_soak,
    "status": run_status,
}
# Run only when named in --only: an hour's soak is not part of a benchmark run, quick or full; the fleet beside a
# backfill (issue 27: about 45 s quick, 4 minutes full) would take the quick profile past its 5 minutes; status sets up
# 10,000 streams.
OPT_IN = ("soak", "backfill_fleet", "status")
RESULTS_DIR = Path(__file__).resolve().parent / "results"
SETUP = [
    "one embedded Postgres (fsync on, synchronous_commit on) and one Redis (appendonly yes, appendfsync always,"
    " auto-aof-rewrite off: the AOF is rewritten between trials instead) for the whole run, on this host",
    "variants of a workload run interleaved (A B C A B C ...); each drain/consume trial in a fresh process, forked"
    " from a forkserver that only imported the workloads' modules",
    "drain trials start from empty tables and Redis; backlog staged in one statement, then VACUUM ANALYZE, CHECKPOINT",
]


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer rounds (a few minutes)")
    parser.add_argument("--only", help=f"comma-separated subset of: {', '.join(WORKLOADS)}")
    parser.add_argument("--out", type=Path, help="JSON output (default: bench/results/<timestamp>.json)")
    parser.add_argument("--minutes", type=float, help="soak: minutes per variant (default 60)")
    parser.add_argument("--soak-variants", help=f"soak: comma-separated, of {', '.join(SOAK_VARIANTS)}")
    parser.add_argument("--soak-rate", type=int, help="soak: records per second produced (default 200)")
    args = parser.parse_args(argv)
    args.workloads = args.only.split(",") if args.only else [w for w in WORKLOADS if w not in OPT_IN]
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s): {', '.join(unknown)}")
    variants = args.soak_variants.split(",") if args.soak_variants else []
    if [v for v in variants if v not in SOAK_VARIANTS]:
        parser.error(f"unknown soak variant(s) in {args.soak_variants!r}; known: {', '.join(SOAK_VARIANTS)}")
    if any(v is not None and v <= 0 for v in (args.minutes, args.soak_rate)):
        parser.error("--minutes and --soak-rate must be positive")
    return args


def _soak_options(profile: Profile, args: argparse.Namespace, out: Path) -> Profile:
    """The profile with the soak's options from the command line; its plot goes next to ``--out`` when given."""
    changes: dict[str, Any] = {"soak_plot": str(out.with_suffix(".png"))} if args.out else {}
    if args.minutes is not None:
        changes["soak_minutes"] = args.minutes
    if args.soak_variants:
        changes["soak_variants"] = tuple(args.soak_variants.split(","))
    if args.soak_rate is not None:
        changes["soak_rate"] = args.soak_rate
    return dataclasses.replace(profile, **changes)


def _run_workloads(
    env: BenchEnv, profile: Profile, names: list[str], results: Results, out: Path, context: dict[str, Any]
) -> dict[str, float]:
    """Run the workloads; after each, the JSON so far goes to ``out`` (a run cut short keeps what it measured)."""
    durations: dict[str, float] = context.setdefault("workload_seconds", {})
    for name in names:
        started = time.monotonic()
        WORKLOADS[name](env, profile, results)
        durations[name] = round(time.monotonic() - started, 1)
        write_json(out, results, profile, targets(results, profile), {**context, "partial": f"through {name}"})
    return durations


def _context(env: BenchEnv, profile: Profile) -> dict[str, Any]:
    context: dict[str, Any] = {"machine": sysinfo.machine(), "load_average_before": sysinfo.load_average()}
    context["fsync_per_second"] = round(sysinfo.fsync_rate(env.pg.base_dir), 1)
    if profile.name == FULL.name:
        log("pg_test_fsync (about 15 s)")
        context["pg_test_fsync"] = sysinfo.pg_test_fsync(env)
    else:
        context["pg_test_fsync"] = "skipped in quick mode (see fsync_per_second)"
    context["servers"] = sysinfo.servers(env)
    context["setup"] = SETUP
    context["software"] = sysinfo.software()
    return context


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    # the figures are a disk's (fsync on, appendfsync always), as every earlier run's: no server of the run in RAM
    os.environ.setdefault(SERVERS_DIR_ENV, "/tmp")
    profile = QUICK if args.quick else FULL
    worker_init()
    preload()
    started = time.monotonic()
    out = args.out or RESULTS_DIR / f"{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-{profile.name}.json"
    profile = _soak_options(profile, args, out)
    log(f"starting Postgres (fsync on) and Redis (appendonly yes, appendfsync always); {profile.name} mode")
    env = BenchEnv().start()
    results = Results()
    try:
        context = _context(env, profile)
        context["workload_seconds"] = _run_workloads(env, profile, args.workloads, results, out, context)
    finally:
        env.stop()
    context["load_average_after"] = sysinfo.load_average()
    context["total_seconds"] = round(time.monotonic() - started, 1)
    found = targets(results, profile)
    print(render(results, profile, found))
    print(
        f"\nload average before {context['load_average_before']}, after {context['load_average_after']}; "
        f"{context['machine']['cpu_count']} CPUs; fsync {context['fsync_per_second']:,.0f}/s; "
        f"total {context['total_seconds']:.0f} s ({context['workload_seconds']})"
    )
    write_json(out, results, profile, found, context)
    print(f"results: {out}")
    failed = soak_failures(results)
    if failed:
        print(f"soak FAILED: {'; '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
