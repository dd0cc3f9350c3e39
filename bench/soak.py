"""``soak``: the fleet at a steady rate for ``--minutes``, sampled every :data:`SAMPLE_EVERY` seconds; fails if any
series grows without bound. ``python -m bench --only soak --minutes 60 [--soak-variants wal-faults]
[--soak-rate 200]``; not in the default run nor in ``--quick`` (a soak is long by nature).

Each variant runs the real processes of a fleet on the bench's servers, from empty tables and Redis: a producer
process (one connection, an open-loop schedule of ``--soak-rate`` single-record transactions a second, each an
``emit``), ``unilog streamer``, a checkpoint consumer and a consumer group's worker (``unilog consume``; each
handler adds its batch's count to a state row in its own transaction, see :mod:`bench.handlers`), the exporter
(``unilog metrics``) and the dashboard (``unilog dashboard``), each fetched at every sample as Prometheus and an open
page would. Variants:

* ``table`` / ``wal``: table mode, or WAL capture mode (``unilog capture wal`` before the processes start);
* ``-faults``: the reference's faults inside the processes (as ``unilog demo`` injects them: the streamer
  double-sends 10 % of its batches, each consumer crashes before committing 10 % of its batches and restarts
  in-process), and every process reaches Postgres and Redis through a :class:`~unilog.harness.proxy.FaultProxy`
  that cuts all their connections (RST) every minute (Redis) and every five minutes (Postgres);
* ``table-leak``: table mode with a checkpoint handler that keeps 1 kB per record (``bench.handlers:soak_leaky``),
  a deliberate leak the check must report (its RSS series grows; the run exits 1).

Sampled (:func:`bench.soakfleet.sample`): every process's RSS (``VmRSS``) and CPU time; each consumer's lag in
entries and seconds and the group's pending entries, as ``unilog status --json`` reports them
(:func:`unilog.ops.status.collect_status`); Redis's ``used_memory`` and the stream's length; the staging table's total
size (``pg_total_relation_size``), its dead tuples and the records staged; the group's de-duplication table's size
(``unilog_processed``); the checkpoint and state tables' size; in WAL mode, the slot's retained WAL. Every series is
judged by :func:`bench.growth.judge` (a rise between the halves of the run, still climbing in the second half, past
tolerances set per kind in :func:`bench.soakfleet.tolerances`). At the end the producer stops and the fleet catches
up: both consumers' counts must equal the records produced (each applied once) and no process may have exited.

The samples and verdicts go into the JSON; the plot to ``bench/soak.png`` (or next to ``--out``). A failed soak
prints one line naming what failed and ``python -m bench`` exits 1.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from unilog.stream.modes import disable_wal, enable_wal

from .core import Measurement, Profile, Results, log
from .env import BenchEnv
from .growth import Growth, judge
from .soakfleet import SoakFleet, sample, tolerances

SAMPLE_EVERY = 5.0
CATCH_UP_SECONDS = 180.0
# "table-leak": table mode with a checkpoint handler that keeps 1 kB per record, to show the check fails
VARIANTS = ("table", "wal", "table-faults", "wal-faults", "table-leak")
SOAK_TABLES = ("unilog_processed", "unilog_group_watermarks", "unilog_held_letters")  # beyond env.reset()'s
PLOT = Path(__file__).resolve().parent / "soak.png"
PROGRESS_EVERY = 60.0


def run_soak(env: BenchEnv, profile: Profile, results: Results) -> None:
    minutes, rate = profile.soak_minutes, profile.soak_rate
    log(f"soak: {', '.join(profile.soak_variants)}, {minutes:g} min each at {rate} records/s")
    runs: dict[str, dict[str, Any]] = {}
    for variant in profile.soak_variants:
        metrics, notes = soak_trial(env, variant, minutes, rate)
        results.add(Measurement("soak", f"{minutes:g} min at {rate}/s", variant, 0, metrics, notes))
        runs[variant] = notes
    path = Path(profile.soak_plot) if profile.soak_plot else PLOT
    try:
        plot(runs, path)
        log(f"soak: plot written to {path}")
    except ImportError:
        log("soak: no plot (matplotlib is not installed: pip install -e '.[dev]')")


def failures(results: Results) -> list[str]:
    """What failed in the run's soak trials (series that grow, processes that exited, records lost or doubled)."""
    return [f for m in results.measurements if m.workload == "soak" for f in m.notes.get("failures", [])]


