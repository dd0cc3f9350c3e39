"""``unilog consume``: a checkpoint consumer, a group worker or a partitioned worker, or N of them."""

from __future__ import annotations

import argparse
from typing import Any

from ..consume.settings import add_arguments
from .common import connection_args, fault_args, metrics_args, positive_int


def cmd_consume(args: argparse.Namespace) -> int:
    from ..consume.records import load_handler
    from .consuming import run_consumer

    return run_consumer(args, load_handler(args.handler))


def consume_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", help="the consumer's name: its checkpoint key (prefix, with --partitioned)")
    p.add_argument("--group", help="run as a worker of this consumer group instead of a checkpoint consumer")
    p.add_argument("--partitioned", action="store_true", help="per-key order over a partitioned stream")
    p.add_argument("--worker", help="this worker's name in a group or partitioned consumer (default: host-pid)")
    p.add_argument("--workers", type=positive_int, default=1, help="run this many worker processes")
    p.add_argument(
        "--from",
        dest="start_from",
        metavar="start|end|ID",
        help="where a new consumer or group begins: the stream's start (the default: it replays the retained "
        "stream), after its last entry (end), or after entry ID; refused for one that exists",
    )
    connection_args(p)
    p.add_argument("--once", action="store_true", help="consume everything in the stream, then exit")
    add_arguments(p)  # one option per consumer setting (unilog.consume.settings)
    fault_args(p)
    metrics_args(p)


def add(sub: Any) -> None:
    """Add this module's commands to the ``unilog`` sub-parsers."""
    p = sub.add_parser("consume", help="run a checkpoint consumer: HANDLER is package.module:function")
    p.add_argument("handler")
    consume_args(p)
    p.set_defaults(func=cmd_consume)
