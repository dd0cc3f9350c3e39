"""``unilog status``: streams, the staged backlog and each consumer's lag, for people and for scripts."""

from __future__ import annotations

import time
from typing import Any

from . import engine, store
from .config import Settings


def collect_status(settings: Settings) -> dict[str, Any]:
    """Gather the status report as plain data (what ``--json`` prints)."""
    conn = store.connect(settings.conninfo, autocommit=True, application_name="unilog-status")
    client = engine.connect(settings.redis_url)
    engine.ping(client, settings.redis_url)
    streams_api = engine.RedisStreams(client)
    try:
        store.check_schema(conn)
        backlog, oldest_age = store.staged_backlog(conn)
        holder = store.horizon_holder(conn)
        checkpoints = store.list_checkpoints(conn)
        names = sorted({settings.stream, *(cp.stream for cp in checkpoints)})
        streams = {name: streams_api.info(name) for name in names}
        now_ms = time.time() * 1000
        consumers = []
        for cp in checkpoints:
            info = streams[cp.stream]
            lag = streams_api.entries_after(cp.stream, cp.last_id) if info.length else 0
            consumers.append(
                {
                    "name": cp.name,
                    "stream": cp.stream,
                    "last_id": cp.last_id,
                    "lag_entries": lag,
                    "lag_seconds": _lag_seconds(cp.last_id, info.last_id, now_ms) if lag else 0.0,
                }
            )
        return {
            "staged": {"records": backlog, "oldest_age_seconds": oldest_age, "oldest_transaction": holder},
            "streams": [
                {"name": n, "length": i.length, "first_id": i.first_id, "last_id": i.last_id}
                for n, i in streams.items()
            ],
            "consumers": consumers,
        }
    finally:
        conn.close()
        client.close()


def _lag_seconds(checkpoint_id: str, last_id: str | None, now_ms: float) -> float:
    """How far behind the consumer is: age of the oldest entry it has not read (approximated by its checkpoint)."""
    if last_id is None:
        return 0.0
    checkpoint_ms = int(checkpoint_id.split("-", 1)[0])
    return round(max(0.0, now_ms - checkpoint_ms) / 1000, 3) if checkpoint_ms else round(now_ms / 1000, 3)


def format_status(report: dict[str, Any]) -> str:
    """The status report as aligned text tables."""
    staged = report["staged"]
    age = staged["oldest_age_seconds"]
    lines = [f"staged records: {staged['records']}" + (f" (oldest {age:.1f}s)" if age is not None else "")]
    holder = staged.get("oldest_transaction")
    if holder:
        lines.append(
            f"oldest open transaction: pid {holder['pid']} ({holder['application_name'] or '-'}, "
            f"{holder['database']}), open {holder['age_seconds']:.1f}s: records committed after it began wait for it"
        )
    lines.append("")
    lines += _table(
        ["stream", "length", "first id", "last id"],
        [[s["name"], s["length"], s["first_id"] or "-", s["last_id"] or "-"] for s in report["streams"]],
    )
    lines.append("")
    lines += _table(
        ["consumer", "stream", "checkpoint", "lag (entries)", "lag (s)"],
        [[c["name"], c["stream"], c["last_id"], c["lag_entries"], c["lag_seconds"]] for c in report["consumers"]]
        or [["(none)", "", "", "", ""]],
    )
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    cells = [header, *[[str(v) for v in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
