"""The printed table, the target checks (PASS/MISS) and the JSON file."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .bigtx import MODES as BIGTX_MODES
from .bigtx import SMALL as BIGTX_SMALL
from .bigtx import bigtx_case
from .core import Profile, Results, Summary, median_interval

TODO_LINE = "Not measured: partitioned consumers (their per-partition path is the checkpoint consumer's)."


@dataclass(frozen=True)
class Target:
    """One target: ``value`` compared with ``limit`` (``>=``, ``<=`` or ``<``); None when not measured."""

    name: str
    value: float | None
    op: str
    limit: float
    unit: str = ""

    @property
    def verdict(self) -> str:
        if self.value is None or math.isnan(self.value):
            return "n/a"
        ok = {">=": self.value >= self.limit, "<=": self.value <= self.limit, "<": self.value < self.limit}[self.op]
        return "PASS" if ok else "MISS"

    def line(self) -> str:
        shown = "not measured" if self.value is None else f"{_fmt(self.value)}{self.unit}"
        return f"{self.verdict:4}  {self.name}: {shown} (target {self.op} {_fmt(self.limit)}{self.unit})"


def _cases(results: Results, workload: str) -> list[str]:
    return list(dict.fromkeys(m.case for m in results.measurements if m.workload == workload))


def targets(results: Results, profile: Profile) -> list[Target]:
    return [
        *_drain_targets(results),
        *_latency_targets(results),
        *_produce_targets(results),
        *_consume_targets(results),
        *_horizon_targets(results),
        *_spark_targets(results),
        _memory_target(results, profile),
        *_bigtx_targets(results, profile),
        *_commits_targets(results),
        *_soak_targets(results),
        *_typed_targets(results),
        *_status_targets(results),
    ]


def _drain_targets(results: Results) -> list[Target]:
    out = []
    for case in _cases(results, "drain"):
        for floor, limit in (("reference", 2.5), ("pg_only", 0.8)):
            ratio = results.paired_ratio("drain", case, "unilog", floor, "records/s")
            out.append(Target(f"drain {case}: unilog / {floor}", ratio, ">=", limit, "x"))
        ratio = results.paired_ratio("drain", case, "unilog-wal", "unilog", "records/s")  # the same records (issue 26)
        out.append(Target(f"drain {case}: WAL mode / table mode", ratio, ">=", 0.9, "x"))
    return out


def _latency_targets(results: Results) -> list[Target]:
    out = []
    for case in _cases(results, "latency"):
        for metric, limit in (("p50 ms", 5.0), ("p99 ms", 20.0)):
            value = results.median("latency", case, "unilog", metric)
            out.append(Target(f"latency {case}: unilog {metric.split()[0]}", value, "<=", limit, " ms"))
        for variant in ("unilog", "unilog-wal"):  # issue 26: commit to XADD, checked at its upper bound (Redis's
            for metric, limit in (("to Redis confirmed p50 ms", 1.0), ("to Redis confirmed p99 ms", 10.0)):
                value = results.median("latency", case, variant, metric)  # confirmation: the XADD came before it)
                name = f"latency {case}: {variant} commit-to-XADD {metric.split()[-2]} (by Redis's confirmation)"
                out.append(Target(name, value, "<=", limit, " ms"))
    return out


def _produce_targets(results: Results) -> list[Target]:
    out = []
    for case in _cases(results, "produce"):
        ratio = results.paired_ratio("produce", case, "with emit", "without emit", "tx/s")
        out.append(Target(f"produce {case}: with emit / without", ratio, ">=", 0.85, "x"))
    for case in _cases(results, "produce_clients"):
        # WAL mode writes a logical message, which should cost less than a row (issue 26)
        for variant, mode, limit in (("with emit", "table mode", 0.95), ("emit, WAL mode", "WAL mode", 1.0)):
            rounds = results.paired_ratios("produce_clients", case, variant, "plain INSERT", "tx/s")
            ratio = statistics.median(rounds) if rounds else None
            name = f"produce {case}: emit / second-INSERT floor, {mode}{_spread(rounds)}"
            out.append(Target(name, ratio, ">=", limit, "x"))
    return out


def _horizon_targets(results: Results) -> list[Target]:
    """WAL capture's point: an idle-in-transaction session does not delay other records."""
    return [
        Target(
            f"horizon {case}: WAL mode p99 with an idle transaction held 2 s",
            results.median("horizon", case, "wal, idle 2s", "p99 ms"),
            "<=",
            50.0,
            " ms",
        )
        for case in _cases(results, "horizon")
    ]


