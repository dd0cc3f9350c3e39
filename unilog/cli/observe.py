"""``unilog metrics`` (the whole system's state as Prometheus metrics, :mod:`unilog.ops.exporter`) and
``unilog dashboard`` (the web page, :mod:`unilog.ops.dashboard`)."""

from __future__ import annotations

import argparse
import threading
from typing import Any

from .common import ExitCode, connection_args, non_negative_int, positive_int, run_until_signalled, settings_from


def cmd_metrics(args: argparse.Namespace) -> int:
    from prometheus_client import REGISTRY

    from .. import metrics
    from ..errors import ConfigurationError
    from ..ops.exporter import SystemCollector

    settings = settings_from(args)
    REGISTRY.register(SystemCollector(settings, None if args.max_streams == 0 else args.max_streams))
    try:
        metrics.serve(args.port, args.addr)
    except OSError as exc:
        raise ConfigurationError(f"cannot serve metrics on {args.addr}:{args.port}: {exc.strerror or exc}") from None
    print(f"unilog: metrics of the whole system on http://{args.addr}:{args.port}/metrics", flush=True)
    run_until_signalled(_wait)
    return ExitCode.OK


def cmd_dashboard(args: argparse.Namespace) -> int:
    from ..errors import ConfigurationError
    from ..ops.dashboard import History, Server, create_app

    settings = settings_from(args)
    history = History(settings, interval=args.interval, top=args.top)
    app = create_app(settings, history, read_only=args.read_only)
    try:
        server = Server(app, args.addr, args.port)
    except OSError as exc:
        raise ConfigurationError(f"cannot serve the dashboard on {args.addr}:{args.port}: {exc}") from None
    history.sample()
    server.start()
    print(
        f"unilog: dashboard on http://{args.addr}:{server.port}/" + (" (read-only)" if args.read_only else ""),
        flush=True,
    )
    try:
        run_until_signalled(history.run)
    finally:
        server.stop()
    return ExitCode.OK


def _wait(stop: threading.Event) -> None:
    stop.wait()  # the metrics are served from prometheus_client's own thread


def add(sub: Any) -> None:
    """Add this module's commands to the ``unilog`` sub-parsers."""
    p = sub.add_parser("metrics", help="serve the system's lag, backlog, open stagers and dead letters to Prometheus")
    p.add_argument("--port", type=int, default=9464, help="default %(default)s")
    p.add_argument("--addr", default="127.0.0.1", help="default %(default)s (0.0.0.0: every interface)")
    p.add_argument(
        "--max-streams",
        type=non_negative_int,
        default=100,
        metavar="N",
        help="labelled series for the N streams most behind, totals for all (default %(default)s; 0: every stream)",
    )
    connection_args(p)
    p.set_defaults(func=cmd_metrics)
    d = sub.add_parser("dashboard", help="serve a live web page: streams, lag, open stagers, dead letters")
    d.add_argument("--port", type=int, default=8765, help="default %(default)s")
    d.add_argument("--addr", default="127.0.0.1", help="default %(default)s: only this machine can open it")
    d.add_argument("--read-only", action="store_true", help="no replay or drop")
    d.add_argument("--interval", type=float, default=2.0, help="seconds between samples (default %(default)s)")
    d.add_argument(
        "--top",
        type=positive_int,
        default=20,
        metavar="N",
        help="show and chart the N streams most behind, with totals over all (default %(default)s)",
    )
    connection_args(d)
    d.set_defaults(func=cmd_dashboard)
