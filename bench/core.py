"""What every workload shares: the run profile, measurements, interleaved repetitions, fresh worker processes."""

from __future__ import annotations

import math
import multiprocessing
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from unilog.log import configure_logging

T = TypeVar("T")

# Trials run in processes started from a forkserver that imported unilog and the workload modules once (see
# preload()): each child still starts from the same clean state, without 0.6-0.7 s of imports per process.
SPAWN = multiprocessing.get_context("forkserver")
PRELOAD = ["bench.drain", "bench.latency", "bench.produce", "bench.consume", "bench.observe", "bench.shards"]


def preload() -> None:
    """Have the forkserver import the workloads' modules before it forks the first trial (not pyspark's)."""
    SPAWN.set_forkserver_preload(PRELOAD)


@dataclass(frozen=True)
class Profile:
    """Sizes, durations and repetitions of one run (``quick`` or ``full``)."""

    name: str
    drain_sizes: tuple[int, ...]
    drain_reps: int
    streams_size: int
    streams_reps: int
    latency_rates: tuple[int, ...]
    latency_seconds: float
    latency_reps: int
    produce_seconds: float
    produce_reps: int
    consume_size: int
    consume_reps: int
    memory_size: int
    spark_size: int
    spark_reps: int
    spark_latency_seconds: float
    curve_rates: tuple[int, ...] = (100, 1_000, 5_000, 10_000, 20_000)
    curve_seconds: float = 6.0
    slice_seconds: float = 0.5  # produce_clients: one variant's slice of a round
    slice_rounds: int = 40
    commits_size: int = 100_000  # commits: single-record transactions through a fleet with a standby streamer
    bigtx_size: int = 1_000_000  # bigtx: the records of the one large transaction
    backfill_size: int = 1_000_000  # backfill: the table's rows
    backfill_rate: int = 200  # backfill: the paced variant's --rate (rows/s)
    backfill_window: float = 60.0  # backfill: seconds of the paced variant (and of the producer alone)
    side_reps: int | None = None  # rounds of the variants no target reads (None: every round)
    # the variants only the informational ratios read: drain's unilog-b1000, redis_only and redis_script, horizon's
    # table mode (quick leaves them out; every target's variants and baselines still run)
    side_variants: bool = True
    observe_reps: int | None = None  # observe's rounds (None: drain_reps, consume_reps)
    observe_size: int | None = None  # observe's records, drained and consumed (None: drain_sizes[0], consume_size)
    scaling_clients: tuple[int, ...] = (1, 8, 32)  # produce_clients: the client counts
    reference_rates: tuple[int, ...] | None = None  # latency: the rates the reference design runs at (None: all)
    shards_reps: int | None = None  # shards' rounds (None: drain_reps)
    spark_batches: tuple[int, ...] = (20_000, 50_000, 100_000)  # the Spark throughput trials' maxEntriesPerBatch
    spark_latency_rates: tuple[int, ...] | None = None  # the Spark latency trials' rates (None: latency_rates)
    curve_variants: tuple[str, ...] = ("table", "table, idle 2s", "wal", "wal, idle 2s")
    # soak (only with --only soak; --minutes, --soak-variants, --soak-rate): each variant's run, its rate, the plot
    soak_minutes: float = 60.0
    soak_variants: tuple[str, ...] = ("table", "wal-faults")
    soak_rate: int = 200
    soak_plot: str = ""  # "" : bench/soak.png
    # typed (issue 37): emit slices (rounds of every variant for typed_slice_seconds, typed_per_tx records per
    # transaction); the consume and drain trials' records and rounds (the codec trials' count too)
    typed_rounds: int = 8
    typed_slice_seconds: float = 1.0
    typed_per_tx: int = 100
    typed_size: int = 200_000
    typed_reps: int = 3


# Within about 5 minutes on 2 cores: every workload runs, every target ratio over at least 2 paired rounds; the
# variants no target reads run one round, Spark only its 100,000-entry batches, the curves table and WAL mode only,
# the producers' scaling 1 and 8 clients (the target's), observe over 20,000 records; no reference design's latency,
# no drain variant and no horizon variant that only an informational ratio reads (side_variants); issue 45 halved the
# sizes and windows (363 s quiet before, 328 s between, 312 s with the reference's latency at 20/s and those). Not
# commits, bigtx or memory: their targets are growth per commit and peaks over a size, which a smaller size flatters.
QUICK = Profile(
    name="quick",
    drain_sizes=(50_000,),
    drain_reps=2,
    streams_size=25_000,
    streams_reps=1,
    latency_rates=(20, 500),
    latency_seconds=2.0,
    latency_reps=1,
    produce_seconds=1.0,
    produce_reps=2,
    consume_size=30_000,
    consume_reps=2,
    memory_size=100_000,
    spark_size=200_000,  # the warm-up batch, then one measured 100,000-entry batch
    spark_reps=1,  # one JVM per variant: Spark's start is most of a quick run's Spark time
    spark_latency_seconds=10.0,
    curve_rates=(100, 1_000, 3_000),
    curve_seconds=1.0,
    slice_seconds=0.2,
    slice_rounds=4,
    commits_size=20_000,
    bigtx_size=100_000,
    backfill_size=10_000,
    backfill_window=3.0,
    side_reps=1,
    observe_reps=1,
    observe_size=20_000,
    scaling_clients=(1, 8),
    reference_rates=(),
    side_variants=False,
    shards_reps=1,
    spark_batches=(100_000,),
    spark_latency_rates=(),
    curve_variants=("table", "wal"),
    typed_rounds=3,
    typed_slice_seconds=0.5,
    typed_size=15_000,
    typed_reps=2,
)

