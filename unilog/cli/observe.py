"""``unilog metrics``: serve the whole system's state as Prometheus metrics (see :mod:`unilog.exporter`)."""

from __future__ import annotations

import argparse
import threading
from typing import Any

from .common import ExitCode, connection_args, run_until_signalled, settings_from


def cmd_metrics(args: argparse.Namespace) -> int:
    from prometheus_client import REGISTRY

    from .. import metrics
    from ..errors import ConfigurationError
    from ..exporter import SystemCollector

    settings = settings_from(args)
    REGISTRY.register(SystemCollector(settings))
    try:
        metrics.serve(args.port, args.addr)
    except OSError as exc:
        raise ConfigurationError(f"cannot serve metrics on {args.addr}:{args.port}: {exc.strerror or exc}") from None
    print(f"unilog: metrics of the whole system on http://{args.addr}:{args.port}/metrics", flush=True)
    run_until_signalled(_wait)
    return ExitCode.OK


def _wait(stop: threading.Event) -> None:
    stop.wait()  # the metrics are served from prometheus_client's own thread


def add(sub: Any) -> None:
    """Add this module's commands to the ``unilog`` sub-parsers."""
    p = sub.add_parser("metrics", help="serve the system's lag, backlog, horizon and dead letters to Prometheus")
    p.add_argument("--port", type=int, default=9464, help="default %(default)s")
    p.add_argument("--addr", default="127.0.0.1", help="default %(default)s (0.0.0.0: every interface)")
    connection_args(p)
    p.set_defaults(func=cmd_metrics)
