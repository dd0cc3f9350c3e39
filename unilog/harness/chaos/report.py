"""The run's report: recoveries read from the processes' logs, the header and the human summary."""

from __future__ import annotations

import contextlib
import json
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..supervisor import Fleet, ProcessSpec
from .checker import Verdict
from .observe import Observation
from .pgha import summary_lines as failover_lines
from .schedule import FaultEvent

if TYPE_CHECKING:
    from .config import ChaosConfig


LOG_EVENTS = {
    "crashed (injected); restarting in-process": "in_process_restarts",
    "connection failed; retrying": "reconnects",
    "listen connection lost; polling": "reconnects",
    "stream lock acquired": "stream_lock_acquisitions",
    "claimed idle entries": "group_claims",
    "record dead-lettered": "dead_lettered",
    "checkpoint moved underneath; re-reading": "checkpoint_moved",
    "pending entries were deleted from the stream before anyone applied them": "pending_trimmed",
    "stream is missing confirmed positions: Redis lost data": "redis_lost_data",
}


# A Postgres call that outlived its deadline raises DeadlineExceeded, whose message says so; a running process logs
# it as the failure of its pass ("connection failed; retrying", then it reconnects), `--once` as its last words.
DEADLINE = "exceeded its deadline"


def recovered(event: Mapping[str, Any]) -> list[str]:
    """The recoveries a JSON log line records: its event's (:data:`LOG_EVENTS`), and a deadline break besides when
    the failure it reports is a fired deadline (a reconnect too)."""
    text = str(event.get("event", ""))
    names = [LOG_EVENTS[text]] if text in LOG_EVENTS else []
    if text == "connection failed; retrying" and DEADLINE in str(event.get("error", "")):
        names.append("deadline_breaks")
    return names


def recoveries(fleet: Fleet, log_dir: Path) -> dict[str, Any]:
    """Process restarts (from the supervisor) and recoveries the processes logged themselves."""
    events: Counter[str] = Counter()
    exits: Counter[str] = Counter()
    for path in sorted(log_dir.glob("*.log")):
        with path.open("rb") as lines:
            for raw in lines:
                if raw.startswith(b"{"):
                    with contextlib.suppress(ValueError):
                        events.update(recovered(json.loads(raw)))
                elif raw.startswith(b"unilog: "):
                    exits[_exit_reason(raw.decode(errors="replace").strip())] += 1
    restarts = {k.removeprefix("restart:"): v for k, v in sorted(fleet.events.items()) if k.startswith("restart:")}
    return {
        "process_restarts": sum(restarts.values()),
        "process_restarts_by_name": restarts,
        **dict(sorted(events.items())),
        "exits": dict(sorted(exits.items())),
    }


def _exit_reason(text: str) -> str:
    """A process's last words on stderr, grouped."""
    for needle, reason in (
        ("injected crash", "injected crash (exit 7)"),
        ("cannot connect to Postgres", "Postgres unreachable at start-up (exit 4)"),
        ("cannot connect to Redis", "Redis unreachable at start-up (exit 4)"),
        ("StreamGap", "data loss detected (exit 8)"),
        ("StreamRewound", "data loss detected (exit 8)"),
        ("spark consumer", "Spark query failed (exit 1)"),
        (DEADLINE, "a Postgres call outlived its deadline (exit 4)"),
    ):
        if needle in text:
            return reason
    return text[:100]


def consumer_report(observation: Observation, verdict: Verdict) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, applied in verdict.counts.get("applied", {}).items():
        row = dict(applied)
        if observation.states is not None:
            state: Any = observation.states.get(name)
            row["state"] = state.as_dict() if hasattr(state, "as_dict") else state
            row["state_equals_canonical"] = state == observation.canonical_state
        row["dead_letters"] = len(observation.dead_letters.get(name, []))
        result[name] = row
    if observation.canonical_state is not None and hasattr(observation.canonical_state, "as_dict"):
        result["canonical"] = observation.canonical_state.as_dict()
    return result


def print_header(
    config: ChaosConfig,
    handler: str,
    report: dict[str, Any],
    specs: Sequence[ProcessSpec],
    schedule: Sequence[FaultEvent],
    out: TextIO,
) -> None:
    servers = report["servers"]
    print(
        f"unilog chaos: seed {config.seed}, {config.duration:.0f} s of faults; Postgres {servers['postgres']}, "
        f"Redis {servers['redis']}",
        file=out,
    )
    print(f"  fleet: {', '.join(s.name for s in specs)}; handler {handler}", file=out)
    kinds = Counter(e.kind for e in schedule)
    print(
        f"  schedule: {len(schedule)} faults (" + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + ")",
        file=out,
    )
    if config.library_faults:
        print(
            f"  library faults: streamers {config.streamer_faults}; consumers {config.consumer_faults}; "
            f"group {config.group_faults}",
            file=out,
        )
    for note in report.get("notes", []):
        print(f"  note: {note}", file=out)
    print(f"  logs: {report['log_dir']}", file=out, flush=True)


