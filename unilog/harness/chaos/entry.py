"""What every chaos process entry point shares: stopping on SIGTERM, and the wrapper options (``--seed-base``,
``--incarnations``, ``--handler``, ``--fail-poison``) that give each incarnation of a process its own fault seed."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from collections.abc import Sequence
from pathlib import Path


def next_incarnation(path: Path) -> int:
    """The number of the incarnation starting now (0 first), counted in ``path`` across restarts."""
    try:
        n = int(path.read_text().strip() or 0)
    except (FileNotFoundError, ValueError):
        n = 0
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(n + 1))
    tmp.replace(path)
    return n


def seed_faults(seed_base: int | None, incarnations: str | None) -> None:
    """A fault seed per incarnation: a process restarted after a crash must not replay the same crash."""
    if seed_base is None:
        return
    n = next_incarnation(Path(incarnations)) if incarnations else 0
    os.environ["UNILOG_FAULT_SEED"] = str(seed_base * 1000 + n)


def stop_event() -> threading.Event:
    """An event SIGTERM and SIGINT set: the process finishes what it is doing and returns."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


def wrapper_args(prog: str, argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The wrapper's own options and the rest (the wrapped command's); seeds this incarnation's faults."""
    parser = argparse.ArgumentParser(prog=prog, allow_abbrev=False, add_help=False)
    parser.add_argument("--seed-base", type=int)
    parser.add_argument("--incarnations")
    parser.add_argument("--handler", help="module:function (consume: required)")
    parser.add_argument("--fail-poison", action="store_true")
    args, rest = parser.parse_known_args(argv)
    seed_faults(args.seed_base, args.incarnations)
    return args, rest
