"""``unilog status``: streams, staged backlog, consumers, groups, lag, dead letters and the capture mode (in WAL mode
the slot's health), for people and scripts.

The consumers are those with a checkpoint in Postgres and those registered for retention in Redis (``unilog consumer
register``, :func:`unilog.ops.admin.declare`), on the streams the report covers: a consumer registered ahead of its
first run ("registered, never ran") holds the stream's retention before it has a checkpoint. Each registered one
shows how much of the stream it holds (:func:`unilog.stream.retention.held`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from .. import engine, store
from ..config import Settings, postgres_conninfo
from ..store.backfills import list_backfills
from ..stream import retention
from . import dlq
from .scale import totals


def collect_status(settings: Settings, since: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Gather the status report as plain data (what ``--json`` prints). With ``since`` (stream -> an entry id, e.g.
    its last id at an earlier report), each of those streams' row says how many entries were added after that id
    (``appended``; the dashboard's records per second in).

    Every stream is read in a few pipelined round trips per kind of read (:meth:`~unilog.engine.RedisStreams.survey`)
    and its publishers in one statement, so the report's cost follows the entries it counts, not the streams: 10,000
    streams are read in about as many round trips as 500."""
    # a report over 10,000 streams builds some 100,000 containers, none in a cycle and all alive until it is
    # returned: the cyclic collector's passes over them (and the whole heap) found nothing, some 40 % of its time
    with engine.no_gc():
        return _collect(settings, since)


def _collect(settings: Settings, since: Mapping[str, str] | None) -> dict[str, Any]:
    conn = store.connect(settings.conninfo, autocommit=True, application_name="unilog-status")
    client = engine.connect(settings.redis_url)
    engine.ping(client, settings.redis_url)
    api = engine.RedisStreams(client)
    try:
        store.check_schema(conn)
        backlog = {(s or settings.stream): v for s, v in store.staged_by_stream(conn).items()}
        checkpoints = store.list_checkpoints(conn)
        names = sorted({settings.stream, *backlog, *(cp.stream for cp in checkpoints)})
        positions: dict[str, list[str]] = {}
        for stream, position in [(cp.stream, cp.last_id) for cp in checkpoints] + list((since or {}).items()):
            positions.setdefault(stream, []).append(position)
        surveyed = api.survey(names, positions)
        parts = [p for n in names for p in _partition_names(n, surveyed[n].partitions) if p not in surveyed]
        surveyed |= api.survey(parts, positions)
        publishers = store.stream_lock_holders_many(conn, names)
        now_ms = time.time() * 1000
        ranges = _Ranges(api, surveyed)
        streams, registrations = _streams(api, [*names, *parts], surveyed, backlog, publishers, ranges, now_ms)
        for row in streams:  # the survey read each stream at one instant: after an id to '+' is to its last id
            if since and since.get(row["name"]) and row["last_id"]:
                row["appended"] = ranges.get(row["name"], since[row["name"]]).count
        report = {
            "staged": _staged(conn),
            "capture": capture_health(conn, settings.standby_conninfos),
            "streams": streams,
            "consumers": _consumers(checkpoints, registrations, ranges, now_ms),
            "backfills": [b for b in list_backfills(conn) if b["status"] == "running"],
        }
        report["totals"] = totals(report)
        return report
    finally:
        conn.close()
        client.close()


class _Ranges:
    """Entry counts of ranges of streams, ``(stream, after id, end)``: those the survey counted (to the end, ``+``),
    read where the survey holds them (not copied: 10,000 streams' counts would be as many keys built per report),
    and any other counted once on first need, all that are missing in one pipelined read."""

    def __init__(self, api: engine.RedisStreams, surveyed: dict[str, engine.StreamSurvey]) -> None:
        self.api = api
        self.surveyed = surveyed
        self.known: dict[tuple[str, str, str], engine.RangeCount] = {}

    def _found(self, stream: str, after: str, end: str) -> engine.RangeCount | None:
        if end == "+" and (found := self.surveyed.get(stream)) is not None and after in found.after:
            return found.after[after]
        return self.known.get((stream, after, end))

    def count(self, wanted: list[tuple[str, str, str]]) -> None:
        missing = list(dict.fromkeys(r for r in wanted if self._found(*r) is None))
        if missing:
            self.known.update(zip(missing, self.api.count_ranges(missing), strict=True))

    def get(self, stream: str, after: str, end: str = "+") -> engine.RangeCount:
        found = self._found(stream, after, end)
        if found is None:
            self.count([(stream, after, end)])
            found = self.known[(stream, after, end)]
        return found