def _spark_targets(results: Results) -> list[Target]:
    """Issue 18: the Spark consumer at least half the Python checkpoint consumer with large batches."""
    return [
        Target(
            f"spark {case}: spark (maxEntriesPerBatch 100,000) / python",
            results.paired_ratio("spark", case, "spark b100k", "python", "entries/s"),
            ">=",
            0.5,
            "x",
        )
        for case in _cases(results, "spark")
        if case.startswith("throughput")
    ]


def _consume_targets(results: Results) -> list[Target]:
    return [
        Target(
            f"consume {case}: unilog checkpoint consumer (trivial handler)",
            results.median("consume", case, "unilog", "records/s"),
            ">=",
            100_000,
            " rec/s",
        )
        for case in _cases(results, "consume")
    ]


def _typed_targets(results: Results) -> list[Target]:
    """Issue 37: a typed record costs its producer, its consumer and the streamer at most 10 % over the same dict."""
    wanted = (
        ("typed-emit", "typed", "dict", "typed emit / dict emit"),
        ("typed-consume", "typed", "untyped", "typed consumer / untyped (reads record.data)"),
        ("typed-drain", "typed", "untyped", "streamer drain, typed / untyped records"),
    )
    out = []
    for workload, a, b, name in wanted:
        for case in _cases(results, workload):
            rounds = results.paired_ratios(workload, case, a, b, "records/s")
            ratio = statistics.median(rounds) if rounds else None
            out.append(Target(f"{workload} {case}: {name}{_spread(rounds)}", ratio, ">=", 0.9, "x"))
    return out


def _commits_targets(results: Results) -> list[Target]:
    """Issue 24: RSS must not grow per commit (the leak it fixed was about 175 bytes per commit)."""
    out = []
    for case in _cases(results, "commits"):
        for process in ("publisher", "consumer"):
            growth = results.median("commits", case, process, "RSS growth bytes/commit")
            out.append(Target(f"commits {case}: {process} RSS growth per commit", growth, "<", 20, " B"))
    return out


def _status_targets(results: Results) -> list[Target]:
    """Issue 46: status, a scrape and a dashboard sample each under a second at 10,000 streams."""
    if "10,000 streams" not in _cases(results, "status"):
        return []
    return [
        Target(
            f"status at 10,000 streams: {metric}",
            results.median("status", "10,000 streams", "status", metric),
            "<",
            1.0,
            " s",
        )
        for metric in ("status s", "scrape s", "dashboard sample s")
    ]


def _soak_targets(results: Results) -> list[Target]:
    """Issue 28: over a soak nothing grows without bound, no process exits, every record is applied once."""
    out = []
    for m in results.measurements:
        if m.workload == "soak":
            growing = [g["series"] for g in m.notes.get("growth", []) if g["unbounded"]]
            shown = f" ({', '.join(growing)})" if growing else ""
            out.append(
                Target(
                    f"soak {m.case}, {m.variant}: series growing without bound{shown}",
                    m.metrics["series growing"],
                    "<=",
                    0,
                )
            )
            out.append(
                Target(
                    f"soak {m.case}, {m.variant}: failures (exits, records lost or doubled, growth)",
                    float(len(m.notes.get("failures", []))),
                    "<=",
                    0,
                )
            )
    return out


def _memory_target(results: Results, profile: Profile) -> Target:
    case = f"{profile.memory_size:,} records"
    rss = results.median("memory", case, "streamer", "peak RSS MB")
    return Target(f"memory: streamer peak RSS through {case}", rss, "<", 150, " MB")