FULL = Profile(
    name="full",
    drain_sizes=(200_000, 1_000_000),
    drain_reps=3,
    streams_size=400_000,
    streams_reps=3,
    latency_rates=(20, 500),
    latency_seconds=60.0,
    latency_reps=2,
    produce_seconds=10.0,
    produce_reps=6,
    consume_size=200_000,
    consume_reps=3,
    memory_size=1_000_000,
    spark_size=400_000,
    spark_reps=2,
    spark_latency_seconds=30.0,
)


@dataclass
class Measurement:
    """One trial of one variant: ``metrics`` are numbers summarised across repetitions, ``notes`` anything else."""

    workload: str
    case: str
    variant: str
    rep: int
    metrics: dict[str, float]
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Summary:
    workload: str
    case: str
    variant: str
    metric: str
    median: float
    low: float
    high: float
    n: int


class Results:
    """Every measurement of the run, in order."""

    def __init__(self) -> None:
        self.measurements: list[Measurement] = []

    def add(self, m: Measurement) -> None:
        self.measurements.append(m)
        shown = ", ".join(f"{k}={_short(v)}" for k, v in m.metrics.items())
        log(f"  {m.workload} [{m.case}] {m.variant} #{m.rep + 1}: {shown}")

    def summaries(self) -> list[Summary]:
        groups: dict[tuple[str, str, str, str], list[float]] = {}
        for m in self.measurements:
            for metric, value in m.metrics.items():
                groups.setdefault((m.workload, m.case, m.variant, metric), []).append(value)
        return [Summary(*key, statistics.median(vals), min(vals), max(vals), len(vals)) for key, vals in groups.items()]

    def median(self, workload: str, case: str, variant: str, metric: str) -> float | None:
        vals = [
            m.metrics[metric]
            for m in self.measurements
            if (m.workload, m.case, m.variant) == (workload, case, variant) and metric in m.metrics
        ]
        return statistics.median(vals) if vals else None

    def paired_ratio(self, workload: str, case: str, a: str, b: str, metric: str) -> float | None:
        """Median over rounds of ``a / b`` within the same round: variants of a round ran back to back, so drift in
        the machine's load cancels better than in a ratio of medians."""
        ratios = self.paired_ratios(workload, case, a, b, metric)
        return statistics.median(ratios) if ratios else None

    def paired_ratios(self, workload: str, case: str, a: str, b: str, metric: str) -> list[float]:
        """``a / b`` of every round that measured both."""
        by_rep: dict[int, dict[str, float]] = {}
        for m in self.measurements:
            if (m.workload, m.case) == (workload, case) and m.variant in (a, b) and metric in m.metrics:
                by_rep.setdefault(m.rep, {})[m.variant] = m.metrics[metric]
        return [r[a] / r[b] for r in by_rep.values() if a in r and r.get(b)]

    def as_json(self) -> list[dict[str, Any]]:
        return [asdict(m) for m in self.measurements]


def interleaved(
    results: Results,
    workload: str,
    case: str,
    variants: Sequence[str],
    reps: int,
    trial: Callable[[str], tuple[dict[str, float], dict[str, Any]]],
    *,
    core: Sequence[str] = (),
    side_reps: int | None = None,
) -> None:
    """Run ``trial(variant)`` for every variant, ``reps`` times, in the order A B C A B C ...; with ``side_reps``,
    the variants not in ``core`` (no target reads them) only in the first ``side_reps`` rounds."""
    for rep in range(reps):
        for variant in variants:
            if core and side_reps is not None and rep >= side_reps and variant not in core:
                continue
            metrics, notes = trial(variant)
            results.add(Measurement(workload, case, variant, rep, metrics, notes))


def worker_init() -> None:
    """Set-up of every worker process: unilog's per-batch logs off (warnings still show)."""
    configure_logging(level="warning", stream=sys.stderr)


def in_fresh_process(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` in a fresh process (forked from the forkserver, which only imported modules), so no trial
    inherits another's heap, GC state or caches."""
    with ProcessPoolExecutor(max_workers=1, mp_context=SPAWN, initializer=worker_init) as pool:
        return pool.submit(fn, *args).result()


def median_interval(values: Sequence[float]) -> tuple[float, float]:
    """A distribution-free 95 % confidence interval of the median: the order statistics n/2 -+ 0.98 sqrt(n) (the
    normal approximation of the binomial; conservative for the few rounds a quick run has)."""
    ordered = sorted(values)
    n = len(ordered)
    half = 0.98 * math.sqrt(n)
    low, high = max(0, math.floor(n / 2 - half)), min(n - 1, math.ceil(n / 2 + half) - 1)
    return ordered[low], ordered[high]


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) of already sorted values, nearest-rank."""
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[index]


_T0 = time.monotonic()


def log(message: str) -> None:
    """Progress on stderr, stamped with seconds since start (the table goes to stdout)."""
    print(f"[{time.monotonic() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


def _short(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"