def soak_trial(env: BenchEnv, variant: str, minutes: float, rate: int) -> tuple[dict[str, float], dict[str, Any]]:
    """One variant's run: the fleet for ``minutes``, sampled; then caught up, counted and judged."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown soak variant {variant!r}; known: {', '.join(VARIANTS)}")
    env.reset()
    env.admin.execute("TRUNCATE " + ", ".join(SOAK_TABLES))
    env.settle()
    wal = variant.startswith("wal")
    settings = env.urls.settings()
    if wal:
        enable_wal(settings)
    log_dir = Path(tempfile.mkdtemp(prefix=f"bench-soak-{variant}-"))
    log(f"soak {variant}: processes' logs in {log_dir}")
    fleet = SoakFleet(env, variant, rate, log_dir)
    try:
        fleet.start()
        samples = _sample_for(env, fleet, minutes * 60)
        seconds = samples[-1]["t"] if samples else 0.0
        fleet.stop_producer()
        end = _catch_up(env, fleet)
        counters = fleet.scrape()
    finally:
        fleet.stop()
        if wal:
            disable_wal(settings)
    return _verdict(variant, rate, fleet, samples, seconds, end, counters)


def _sample_for(env: BenchEnv, fleet: SoakFleet, seconds: float) -> list[dict[str, Any]]:
    """Sample every :data:`SAMPLE_EVERY` s for ``seconds``; a sample that fails is logged and skipped."""
    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    tick, shown = started, started
    while (now := time.monotonic()) - started < seconds:
        try:
            values, cpu = sample(env, fleet)
            samples.append({"t": round(now - started, 2), "produced": fleet.produced.value, **values, "cpu": cpu})
        except Exception as exc:  # a server briefly away (a proxy cut does not reach the sampler: it goes direct)
            log(f"  soak {fleet.variant}: sample failed: {exc}")
        fleet.poll()
        fleet.revive()
        if now - shown >= PROGRESS_EVERY and samples:
            shown = now
            log(f"  soak {fleet.variant}: {_progress(samples[-1])}")
        tick += SAMPLE_EVERY
        time.sleep(max(0.0, tick - time.monotonic()))
    return samples


def _progress(s: dict[str, Any]) -> str:
    rss = ", ".join(f"{k[8:]} {v:.1f}" for k, v in s.items() if k.startswith("RSS MB: ") and v is not None)
    return (
        f"{s['t'] / 60:.1f} min, {s['produced']:,} produced; RSS MB {rss}; lag s checkpoint "
        f"{s.get('lag s: checkpoint')}, group {s.get('lag s: group')}; Redis {s['Redis used_memory MB']:.1f} MB, "
        f"xlen {s['stream length: rides']:,.0f}; staging {s['staging table MB']:.2f} MB, "
        f"{s['staging dead tuples']:,.0f} dead"
        + (
            f"; WAL {s['WAL retained MB']:.1f} MB"
            if "WAL retained MB" in s and s["WAL retained MB"] is not None
            else ""
        )
    )


def _catch_up(env: BenchEnv, fleet: SoakFleet) -> dict[str, Any]:
    """Wait (at most :data:`CATCH_UP_SECONDS`) until nothing is staged, nothing lags or is pending and both state
    rows count every record produced; what was found at the end."""
    produced = int(fleet.produced.value)
    started = time.monotonic()
    while True:
        rows = dict(env.admin.execute("SELECT name, n FROM bench_state").fetchall())
        values, _ = sample(env, fleet)
        quiet = all(
            not values.get(k)
            for k in ("staged records", "lag entries: checkpoint", "lag entries: group", "pending: group")
        )
        done = quiet and rows.get("checkpoint") == produced and rows.get("group") == produced
        waited = time.monotonic() - started
        if done or waited > CATCH_UP_SECONDS:
            return {"produced": produced, "counted": rows, "quiet": quiet, "seconds": round(waited, 1)}
        time.sleep(1.0)


def _verdict(
    variant: str,
    rate: int,
    fleet: SoakFleet,
    samples: list[dict[str, Any]],
    seconds: float,
    end: dict[str, Any],
    counters: dict[str, dict[str, float]],
) -> tuple[dict[str, float], dict[str, Any]]:
    growth = judge_samples(samples, rate)
    for g in growth:
        log(f"  soak {variant}: {g.line()}")
    failed = [f"{variant}: {g.series} grows without bound ({_rise(g)})" for g in growth if g.unbounded]
    exits = {c.name: c.exits for c in fleet.children if c.exits}
    failed += [f"{variant}: {name} exited with {codes}" for name, codes in exits.items()]
    for who in ("checkpoint", "group"):
        if end["counted"].get(who) != end["produced"]:
            failed.append(f"{variant}: the {who} consumer counted {end['counted'].get(who)} of {end['produced']}")
    cpu = _cpu_percent(samples)
    metrics: dict[str, float] = {
        "records/s": samples[-1]["produced"] / seconds if seconds else float("nan"),
        "series growing": float(sum(g.unbounded for g in growth)),
        "process exits": float(sum(len(c) for c in exits.values())),
        **{f"CPU % {name}": pct for name, pct in cpu.items()},
        **{f"{g.series} end": g.second_half for g in growth if g.series.startswith("RSS")},
    }
    notes = {
        "failures": failed,
        "growth": [asdict(g) for g in growth],
        "end": end,
        "counters": counters,
        "cuts": dict(fleet.cuts),
        "samples": samples,
        "log_dir": str(fleet.log_dir),
    }
    return metrics, notes


def judge_samples(samples: list[dict[str, Any]], rate: int) -> list[Growth]:
    """Every sampled series' verdict (series named ``kind: which`` take the tolerance of ``kind``)."""
    limits = tolerances(rate)
    names = list(dict.fromkeys(k for s in samples for k in s if k not in ("t", "produced", "cpu")))
    return [
        judge(name, [(s["t"], s.get(name)) for s in samples if s.get(name) is not None], limits[name.split(":")[0]])
        for name in names
    ]