def _staged(conn: Any) -> dict[str, Any]:
    records, oldest = store.staged_backlog(conn)
    return {"records": records, "oldest_age_seconds": oldest, "open_stager": store.oldest_stager(conn)}


def capture_health(conn: Any, conninfos: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The capture mode, and in WAL mode its slot's health: whether a streamer streams from it (``active``), the WAL
    the server keeps for it (``retained_bytes``: the current WAL position minus its ``restart_lsn``) and what its
    streamer has not confirmed (``confirmed_lag_bytes``: minus its ``confirmed_flush_lsn``). Table mode has no slot."""
    current = store.capture_slot(conn)
    if current is None:
        return {"mode": "table", "slot": None, "wal_level": store.wal_level(conn)}
    state = store.slot_state(conn, current.slot)
    if state is None:
        missing = {"exists": False, "active": False, "active_pid": None, "failover": False, "held_reason": None}
        missing |= _losses(conn)
        return {"mode": "wal", "slot": current.slot, **missing}
    return {
        "mode": "wal",
        "slot": current.slot,
        "exists": True,
        "active": state["active_pid"] is not None,
        "active_pid": state["active_pid"],
        "wal_status": state["wal_status"],
        "retained_bytes": state["retained_bytes"],
        "confirmed_lag_bytes": state["confirmed_lag_bytes"],
        **_failover(conn, current.slot, conninfos),
        **_losses(conn),
    }


def _failover(conn: Any, slot: str, conninfos: tuple[str, ...] | None) -> dict[str, Any]:
    """Whether a failover keeps the slot: given ``conninfos`` (where the standbys' copies are read), whether every
    standby holds a copy ready to take over (``failover_ready``; None: not checked, or not a failover slot), how many
    do, why not, and whether ``synchronized_standby_slots`` holds logical decoding back; and whether producers are
    held to rows (and why)."""
    safety = store.slot_safety(conn, slot, conninfos or ())
    reason, _saved, _lsn = store.rows_held(conn)
    readiness = safety.readiness if conninfos is not None else None
    ready = None if conninfos is None else (not safety.standbys if readiness is None else readiness.ready)
    return {
        "failover": safety.failover,
        "protected": safety.protected,
        "risk": safety.risk,
        "held_reason": reason,
        "copies_ready": None if readiness is None else sum(1 for c in readiness.copies if c.ready),
        "failover_ready": ready,  # a promotion now keeps the slot (no standby: nothing to promote)
        "failover_not_ready": readiness.reason if readiness is not None else (safety.risk if ready is False else None),
        "held_back": None if safety.readiness is None else safety.readiness.held_back,
    }


def _losses(conn: Any) -> dict[str, Any]:
    """The capture slots lost with records that could not be recovered, not yet acknowledged."""
    losses = store.capture_losses(conn, unacknowledged=True)
    return {
        "losses_unacknowledged": len(losses),
        "loss": None if not losses else {k: str(v) if k == "detected_at" else v for k, v in losses[0].items()},
    }


def _partition_names(stream: str, count: int) -> list[str]:
    return [f"{stream}.p{i}" for i in range(count)] if count > 1 else []


def _waited(first_id: str | None, now_ms: float) -> float | None:
    """Age in seconds of the entry ``first_id`` (how long the oldest unread one waited); None if there is none."""
    if first_id is None:
        return None
    return round(max(0.0, now_ms - engine.id_tuple(first_id)[0]) / 1000, 3)


def _lag(counted: engine.RangeCount, now_ms: float) -> tuple[int, float]:
    """(entries after a position, age in seconds of the first of them: how long the oldest unread one waited)."""
    waited = _waited(counted.first_id, now_ms)
    return (0, 0.0) if waited is None else (counted.count, waited)


def _streams(
    api: engine.RedisStreams,
    names: list[str],
    surveyed: dict[str, engine.StreamSurvey],
    backlog: dict[str, tuple[int, float | None]],
    publishers: dict[str, int],
    ranges: _Ranges,
    now_ms: float,
) -> tuple[list[dict[str, Any]], dict[str, dict[str, dict[str, Any]]]]:
    """Each stream's report, and its registered consumers (stream -> name -> what :func:`_consumer` shows of a
    registration). What each registration holds that the survey did not count is counted in one pipelined read."""
    # only registrations hold ranges to count: a stream without any (most, at scale) needs no holders worked out
    everyone = {
        n: retention.holders_of(
            surveyed[n].registered, surveyed[n].groups, {g["name"]: g["oldest-pending"] for g in surveyed[n].groups}
        )
        for n in names
        if surveyed[n].registered
    }
    held = {n: retention.held_ranges(holders) for n, holders in everyone.items()}
    ranges.count([(n, after, end) for n, spans in held.items() for after, end in spans.values()])
    registrations = {
        n: _registrations(holders, {name: ranges.get(n, *span).count for name, span in held[n].items()})
        for n, holders in everyone.items()
    }
    rows = [_stream(api, n, surveyed[n], backlog.get(n), publishers.get(n), now_ms) for n in names]
    return rows, registrations


def _registrations(everyone: list[retention.Holder], counts: dict[str, int]) -> dict[str, dict[str, Any]]:
    """The consumers registered on ``stream``: each one's registered id, the entries it holds and whether it is the
    lowest holder, the one trimming stops at (it then holds the oldest retained entries)."""
    lowest = min((h.floor for h in everyone), key=engine.id_tuple, default=None)
    return {
        h.name: {
            "registered_id": h.floor,
            "holds_entries": counts[h.name],
            "holds_oldest": counts[h.name] > 0 and h.floor == lowest,
        }
        for h in everyone
        if h.kind == "consumer"
    }


def _stream(
    api: engine.RedisStreams,
    name: str,
    surveyed: engine.StreamSurvey,
    staged: tuple[int, float | None] | None,
    publishers: int | None,
    now_ms: float,
) -> dict[str, Any]:
    """One stream's report (``publishers`` None: a partition, published by its stream's streamer, has no lock of its
    own). Its dead letters are read only when it has some, to count them per group."""
    letters = dlq.list_letters(api, name) if surveyed.dead_letters and surveyed.groups else []
    groups = []
    for group in surveyed.groups:
        group_name = str(group["name"])
        lag, waited = _lag(group["lag"], now_ms)
        groups.append(
            {
                "name": group_name,
                "workers": int(group["consumers"]),
                "pending": int(group["pending"]),
                "last_delivered_id": group["last-delivered-id"],
                "lag_entries": lag,
                "lag_seconds": waited,
                "dead_letters": sum(1 for d in letters if d.group == group_name),
            }
        )
    return {
        "name": name,
        "length": surveyed.info.length,
        "first_id": surveyed.info.first_id,
        "last_id": surveyed.info.last_id,
        "staged": staged[0] if staged else 0,
        "staged_oldest_age_seconds": staged[1] if staged else None,
        "partitions": surveyed.partitions,
        "publishers": publishers,
        "dead_letters": surveyed.dead_letters,
        "groups": groups,
    }


def _consumers(
    checkpoints: list[store.Checkpoint],
    registrations: dict[str, dict[str, dict[str, Any]]],
    ranges: _Ranges,
    now_ms: float,
) -> list[dict[str, Any]]:
    """A row per checkpoint and per registration without one (registered, never ran), by name and stream; what the
    survey did not count is counted in one pipelined read."""
    ran = {(cp.stream, cp.name) for cp in checkpoints}
    found: list[tuple[str, str, store.Checkpoint | None]] = [(cp.name, cp.stream, cp) for cp in checkpoints]
    found += [(n, s, None) for s, registered in registrations.items() for n in registered if (s, n) not in ran]
    regs = [registrations.get(stream, {}).get(name) for name, stream, _cp in found]
    # a consumer registered ahead of its first run lags by what follows its registered id
    starts = [
        cp.last_id if cp else str((r or {})["registered_id"]) for (_n, _s, cp), r in zip(found, regs, strict=True)
    ]
    aged = [str(r["registered_id"]) if r and r["registered_id"] is not None else None for r in regs]
    wanted = [(stream, start, "+") for (_n, stream, _cp), start in zip(found, starts, strict=True)]
    ranges.count(wanted + [(f[1], a, "+") for f, a in zip(found, aged, strict=True) if a is not None])
    rows = []
    for (name, stream, cp), reg, start, registered_id in zip(found, regs, starts, aged, strict=True):
        waited = None if registered_id is None else _waited(ranges.get(stream, registered_id).first_id, now_ms)
        rows.append(_consumer(name, stream, cp, reg, _lag(ranges.get(stream, start), now_ms), waited))
    return sorted(rows, key=lambda row: (row["name"], row["stream"]))


def _consumer(
    name: str,
    stream: str,
    cp: store.Checkpoint | None,
    registration: dict[str, Any] | None,
    lag: tuple[int, float],
    registered_waited: float | None,
) -> dict[str, Any]:
    """A consumer's row: its checkpoint (``last_id`` None: registered, never ran), ``lag`` after the checkpoint
    (after the registered id if it never ran), and its registration: the registered id (None: retention does not
    wait for it), the entries it holds, whether they are the oldest retained, and ``registration_age_seconds``: how
    long the first entry after the registered id has waited (``registered_waited``; 0 when none follows it)."""
    registered_id = registration["registered_id"] if registration else None
    age = None
    if registered_id is not None:
        age = lag[1] if cp is None else (registered_waited or 0.0)
    return {
        "name": name,
        "stream": stream,
        "last_id": cp.last_id if cp else None,
        "never_ran": cp is None,
        "positions": {p: f"{e}:{s}" for p, (e, s) in cp.positions.items()} if cp and cp.positions else {},
        "lag_entries": lag[0],
        "lag_seconds": lag[1],
        "registered_id": registered_id,
        "holds_entries": registration["holds_entries"] if registration else 0,
        "holds_oldest": bool(registration and registration["holds_oldest"]),
        "registration_age_seconds": age,
    }


def holds_text(consumer: dict[str, Any]) -> str:
    """What a consumer's registration holds, in words: ``holds 12 entries (the oldest retained)``, ``holds nothing``,
    or ``not registered`` (retention does not wait for it)."""
    if consumer.get("registered_id") is None:
        return "not registered"
    n = consumer["holds_entries"]
    if not n:
        return "holds nothing"
    oldest = " (the oldest retained)" if consumer["holds_oldest"] else ""
    return f"holds {n} {'entry' if n == 1 else 'entries'}{oldest}"


def format_status(report: dict[str, Any]) -> str:
    """The status report as aligned text tables."""
    staged = report["staged"]
    age = staged["oldest_age_seconds"]
    lines = [f"staged records: {staged['records']}" + (f" (oldest {age:.1f}s)" if age is not None else "")]
    holder = staged.get("open_stager")
    if holder:
        lines.append(_stager_line(holder))
    lines.append(format_capture(report.get("capture")))
    lines.append(format_totals(report))
    lines.append("")
    lines += table(
        ["stream", "length", "first id", "last id", "staged", "publishers", "dead letters"],
        [
            [
                s["name"],
                s["length"],
                s["first_id"] or "-",
                s["last_id"] or "-",
                s["staged"],
                "-" if s["publishers"] is None else s["publishers"],
                s["dead_letters"],
            ]
            for s in report["streams"]
        ],
    )
    lines.append("")
    lines += table(
        ["consumer", "stream", "checkpoint", "registered", "lag (entries)", "lag (s)", "retention"],
        [
            [
                c["name"],
                c["stream"],
                "registered, never ran" if c["last_id"] is None else c["last_id"],
                c["registered_id"] or "-",
                c["lag_entries"],
                c["lag_seconds"],
                holds_text(c),
            ]
            for c in report["consumers"]
        ]
        or [["(none)", "", "", "", "", "", ""]],
    )
    if report.get("backfills"):
        lines.append("")
        lines += format_backfills(report["backfills"])
    groups = [(s["name"], g) for s in report["streams"] for g in s["groups"]]
    if groups:
        lines.append("")
        lines += table(
            ["group", "stream", "workers", "pending", "lag (entries)", "lag (s)", "dead letters"],
            [
                [g["name"], stream, g["workers"], g["pending"], g["lag_entries"], g["lag_seconds"], g["dead_letters"]]
                for stream, g in groups
            ],
        )
    return "\n".join(lines)


def _stager_line(holder: dict[str, Any]) -> str:
    return (
        f"open transaction that staged records: pid {holder['pid']} ({holder['application_name'] or '-'}, "
        f"{holder['database']}, {holder['state']}), open {holder['age_seconds']:.1f}s: its own records wait "
        f"for its commit (no one else's do); its query: {holder['query']!r}"
    )


def format_totals(report: dict[str, Any]) -> str:
    """One line of totals over every stream, and how many are left out of the tables below (``--all`` shows them)."""
    t = report.get("totals") or totals(report)
    omitted = (report.get("omitted") or {}).get("streams", 0)
    cut = f"; the {t['streams'] - omitted} most behind shown (--all: every one)" if omitted else ""
    unpublished = (
        f", {t['unpublished_streams']} with staged records and NO PUBLISHER" if t["unpublished_streams"] else ""
    )
    return (
        f"streams: {t['streams']} ({t['entries']} entries, {t['staged']} staged, {t['dead_letters']} dead letters"
        f"{unpublished}); consumers: {t['consumers']}, groups: {t['groups']} ({t['pending']} pending); lag: "
        f"{t['lag_entries']} entries, at most {t['max_lag_seconds']:.1f}s{cut}"
    )


def format_backfills(rows: list[dict[str, Any]]) -> list[str]:
    """Backfills as a table: name, table, status (``running`` by a process now, or ``stopped``: resume it), rows
    done of the estimate, the last key staged."""
    return table(
        ["backfill", "table", "status", "rows", "last key", "where"],
        [
            [
                b["name"],
                b["table"],
                b["status"] if b["status"] != "running" else ("running" if b["active"] else "stopped (resume it)"),
                f"{b['rows_done']} of ~{b['rows_estimate']}" if b["rows_estimate"] is not None else b["rows_done"],
                "-" if b["last_key"] is None else b["last_key"],
                b["where"] or "-",
            ]
            for b in rows
        ]
        or [["(none)", "", "", "", "", ""]],
    )


def capture_mode_line(database_url: str) -> str:
    """:func:`format_capture`'s line for the database at ``database_url`` (``unilog migrate`` prints it)."""
    with store.connect(postgres_conninfo(database_url), autocommit=True, application_name="unilog-status") as conn:
        return format_capture(capture_health(conn))


