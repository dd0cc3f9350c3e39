"""``unilog stream partition`` and ``unilog status``: stream settings and what every stream and consumer is doing."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .common import ExitCode, connection_args, positive_int, redis_api, settings_from


def cmd_stream_partition(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    api = redis_api(settings)
    try:
        api.set_partitions(args.stream, args.count)
    finally:
        api.close()
    print(f"unilog: stream {args.stream} has {args.count} partitions ({args.stream}.p0 .. .p{args.count - 1})")
    return ExitCode.OK


def cmd_stream_relayout(args: argparse.Namespace) -> int:
    from ..config import validate_stream_name

    settings = settings_from(args)
    streams = [validate_stream_name(s) for s in args.streams] or [settings.stream]
    api = redis_api(settings)
    try:
        for stream in streams:
            renamed, kept = api.relayout(stream)
            for old, new in renamed:
                print(f"unilog: renamed {old} -> {new}")
            for old in kept:
                print(f"unilog: kept {old}: its new name exists already (merge or delete one by hand)")
            print(f"unilog: stream {stream}: {len(renamed)} keys moved to the hash-tagged layout")
    finally:
        api.close()
    return ExitCode.OK


def cmd_status(args: argparse.Namespace) -> int:
    from ..ops.scale import TOP, worst
    from ..ops.status import collect_status, format_status

    report = collect_status(settings_from(args))
    # people get the worst streams and the totals; scripts get every stream unless they ask for fewer
    top = None if args.all else args.top if args.top is not None else (None if args.json else TOP)
    shown = worst(report, top)
    print(json.dumps(shown, indent=2) if args.json else format_status(shown))
    return ExitCode.OK


def add(sub: Any) -> None:
    """Add this module's commands to the ``unilog`` sub-parsers."""
    p = sub.add_parser("stream", help="stream settings")
    stream_sub = p.add_subparsers(dest="stream_command", required=True)
    q = stream_sub.add_parser("partition", help="split a stream into N partitions by record key (once)")
    q.add_argument("stream")
    q.add_argument("count", type=positive_int)
    connection_args(q)
    q.set_defaults(func=cmd_stream_partition)

    r = stream_sub.add_parser("relayout", help="rename a stream's Redis keys to the hash-tagged layout (once)")
    r.add_argument("streams", nargs="*", help="default: $UNILOG_STREAM")
    connection_args(r)
    r.set_defaults(func=cmd_stream_relayout)

    p = sub.add_parser("status", help="streams, staged backlog and consumer lag")
    connection_args(p)
    p.add_argument("--json", action="store_true")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument(
        "--top", type=positive_int, metavar="N", help="only the N streams most behind (default 20; --json: all)"
    )
    shown.add_argument("--all", action="store_true", help="every stream")
    p.set_defaults(func=cmd_status)