def _rise(g: Growth) -> str:
    return f"median {g.first_half:.4g} -> {g.second_half:.4g} over the run's halves, still {g.slope_per_hour:+.4g}/h"


def _cpu_percent(samples: list[dict[str, Any]]) -> dict[str, float]:
    """Each process's CPU use over the run, in % of one core: the sum of its CPU time's increments between samples
    (a restarted process starts again from 0: its first sample counts whole)."""
    out: dict[str, float] = {}
    for name in samples[0]["cpu"] if samples else []:
        seen = [(s["t"], s["cpu"][name]) for s in samples if s["cpu"].get(name) is not None]
        used = sum(b - a if b >= a else b for (_, a), (_, b) in itertools.pairwise(seen))
        if len(seen) >= 2 and seen[-1][0] > seen[0][0]:
            out[name] = round(100 * used / (seen[-1][0] - seen[0][0]), 1)
    return out


PANELS = (
    ("RSS (MB)", ("RSS MB: ",)),
    ("consumer lag (s)", ("lag s: ",)),
    ("lag and pending (entries)", ("lag entries: ", "pending: ")),
    ("Redis used_memory (MB)", ("Redis used_memory MB",)),
    ("stream length (entries)", ("stream length: ",)),
    ("tables (MB)", ("staging table MB", "unilog_processed MB", "checkpoints+state MB")),
    ("rows: staging dead, staged, processed ids", ("staging dead tuples", "staged records", "unilog_processed rows")),
    ("slot's retained WAL (MB)", ("WAL retained MB",)),
)


def plot(runs: dict[str, dict[str, Any]], path: Path) -> None:
    """Every series against time, a panel per kind; one line style per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(18, 8), sharex=True)
    styles = ("-", "--", ":", "-.")
    for ax, (title, prefixes) in zip(axes.flat, PANELS, strict=True):
        for style, (variant, notes) in zip(styles, runs.items(), strict=False):
            samples = notes["samples"]
            names = dict.fromkeys(k for s in samples for k in s if k.startswith(prefixes))
            for name in names:
                pts = [(s["t"] / 60, s[name]) for s in samples if s.get(name) is not None]
                label = f"{name} ({variant})" if len(runs) > 1 else name
                ax.plot([x for x, _ in pts], [y for _, y in pts], style, linewidth=1, label=label)
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
        else:  # table mode has no slot
            ax.text(0.5, 0.5, "not sampled in table mode", ha="center", va="center", transform=ax.transAxes)
    for ax in axes[1]:
        ax.set_xlabel("minutes")
    variants = ", ".join(runs)
    fig.suptitle(f"unilog soak ({variants}): the fleet at a steady rate, sampled every {SAMPLE_EVERY:g} s")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
