"""``python -m services.simulator``: random rides against the API at a steady rate, with optional bursts.

Reports its achieved rate every few seconds. Options: ``--rate`` rides/s (``SIMULATOR_RATE``), ``--burst N`` every
``--burst-every`` seconds, ``--api`` (``API_URL``), ``--duration`` (default: until SIGTERM), ``--seed``, and
``--history FILE`` (for ``unilog chaos``): append every call as JSON lines, an attempt before the request and its
outcome after it (``committed`` with the ride's chaos id ``ride-<id>`` on a 201, ``rolled_back`` when the API
refused it or it was never sent, ``unknown`` on a timeout, a dropped connection or a 5xx).
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
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import structlog

from unilog.log import configure_logging

if TYPE_CHECKING:
    from unilog.harness.chaos import HistoryWriter

log = structlog.get_logger(__name__)

RIDE_CID_PREFIX = "ride-"  # a ride's record in a chaos history: its object and id (unilog.harness.chaos.cid_of)


class Client:
    """A keep-alive HTTP client for ``POST /rides`` that reconnects after errors."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self._conn: http.client.HTTPConnection | None = None

    def post_ride(self, distance: float) -> int:
        """POST one ride; return the HTTP status (0 if the API could not be reached)."""
        return self.post_ride_detail(distance)[0]

    def post_ride_detail(self, distance: float) -> tuple[int, bytes, bool]:
        """POST one ride; return (HTTP status or 0, response body, whether the request may have reached the API)."""
        body = json.dumps({"distance": distance})
        sent = False
        try:
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
            if self._conn.sock is None:
                self._conn.connect()  # refused here: the request was never sent
            sent = True
            self._conn.request("POST", "/rides", body, {"Content-Type": "application/json"})
            response = self._conn.getresponse()
            return response.status, response.read(), True
        except (OSError, http.client.HTTPException):
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            return 0, b"", sent


def post_recorded(client: Client, distance: float, history: HistoryWriter) -> int:
    """POST one ride with its attempt and outcome in ``history``; return the HTTP status (0: unreachable)."""
    aid = history.attempt(cid_prefix=RIDE_CID_PREFIX)
    status, body, sent = client.post_ride_detail(distance)
    if status == 201:
        ride_id = json.loads(body)["ride"]["id"]
        history.outcome(aid, "committed", [f"{RIDE_CID_PREFIX}{ride_id}"])
    elif (400 <= status < 500) or not sent:
        history.outcome(aid, "rolled_back", status=status)  # refused before anything was written, or never sent
    else:
        history.outcome(aid, "unknown", status=status)  # timeout, dropped connection or 5xx: it may have committed
    return status


def simulate(
    client: Client,
    rate: float,
    stop: threading.Event,
    *,
    burst: int = 0,
    burst_every: float = 0.0,
    seed: int | None = None,
    history: HistoryWriter | None = None,
) -> dict[str, int]:
    """Post rides until ``stop`` is set; return counts by outcome (with ``history``, recording every call)."""
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
            distance = round(rng.uniform(0.1, 1000.0), 3)
            status = client.post_ride(distance) if history is None else post_recorded(client, distance, history)
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
    parser.add_argument("--history", help="append every call and its outcome to this JSON-lines file")
    args = parser.parse_args(argv)
    configure_logging()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if args.duration is not None:
        threading.Timer(args.duration, stop.set).start()
    history = None
    if args.history:
        from unilog.harness.chaos import HistoryWriter

        history = HistoryWriter(args.history, "simulator")
    counts = simulate(
        Client(args.api),
        args.rate,
        stop,
        burst=args.burst,
        burst_every=args.burst_every,
        seed=args.seed,
        history=history,
    )
    log.info("simulator stopped", **counts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
