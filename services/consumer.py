"""The reference design's distance consumer: ``python -m services.consumer NAME``.

Keeps, per consumer name, the total distance, the ride count and a checksum of ride ids in ``consumer_states``,
updated in the transaction unilog gives the handler, so the state and the checkpoint commit together. Faults come
from ``UNILOG_FAULTS`` / ``UNILOG_FAULT_SEED`` (the fleet injects consumer crashes at 10 %, like the reference).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import psycopg

from unilog import Record
from unilog.cli import consume_main

from .rides import CHECKSUM_MOD, STREAM, ride_checksum


def apply_rides(name: str, conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
    """Add the batch's ride records to consumer ``name``'s state, in the caller's transaction."""
    total, count, checksum = Decimal(0), 0, 0
    for record in records:
        if record.object != "ride" or record.action != "create":
            continue
        total += Decimal(repr(record.data["distance"])).quantize(Decimal("0.001"))
        count += 1
        checksum += ride_checksum(int(record.data["id"]))
    if not count:
        return
    conn.execute(
        """
        INSERT INTO consumer_states AS s (name, total_distance, ride_count, checksum) VALUES (%s, %s, %s, %s)
        ON CONFLICT (name) DO UPDATE SET
            total_distance = s.total_distance + excluded.total_distance,
            ride_count = s.ride_count + excluded.ride_count,
            checksum = mod(s.checksum::numeric + excluded.checksum, %s)::bigint
        """,
        (name, total, count, checksum % CHECKSUM_MOD, CHECKSUM_MOD),
    )


def handler_for(name: str) -> Callable[[psycopg.Connection[Any], Sequence[Record]], None]:
    """The handler bound to one consumer name."""

    def handle(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
        apply_rides(name, conn, records)

    return handle


def main(argv: Sequence[str] | None = None) -> int:
    """Run the distance consumer NAME; other options are ``unilog consume``'s (``--once``, ``--batch-size``...)."""
    parser = argparse.ArgumentParser(prog="python -m services.consumer", add_help=False)
    parser.add_argument("name")
    args, rest = parser.parse_known_args(argv)
    return consume_main(
        handler_for(args.name), ["--name", args.name, "--stream", STREAM, *rest], prog="python -m services.consumer"
    )


if __name__ == "__main__":
    sys.exit(main())