def format_summary(report: Mapping[str, Any], report_path: Path | None = None) -> str:
    """The human summary of a chaos report: records, faults by kind, recoveries, consumers, verdict."""
    verdict = report["verdict"]
    counts = verdict["counts"]
    lines = ["", "records:"]
    lines.append(
        f"  {counts['attempts']} attempts (transactions and API calls): "
        + ", ".join(f"{source} {dict(by)}" for source, by in counts.get("by_source", {}).items())
    )
    lines.append(
        f"  {counts['records']} records with an id: {counts['committed']} committed, {counts['rolled_back']} rolled "
        f"back, {counts['unknown']} unknown; {counts['unknown_anonymous']} API calls of unknown outcome; "
        f"{counts.get('unknown_committed', '?')} unknown outcomes turned out committed; "
        f"{counts.get('canonical', '?')} records in the database ({counts['poison']} poison)"
    )
    lines += _fault_lines(report)
    lines += failover_lines(report)
    lines.append("consumers:")
    for name, row in report.get("consumers", {}).items():
        if name == "canonical":
            lines.append(f"  {'canonical':<10} {json.dumps(row)}")
            continue
        state = ""
        if "state" in row:
            state = f"; state {'=' if row['state_equals_canonical'] else '!='} canonical"
        lines.append(f"  {name:<10} applied {row['records']} records in {row['applications']} applications{state}")
    ok = verdict["ok"]
    kinds = Counter(v["kind"] for v in verdict["violations"])
    lost = sum(len(v["cids"]) for v in verdict["violations"] if v["kind"] == "lost")
    twice = sum(len(v["cids"]) for v in verdict["violations"] if v["kind"] == "applied_twice")
    unexpected = sum(len(v["cids"]) for v in verdict["violations"] if v["kind"] == "unexpected")
    lines.append(
        f"verdict: {'PASS' if ok else 'FAIL'} — lost {lost}, unexpected {unexpected}, applied twice {twice}, "
        f"dead letters {counts['dead_letters']} (committed poison records {counts.get('poison_committed', '?')}), "
        + (
            "staged 0, pending 0, every consumer at the end, states equal canonical"
            if ok
            else "violations: " + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items()))
        )
    )
    for violation in verdict["violations"]:
        lines.append(f"  {violation['kind'].upper()}: {violation['message']}")
    if report_path is not None:
        lines.append(f"report: {report_path}")
    return "\n".join(lines)


def _fault_lines(report: Mapping[str, Any]) -> list[str]:
    """Faults by kind, the library's own, and the recoveries they caused."""
    faults = report.get("faults", {})
    lines = ["faults injected:"]
    for kind, c in faults.get("injected", {}).items():
        extra = ", ".join(f"{k} {v}" for k, v in c.items() if k != "done" and v)
        lines.append(f"  {kind:<22} {c['done']:>5}" + (f"  ({extra})" if extra else ""))
    library = faults.get("library", {})
    lines.append("  library: " + (", ".join(f"{k}={v}" for k, v in library.items()) or "none"))
    rec = report.get("recoveries", {})
    by_name = ", ".join(f"{k} {v}" for k, v in rec.get("process_restarts_by_name", {}).items())
    lines.append(f"recoveries: {rec.get('process_restarts', 0)} process restarts ({by_name})")
    others = {k: v for k, v in rec.items() if k not in ("process_restarts", "process_restarts_by_name", "exits")}
    if others:
        lines.append("  " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in others.items()))
    if rec.get("exits"):
        lines.append("  exits: " + "; ".join(f"{k} x{v}" for k, v in rec["exits"].items()))
    lines.append("  (exits are restarted by the supervisor; the process restarts above include them)")
    lines.append(
        f"quiesce: {'quiet' if report.get('quiesced') else 'NOT quiet'} after {report.get('quiesce_seconds', 0)} s"
    )
    return lines


def print_schedule(schedule: Sequence[FaultEvent], out: TextIO | None = None) -> None:
    for event in schedule:
        print(event, file=out or sys.stdout)
