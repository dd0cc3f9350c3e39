"""``curves``: commit-to-handler latency against offered load, for table mode and WAL capture mode, with and without
an idle-in-transaction session; the knee of each curve; a plot (``bench/load-curves.png``).

Each point is one :func:`bench.latency.latency_trial` of the whole fleet on one machine: a producer process
(``PRODUCER_THREADS`` connections, an open-loop schedule of single-record transactions), ``Streamer.run``, a
checkpoint consumer (``Consumer.run``, whose handler takes the latency) and a consumer group's worker
(``GroupConsumer.run``, a trivial handler) reading the same stream. ``idle`` variants hold an idle-in-transaction
session (it took a transaction id) for :data:`HOLD` seconds from the producer's start.

The offered rate is what the schedule asks for; ``achieved/s`` is what the producer managed (records over the time
its schedule took). A point is *saturated* when it fell below 90 % of the offered rate: the producer's own
transactions are then the bottleneck, and its queueing is not in the latency (taken from just before ``COMMIT``).
The **knee** is the highest offered rate whose point is not saturated and whose p99 is within 5x the lowest
rate's (p99 of the idle variants is the hold itself in table mode, so their knee is read from p50).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from unilog import GroupConsumer
from unilog.consume.group import GroupConfig

from .core import QUICK, Measurement, Profile, Results, log, worker_init
from .env import BenchEnv, Urls
from .handlers import count_records
from .horizon import HOLD, horizon_trial

THREADS = 8
VARIANTS = ("table", "table, idle 2s", "wal", "wal, idle 2s")
PLOT = Path(__file__).resolve().parent / "load-curves.png"


def _group_main(urls: Urls, ready: Any, stop: Any) -> None:
    worker_init()
    config = GroupConfig(group="bench-curves", worker="w0")
    with GroupConsumer(urls.settings(), config, count_records) as worker:
        worker.connect()
        ready.set()
        worker.run(stop)


def curve_point(env: BenchEnv, variant: str, rate: int, seconds: float) -> tuple[dict[str, float], dict[str, Any]]:
    metrics, notes = horizon_trial(env, variant, seconds, rate, threads=THREADS, extra=(_group_main,))
    metrics["achieved/s"] = (notes["records"] - 1) / max(notes["producer_seconds"], 1e-9)
    return metrics, notes


def knee(points: list[tuple[int, dict[str, float]]], metric: str) -> int | None:
    """The highest offered rate before saturation or a p99 (``metric``) past 5x the lowest rate's."""
    best, base = None, None
    for rate, m in sorted(points):
        if m["achieved/s"] < 0.9 * rate:
            break
        base = m[metric] if base is None else base
        if m[metric] > 5 * max(base, 1.0):
            break
        best = rate
    return best


def run_curves(env: BenchEnv, profile: Profile, results: Results) -> None:
    rates, seconds = profile.curve_rates, profile.curve_seconds
    variants = profile.curve_variants
    log(f"curves: {', '.join(variants)} at {', '.join(map(str, rates))} records/s offered, {seconds:g} s each")
    points: dict[str, list[tuple[int, dict[str, float]]]] = {v: [] for v in variants}
    for rate in rates:
        for variant in variants:  # interleaved per rate, so drift spreads over the variants alike
            metrics, notes = curve_point(env, variant, rate, seconds)
            results.add(Measurement("curves", f"{rate:,}/s offered", variant, 0, metrics, notes))
            points[variant].append((rate, metrics))
    for variant, pts in points.items():
        found = knee(pts, "p50 ms" if "idle" in variant else "p99 ms")
        log(f"curves: {variant}: knee at {found:,} records/s offered" if found else f"curves: {variant}: no knee")
        results.add(Measurement("curves", "knee", variant, 0, {"records/s": float(found or 0)}, {}))
    # a quick run's plot (table and WAL mode, three rates) goes beside its JSON: bench/load-curves.png is the full
    # run's, which the docs show
    path = PLOT if profile.name != QUICK.name else PLOT.parent / "results" / "load-curves-quick.png"
    try:
        path.parent.mkdir(exist_ok=True)
        plot(points, path)
        log(f"curves: plot written to {path}")
    except ImportError:
        log("curves: no plot (matplotlib is not installed: pip install -e '.[dev]')")


def plot(points: dict[str, list[tuple[int, dict[str, float]]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    for ax, metric in zip(axes, ("p50 ms", "p99 ms"), strict=True):
        for variant, pts in points.items():
            rates = [r for r, _ in pts]
            ax.plot(
                rates,
                [m[metric] for _, m in pts],
                marker="o",
                label=variant,
                linestyle="--" if "idle" in variant else "-",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("offered load (records/s)")
        ax.set_ylabel(f"commit-to-handler {metric}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"unilog fleet on 2 cores: latency against load (idle: a transaction held {HOLD:g} s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
