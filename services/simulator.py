"""``python -m services.simulator``: random rides against the API at a steady rate, with optional bursts.

Reports its achieved rate every few seconds. Options: ``--rate`` rides/s (``SIMULATOR_RATE``), ``--burst N`` every
``--burst-every`` seconds, ``--api`` (``API_URL``), ``--duration`` (default: until SIGTERM), ``--seed``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

import structlog

from unilog.log import configure_logging

log = structlog.get_logger(__name__)


class Client:
    """A keep-alive HTTP client for ``POST /rides`` that reconnects after errors."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self._conn: http.client.HTTPConnection | None = None

    def post_ride(self, distance: float) -> int:
        """POST one ride; return the HTTP status (0 if the API could not be reached)."""
        body = json.dumps({"distance": distance})
        try:
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
            self._conn.request("POST", "/rides", body, {"Content-Type": "application/json"})
            response = self._conn.getresponse()
            response.read()
            return response.status
        except (OSError, http.client.HTTPException):
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            return 0


def simulate(
    client: Client,
    rate: float,
    stop: threading.Event,
    *,
    burst: int = 0,
    burst_every: float = 0.0,
    seed: int | None = None,
) -> dict[str, int]:
    """Post rides until ``stop`` is set; return counts by outcome."""
    rng = random.Random(seed)
    counts = {"created": 0, "failed": 0}
    started = last_report = time.monotonic()
    next_burst = started + burst_every if burst and burst_every else float("inf")
    interval = 1.0 / rate if rate > 0 else 1.0
    next_at = started
    while not stop.is_set():
        n = 1
        now = time.monotonic()
        if now >= next_burst:
            n, next_burst = burst, now + burst_every
        for _ in range(n):
            status = client.post_ride(round(rng.uniform(0.1, 1000.0), 3))
            counts["created" if status == 201 else "failed"] += 1
        if now - last_report >= 5:
            log.info("simulator rate", rides_per_second=round(counts["created"] / (now - started), 1), **counts)
            last_report = now
        next_at += interval
        stop.wait(max(0.0, next_at - time.monotonic()))
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.simulator")
    parser.add_argument("--api", default=os.environ.get("API_URL", "http://127.0.0.1:5000"))
    parser.add_argument("--rate", type=float, default=float(os.environ.get("SIMULATOR_RATE", "20")))
    parser.add_argument("--burst", type=int, default=int(os.environ.get("SIMULATOR_BURST", "0")))
    parser.add_argument("--burst-every", type=float, default=float(os.environ.get("SIMULATOR_BURST_EVERY", "10")))
    parser.add_argument("--duration", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    configure_logging()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if args.duration is not None:
        threading.Timer(args.duration, stop.set).start()
    counts = simulate(Client(args.api), args.rate, stop, burst=args.burst, burst_every=args.burst_every, seed=args.seed)
    log.info("simulator stopped", **counts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