def describe_mode(wal_level: str | None) -> str:
    """One line for a database in table mode: what it guarantees, and how to switch to WAL mode on this server."""
    if wal_level == "logical":
        switch = "`unilog capture wal` switches to WAL mode (this server has wal_level=logical)"
    else:
        switch = (
            f"WAL mode needs wal_level=logical (this server has {wal_level or 'an unknown wal_level'}: set it and "
            "restart Postgres), then `unilog capture wal`"
        )
    return f"capture: table mode (commit order per row; every record in commit order: {switch})"


def format_capture(capture: dict[str, Any] | None) -> str:
    """One line: the capture mode, and in WAL mode the slot's streamer, retained WAL and confirmation lag (in table
    mode, how to switch)."""
    if capture is None or capture["mode"] == "table":
        return describe_mode((capture or {}).get("wal_level"))
    slot = capture["slot"]
    if not capture["exists"]:
        return f"capture: WAL, slot {slot} MISSING: run `unilog capture wal --recreate`"
    streamer = f"streamer pid {capture['active_pid']}" if capture["active"] else "NO ACTIVE STREAMER"
    kind = "failover slot" if capture["failover"] else "slot"
    held = f"; PRODUCERS HELD TO ROWS: {capture['held_reason']}" if capture["held_reason"] else ""
    if capture.get("held_back"):
        held += f"; LOGICAL DECODING HELD BACK: {capture['held_back']}"
    if capture.get("failover_ready") is True and capture.get("copies_ready"):
        held += f"; failover ready ({capture['copies_ready']} standby copies synchronised)"
    return (
        f"capture: WAL mode (commit order), {kind} {slot} ({capture['wal_status']}): {streamer}, WAL retained "
        f"{_size(capture['retained_bytes'])}, confirmation lag {_size(capture['confirmed_lag_bytes'])}{held}; "
        f"`unilog capture table` switches back{_format_loss(capture)}"
    )


def _format_loss(capture: dict[str, Any]) -> str:
    loss = capture.get("loss")
    if not loss:
        return ""
    count = "an unknown number of" if loss["lost"] is None else str(loss["lost"])
    more = f" ({capture['losses_unacknowledged']} unacknowledged)" if capture["losses_unacknowledged"] > 1 else ""
    return (
        f"\ncapture: RECORDS LOST{more}: the slot lost at {loss['detected_at']} took {count} record messages with it "
        f"({loss['detail']}; WAL {loss['from_lsn']} to {loss['to_lsn']}): `unilog capture losses --ack {loss['id']}`"
    )


def _size(n: int | None) -> str:
    """Bytes for people: ``512 B``, ``3.2 MiB``; ``-`` for None."""
    if n is None:
        return "-"
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    value, i = float(n), 0
    while abs(value) >= 1024 and i < len(units) - 1:
        value, i = value / 1024, i + 1
    return f"{n} B" if i == 0 else f"{value:.1f} {units[i]}"


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """Rows as left-aligned columns under ``header``."""
    cells = [header, *[[str(v) for v in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