def _bigtx_targets(results: Results, profile: Profile) -> list[Target]:
    """Issue 26: one large transaction goes out without the streamer's memory growing with it, in either mode."""
    big, small = bigtx_case(profile.bigtx_size), bigtx_case(BIGTX_SMALL)
    out = []
    for mode in BIGTX_MODES:
        rss_big = results.median("bigtx", big, mode, "peak RSS MB")
        rss_small = results.median("bigtx", small, mode, "peak RSS MB")
        if rss_big is None or not rss_small:
            continue
        name = f"bigtx {mode} mode: streamer peak RSS, {big} / {BIGTX_SMALL:,} ({rss_big:.0f} / {rss_small:.0f} MB)"
        out.append(Target(name, rss_big / rss_small, "<", 1.5, "x"))
    return out


TYPED_RATIOS = (  # issue 37: typed records against the same data untyped (bench/typed.py)
    ("typed-emit", "records/s", "typed, emit_many", "dict, emit_many", " (emit_many, one call a transaction)"),
    ("typed-emit", "records/s", "dict, emit_many", "dict", " (emit_many / emit, dicts)"),
    ("typed-consume", "records/s", "typed, records.typed", "untyped", " (records.typed(cls) / record.data)"),
    ("typed-consume", "records/s", "untyped", "count only", " (record.data / a handler touching nothing)"),
    ("typed-consume", "records/s", "typed, gc not frozen", "untyped, gc not frozen", " (neither after gc.freeze())"),
    ("typed-codec", "us/record", "pydantic encode+validate", "dict encode (untyped emit)", " (time: <1 is faster)"),
    ("typed-codec", "us/record", "msgspec encode+validate", "pydantic encode+validate", " (time)"),
    ("typed-codec", "us/record", "msgspec on the pydantic instance", "pydantic encode+validate", " (time)"),
    ("typed-codec", "us/record", "msgspec decode", "pydantic decode", " (time)"),
    ("typed-codec", "us/record", "pydantic decode", "json.loads (record.data)", " (time)"),
)


# many_streams: each count of streams against one stream, in the same mode and run (issue 46)
MANY_STREAMS_RATIOS = (
    *(
        ("many_streams", "records/s", f"{mode} {count:,} streams", f"{mode} 1 stream", " (the records over streams)")
        for mode in ("table", "wal")
        for count in (2, 10, 100, 1_000, 10_000)
    ),
    ("many_streams", "records/s", "cluster 1,000 streams", "cluster 1 stream", " (a Redis Cluster of 3 shards)"),
    *(
        ("consume_streams", "records/s", f"{kind} {count:,} streams", f"{kind} 1 stream", " (one worker)")
        for kind in ("MultiConsumer", "GroupConsumer")
        for count in (10, 1_000)
    ),
)


