"""The status report at scale: totals over every stream, and the report cut to the worst streams, so that 10,000
streams read as a summary and a short list (``unilog status``), keep the exporter's label sets bounded and the
dashboard's page and history small.

"Worst" means most behind: a stream ranks by the longest wait among its consumers and groups (``lag_seconds``), then
its oldest staged record's age, then its dead letters, then its length; a stream with nobody publishing its staged
records ranks first. Consumers and groups follow their streams.
"""

from __future__ import annotations

import heapq
from typing import Any

TOP = 20  # streams `unilog status` lists unless asked for more (--top N, --all)


def totals(report: dict[str, Any]) -> dict[str, Any]:
    """Sums and maxima over every stream, consumer and group of ``report`` (a :func:`~unilog.ops.status.collect_status`
    report)."""
    streams, consumers = report["streams"], report["consumers"]
    groups = [g for s in streams for g in s["groups"]]
    lags = [c["lag_seconds"] for c in consumers] + [g["lag_seconds"] for g in groups]
    return {
        "streams": len(streams),
        "entries": sum(s["length"] for s in streams),
        "staged": sum(s["staged"] for s in streams),
        "dead_letters": sum(s["dead_letters"] for s in streams),
        "unpublished_streams": sum(1 for s in streams if s["staged"] and s["publishers"] == 0),
        "consumers": len(consumers),
        "groups": len(groups),
        "pending": sum(g["pending"] for g in groups),
        "lag_entries": sum(c["lag_entries"] for c in consumers) + sum(g["lag_entries"] for g in groups),
        "max_lag_seconds": max(lags, default=0.0),
    }


def _rank(stream: dict[str, Any], waits: dict[str, float]) -> tuple[Any, ...]:
    unpublished = bool(stream["staged"] and stream["publishers"] == 0)
    return (
        unpublished,
        waits.get(stream["name"], 0.0),
        stream["staged_oldest_age_seconds"] or 0.0,
        stream["dead_letters"],
        stream["length"],
    )


def worst(report: dict[str, Any], top: int | None) -> dict[str, Any]:
    """``report`` with only the ``top`` worst streams (all of them when ``top`` is None or not exceeded) and the
    consumers on them, worst first, with ``totals`` over everything and ``omitted``: how many streams and consumers
    were left out. The report itself is not changed."""
    streams = report["streams"]
    out = {**report, "totals": report.get("totals") or totals(report), "omitted": {"streams": 0, "consumers": 0}}
    if top is None or len(streams) <= top:
        return out
    waits: dict[str, float] = {}
    for row in [*report["consumers"], *({"stream": s["name"], **g} for s in streams for g in s["groups"])]:
        waits[row["stream"]] = max(waits.get(row["stream"], 0.0), row["lag_seconds"] or 0.0)
    kept = heapq.nlargest(max(0, top), streams, key=lambda s: _rank(s, waits))  # sorted()'s order, in n log top
    names = {s["name"] for s in kept}
    consumers = [c for c in report["consumers"] if c["stream"] in names]
    consumers.sort(key=lambda c: c["lag_seconds"] or 0.0, reverse=True)
    out |= {
        "streams": kept,
        "consumers": consumers,
        "omitted": {"streams": len(streams) - len(kept), "consumers": len(report["consumers"]) - len(consumers)},
    }
    return out
