"""``unilog capture wal|table|status``: how the streamer reads a database's staged records (table or WAL mode)."""

from __future__ import annotations

import argparse
import json
from typing import Any

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
        print(json.dumps(report, indent=2))
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
    copies = ", ".join(f"{c['host']}: {'synced' if c['synced'] else 'NOT synced'}" for c in safety["copies"])
    line = f"failover: {kind}; standbys: {', '.join(safety['standbys']) or 'none'}"
    line += f"; copies on standbys: {copies}" if copies else ""
    if safety["streamer_is_sync_standby"]:
        line += "; WARNING: the streamer is a synchronous standby (synchronous_standby_names '*'?): commits wait for it"
    if safety["held_reason"]:
        line += f"; producers held to rows: {safety['held_reason']}"
    return line


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
