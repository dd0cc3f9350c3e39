"""``unilog streamer``: publish staged records into Redis (``--once``: drain and exit)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..stream.settings import StreamerConfig
from .common import (
    ExitCode,
    connection_args,
    fault_args,
    faults_from,
    metrics_args,
    positive_int,
    run_until_signalled,
    serve_metrics,
    settings_from,
)


def cmd_streamer(args: argparse.Namespace) -> int:
    from ..stream.streamer import Streamer

    settings = settings_from(args)
    config = StreamerConfig(
        batch_size=args.batch_size,
        poll_interval=args.poll_interval,
        streams=tuple(args.streams.split(",")) if args.streams else None,
        restart_after_crash=not args.exit_on_crash,
        retention_interval=args.retention_interval,
        max_len=args.max_len,
        wait_replicas=args.wait_replicas,
        wait_timeout_ms=args.wait_timeout_ms,
        redis_memory_limit=args.redis_memory_limit / 100,
        pg_timeout=args.pg_timeout or None,
        side_session=not args.one_session,
    )
    if args.horizon_warn_after is not None:
        print("unilog: --horizon-warn-after has no effect since unilog 0.11: no record waits for another transaction")
    serve_metrics(args)
    with Streamer(settings, config, faults=faults_from(args), name=args.name) as streamer:
        if args.once:
            count = streamer.drain(max_wait=args.max_wait)
            print(f"unilog: streamed {count} records")
            if unrecovered := [loss for loss in streamer.losses if not loss.complete]:
                # the log went on (everything that could be published was), but records were lost: say so in the code
                print(f"unilog: the WAL capture slot was lost: {unrecovered[-1].line()}", file=sys.stderr)
                return ExitCode.CAPTURE_LOST
            return ExitCode.OK
        run_until_signalled(streamer.run)
    return ExitCode.OK


def add(sub: Any) -> None:
    """Add this module's commands to the ``unilog`` sub-parsers."""
    p = sub.add_parser("streamer", help="stream staged records into Redis")
    connection_args(p)
    p.add_argument("--once", action="store_true", help="drain everything visible, then exit")
    p.add_argument(
        "--max-wait",
        type=float,
        default=60.0,
        help="with --once: seconds publishing may stay paused because Redis is full before exit code 13 "
        "(default %(default)s)",
    )
    p.add_argument("--horizon-warn-after", type=float, default=None, help=argparse.SUPPRESS)  # retired, accepted
    p.add_argument("--batch-size", type=positive_int, default=StreamerConfig.batch_size, help="default %(default)s")
    p.add_argument(
        "--redis-memory-limit",
        type=float,
        default=StreamerConfig.redis_memory_limit * 100,
        metavar="PERCENT",
        help="pause publishing while Redis's used memory is at or above this percentage of its maxmemory, before it "
        "refuses writes (0: never pause; with --once, exit code 13 after --max-wait seconds paused; default "
        "%(default)g)",
    )
    p.add_argument(
        "--pg-timeout",
        type=float,
        default=StreamerConfig.pg_timeout,
        help="seconds a pass's Postgres calls may take before the connection is broken (a stuck server); --once "
        "then exits 4 naming the stuck call, a running streamer reconnects (0: no deadline; default %(default)s)",
    )
    p.add_argument("--poll-interval", type=float, default=1.0, help="seconds between polls without notifications")
    p.add_argument("--streams", help="comma-separated target streams this streamer publishes (default: all)")
    p.add_argument("--name", default="streamer", help="name in logs and pg_stat_activity")
    p.add_argument(
        "--retention-interval", type=float, default=5.0, help="seconds between trims behind registered consumers"
    )
    p.add_argument("--max-len", type=positive_int, help="hard cap on stream length (may trim past slow consumers)")
    p.add_argument("--wait-replicas", type=int, default=0, help="WAIT for this many replicas before deleting")
    p.add_argument("--wait-timeout-ms", type=positive_int, default=1000)
    p.add_argument(
        "--one-session",
        action="store_true",
        help="one Postgres connection, not two: a backlog over many streams is claimed share after share in it "
        "(by default a second session reads the next share meanwhile)",
    )
    fault_args(p)
    metrics_args(p)
    p.set_defaults(func=cmd_streamer)
