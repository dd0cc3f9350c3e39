"""Trivial consumer handlers, importable by ``python -m unilog consume bench.handlers:count_records``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from unilog import Record

handled = 0


def count_records(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
    """Do (almost) nothing: count the records handed over."""
    global handled
    handled += len(records)


def _tally(conn: psycopg.Connection[Any], name: str, records: Sequence[Record]) -> None:
    """Add the batch's records to ``bench_state`` row ``name``, in the consumer's own transaction (a soak's state
    write: one row updated per batch, as an application's derived state would be)."""
    n = sum(1 for _ in records)
    conn.execute(
        "INSERT INTO bench_state (name, n) VALUES (%s, %s) ON CONFLICT (name) DO UPDATE SET n = bench_state.n + %s",
        (name, n, n),
    )


def soak_checkpoint(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
    """The soak's checkpoint consumer: counts its records in ``bench_state`` row ``checkpoint``."""
    _tally(conn, "checkpoint", records)


def soak_group(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
    """The soak's group worker: counts its records in ``bench_state`` row ``group``."""
    _tally(conn, "group", records)


_kept: list[bytes] = []


def soak_leaky(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
    """``soak_checkpoint`` with a deliberate leak: it keeps 1 kB per record for good (the soak's ``table-leak``
    variant, which its growth check must fail)."""
    _tally(conn, "checkpoint", records)
    _kept.extend(bytes(1024) for _ in records)