def ratios(results: Results) -> list[str]:
    """Informative ratios that have no target."""
    wanted = [
        ("drain", "records/s", "unilog-b1000", "reference", " (the reference's batch size)"),
        ("drain", "records/s", "unilog", "unilog-b1000", ""),
        ("drain", "records/s", "redis_only", "reference", ""),
        ("drain", "records/s", "unilog", "redis_only", ""),
        ("drain", "records/s", "unilog", "redis_script", " (unilog against its own Redis half alone)"),
        ("drain", "records/s", "redis_script", "pg_only", " (the Redis half against the Postgres half)"),
        ("drain", "records/s", "unilog-wal", "pg_only", " (WAL capture against Postgres's select-and-delete)"),
        ("drain", "records/s", "unilog-wal", "unilog", " (WAL capture against table mode)"),
        ("drain_streams", "records/s", "2 streams", "1 stream", ""),
        ("drain_streams", "records/s", "4 streams", "1 stream", ""),
        *MANY_STREAMS_RATIOS,
        ("produce", "tx/s", "emit, no NOTIFY", "without emit", " (diagnostic: unilog's NOTIFY trigger disabled)"),
        ("produce", "tx/s", "plain INSERT", "without emit", " (diagnostic: the floor of any extra INSERT)"),
        ("produce", "tx/s", "with emit", "plain INSERT", " (emit against that floor)"),
        (
            "produce",
            "tx/s",
            "async, with emit",
            "async, without emit",
            " (emit_async against a bare async transaction)",
        ),
        ("produce_clients", "tx/s", "with emit", "plain INSERT", " (emit / the second-INSERT floor, table mode)"),
        ("produce_clients", "tx/s", "emit, WAL mode", "plain INSERT", " (emit / the floor, WAL mode)"),
        ("produce_clients", "tx/s", "plain INSERT", "without emit", " (the floor / the bare business transaction)"),
        (
            "produce_clients",
            "tx/s",
            "emit, streamer asleep",
            "plain INSERT",
            " (every commit notifies, as before the quiet wake-up)",
        ),
        ("horizon", "p99 ms", "table, idle 2s", "wal, idle 2s", " (p99: table mode / WAL mode, idle transaction)"),
        ("consume", "records/s", "unilog", "reference", ""),
        ("consume", "records/s", "unilog-distance", "reference", " (same work as the reference)"),
        ("consume", "records/s", "unilog-group", "reference", ""),
        ("consume", "records/s", "unilog-async", "unilog", " (asyncio consumer / threaded, trivial handler)"),
        ("consume", "records/s", "unilog-async-distance", "unilog-distance", " (asyncio / threaded, distance work)"),
        *(
            ("spark", "entries/s", f"spark b{b}k", "python", " (same work; state and checkpoint in one transaction)")
            for b in (20, 50, 100)
        ),
        ("curves", "records/s", "wal", "table", " (the knee: WAL mode / table mode)"),
        ("observe-drain", "records/s", "default", "no-metrics", " (the cost of metrics)"),
        ("observe-drain", "records/s", "traced", "default", " (the cost of tracing: SDK on, every record traced)"),
        ("observe-consume", "records/s", "default", "no-metrics", " (the cost of metrics)"),
        ("observe-consume", "records/s", "traced", "default", " (the cost of tracing: SDK on)"),
        ("shards", "drain records/s", "3 shards", "1 shard", " (a partitioned stream, Redis Cluster)"),
        ("shards", "consume records/s", "3 shards", "1 shard", " (one partition worker)"),
        *TYPED_RATIOS,
    ]
    lines = []
    for workload, metric, a, b, note in wanted:
        for case in _cases(results, workload):
            rounds = results.paired_ratios(workload, case, a, b, metric)
            if rounds:
                lines.append(f"{workload} {case}: {a} / {b} = {statistics.median(rounds):.2f}x{_spread(rounds)}{note}")
    return lines


def _spread(rounds: list[float]) -> str:
    """The median's 95 % interval, where enough rounds make one meaningful."""
    if len(rounds) < 8:
        return ""
    low, high = median_interval(rounds)
    return f" [95% CI {low:.2f}..{high:.2f}, {len(rounds)} rounds]"


def table(summaries: list[Summary]) -> str:
    header = ("workload", "case", "variant", "metric", "median", "min..max", "n")
    rows = [header] + [
        (s.workload, s.case, s.variant, s.metric, _fmt(s.median), f"{_fmt(s.low)}..{_fmt(s.high)}", str(s.n))
        for s in summaries
        if s.metric not in HIDDEN_METRICS
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    right = {4, 5, 6}
    lines = []
    for k, row in enumerate(rows):
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


HIDDEN_METRICS = {"exit", "seconds", "at-exit VmHWM MB", "polled VmHWM MB"}  # in the JSON; the table shows rates


def render(results: Results, profile: Profile, found: list[Target]) -> str:
    parts = [
        f"unilog benchmarks ({profile.name} mode): median and min..max over the interleaved rounds",
        "",
        table(results.summaries()),
        "",
        "Targets:",
        *(t.line() for t in found),
        "",
        "Other ratios (all ratios: median over rounds of the ratio within a round):",
        *ratios(results),
        "",
        TODO_LINE,
    ]
    return "\n".join(parts)


def write_json(path: Path, results: Results, profile: Profile, found: list[Target], context: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        **context,
        "profile": asdict(profile),
        "summary": [asdict(s) for s in results.summaries()],
        "targets": [{**asdict(t), "verdict": t.verdict} for t in found],
        "ratios": ratios(results),
        "todo": TODO_LINE,
        "measurements": results.as_json(),
    }
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "nan"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"
