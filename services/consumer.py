"""The reference design's distance consumer: ``python -m services.consumer NAME``.

Keeps, per consumer name, the total distance, the ride count and a checksum of ride ids in ``consumer_states``,
updated in the transaction unilog gives the handler, so the state and the checkpoint commit together. It reads the
typed ``RideCreated`` records (``services/records.py``), their distances exact ``Decimal``s. Faults come
from ``UNILOG_FAULTS`` / ``UNILOG_FAULT_SEED`` (the fleet injects consumer crashes at 10 %, like the reference).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import psycopg

from unilog import Record
from unilog.cli import consume_main

from .records import RideCreated
from .rides import CHECKSUM_MOD, STREAM, ride_checksum


def apply_rides(name: str, conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
    """Add the batch's ``RideCreated`` records to consumer ``name``'s state, in the caller's transaction; other
    records (a backfill's, the chaos harness's poison ones) are skipped. The distances are exact ``Decimal``s."""
    total, count, checksum = Decimal(0), 0, 0
    for record in records:
        if not record.is_a(RideCreated):
            continue
        ride = record.typed(RideCreated)
        total += ride.distance
        count += 1
        checksum += ride_checksum(ride.id)
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


def reset_state(conn: psycopg.Connection[Any], name: str) -> None:
    """Clear consumer ``name``'s state: ``--reset-state services.consumer:reset_state`` for a rebuild."""
    conn.execute("DELETE FROM consumer_states WHERE name = %s", (name,))


def handle(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
    """The handler by reference (``services.consumer:handle``): the state row is the consumer's or group's name.

    It takes :class:`~unilog.Record` objects and picks the rides itself (:func:`apply_rides`) rather than being
    annotated ``Sequence[RideCreated]``: the chaos harness wraps it to track every record of a batch, typed or not."""
    apply_rides(getattr(records, "consumer", "") or "rides", conn, records)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the distance consumer NAME; other options are ``unilog consume``'s (``--once``, ``--batch-size``...).

    With ``--group``, NAME is a consumer group and this process one of its workers (``--worker``, ``--workers N``);
    the group's state row is NAME, shared by its workers.
    """
    parser = argparse.ArgumentParser(prog="python -m services.consumer", add_help=False)
    parser.add_argument("name")
    parser.add_argument("--group", action="store_true")
    args, rest = parser.parse_known_args(argv)
    mode = ["--group", args.name] if args.group else ["--name", args.name]
    return consume_main(handle, [*mode, "--stream", STREAM, *rest], prog="python -m services.consumer")


if __name__ == "__main__":
    sys.exit(main())
