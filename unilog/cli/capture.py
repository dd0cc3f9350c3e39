"""``unilog capture wal|table|status``: how the streamer reads a database's staged records (table or WAL mode)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import InvalidUsage
from .common import ExitCode, connection_args, settings_from


def cmd_capture_wal(args: argparse.Namespace) -> int:
    from ..stream.modes import enable_wal

    settings = settings_from(args)
    slot = enable_wal(settings, slot=args.slot, recreate=args.recreate, failover_slot=not args.no_failover_slot)
    print(f"unilog: WAL capture on: slot {slot.slot}, publication {slot.publication}; running streamers follow")
    return ExitCode.OK


def cmd_capture_table(args: argparse.Namespace) -> int:
    from ..stream.modes import disable_wal

    disable_wal(settings_from(args))
    print("unilog: table mode: the slot is dropped; running streamers follow and publish what is still staged")
    return ExitCode.OK


def cmd_capture_status(args: argparse.Namespace) -> int:
    from ..stream.modes import capture_status

    report = capture_status(settings_from(args))
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return ExitCode.OK
    print(f"mode: {report['mode']} (wal_level {report['wal_level']}); producers stage {report['records_as']}")
    if report["mode"] == "wal":
        state = report["slot_state"]
        if state is None:
            print(f"slot {report['slot']}: MISSING: run `unilog capture wal --recreate`")
        else:
            print(
                f"slot {report['slot']}: {state['wal_status']}, streamer pid {state['active_pid'] or '-'}, confirmed "
                f"{state['confirmed_flush_lsn']} ({state['confirmed_lag_bytes'] or 0} bytes behind), WAL retained "
                f"{state['retained_bytes'] or 0} bytes"
            )
        print(_describe_safety(report["safety"]))
        if report["read_index"]:
            print("table-mode index: still present (every emit updates it): `unilog capture wal` again drops it")
    if report["read_index"] and not report["read_index_valid"]:
        print(
            "table-mode index: INVALID (an interrupted build or drop left it): `unilog capture table` drops and "
            "rebuilds it, `unilog capture wal` drops it"
        )
    return ExitCode.OK


def _describe_safety(safety: dict[str, Any]) -> str:
    """One line: whether a failover keeps the slot, and why producers are held to rows if they are."""
    kind = "failover slot" if safety["failover"] else "not a failover slot"
    if safety["failover"] and not safety["protected"]:
        kind += " (synchronized_standby_slots unset: the streamer may get ahead of a standby)"
    copies = ", ".join(
        f"{c['standby']}: {'synced' if c['synced'] else 'NOT READY'}" + (f" on {c['host']}" if c["host"] else "")
        for c in safety["copies"]
    )
    line = f"failover: {kind}; standbys: {', '.join(safety['standbys']) or 'none'}"
    line += f"; copies on standbys: {copies}" if copies else ""
    if safety["failover"] and safety["standbys"]:
        line += "; failover READY" if safety["failover_ready"] else f"; {safety['failover_not_ready']}"
    if safety["held_back"]:
        line += f"; LOGICAL DECODING HELD BACK: {safety['held_back']}"
    if safety["streamer_is_sync_standby"]:
        line += "; WARNING: the streamer is a synchronous standby (synchronous_standby_names '*'?): commits wait for it"
    if safety["held_reason"]:
        line += f"; producers held to rows: {safety['held_reason']}"
    for loss in safety["losses"]:
        line += f"\n{_describe_loss(loss)}"
    return line


def _describe_loss(loss: dict[str, Any]) -> str:
    count = "an unknown number" if loss["lost"] is None else loss["lost"]
    return (
        f"LOSS #{loss['id']} (not acknowledged): capture slot {loss['slot']} lost at {_when(loss['detected_at'])}"
        f"; {loss['recovered']} record messages recovered from the WAL ({loss['from_lsn']} to {loss['to_lsn']}), "
        f"{count} lost: {loss['detail']} (`unilog capture losses --ack {loss['id']}`)"
    )


def _when(moment: Any) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S %Z}" if hasattr(moment, "strftime") else str(moment)


def cmd_capture_losses(args: argparse.Namespace) -> int:
    """List the lost capture slots recorded, or acknowledge one (``--ack ID``)."""
    from .. import store

    settings = settings_from(args)
    with store.connect(settings.conninfo, application_name="unilog-capture") as conn:
        if args.ack is not None:
            by = args.by or conn.info.user
            if not store.acknowledge_loss(conn, args.ack, by):
                raise InvalidUsage(f"no unacknowledged capture loss #{args.ack} (`unilog capture losses` lists them)")
            conn.commit()
            print(f"unilog: capture loss #{args.ack} acknowledged by {by}")
            return ExitCode.OK
        losses = store.capture_losses(conn)
    if args.json:
        print(json.dumps(losses, indent=2, default=str))
        return ExitCode.OK
    if not losses:
        print("no capture slot was ever lost")
    for loss in losses:
        count = "unknown" if loss["lost"] is None else loss["lost"]
        by, at = loss["acknowledged_by"] or "-", loss["acknowledged_at"]
        acked = f"acknowledged by {by} at {_when(at)}" if at else "NOT ACKNOWLEDGED"
        print(
            f"#{loss['id']} {_when(loss['detected_at'])} slot {loss['slot']}: WAL {loss['from_lsn']} to "
            f"{loss['to_lsn']}, recovered {loss['recovered']}, lost {count} ({loss['detail']}); {acked}"
        )
    return ExitCode.OK


def add(sub: Any) -> None:
    """Add this module's commands to the ``unilog`` sub-parsers."""
    p = sub.add_parser("capture", help="table mode or WAL (commit-order) capture of staged records")
    capture_sub = p.add_subparsers(dest="capture_command", required=True)
    w = capture_sub.add_parser("wal", help="read staged records from a logical replication slot, in commit order")
    w.add_argument("--slot", help="slot name (default: unilog_<database oid>)")
    w.add_argument("--recreate", action="store_true", help="drop and re-create the slot (after it was lost)")
    w.add_argument(
        "--no-failover-slot",
        action="store_true",
        help="a slot no standby copies (before Postgres 17, where a standby is attached: producers then stage rows "
        "while one is, so a failover loses nothing)",
    )
    connection_args(w)
    w.set_defaults(func=cmd_capture_wal)
    t = capture_sub.add_parser("table", help="back to table mode: staged rows claimed in id order")
    connection_args(t)
    t.set_defaults(func=cmd_capture_table)
    s = capture_sub.add_parser("status", help="the mode, and the slot's state in WAL mode")
    s.add_argument("--json", action="store_true")
    connection_args(s)
    s.set_defaults(func=cmd_capture_status)
    losses = capture_sub.add_parser("losses", help="lost capture slots: what was recovered from the WAL, what was lost")
    losses.add_argument("--ack", type=int, metavar="ID", help="acknowledge loss ID (status and alerts stop naming it)")
    losses.add_argument("--by", help="who acknowledges (default: the Postgres user)")
    losses.add_argument("--json", action="store_true")
    connection_args(losses)
    losses.set_defaults(func=cmd_capture_losses)
