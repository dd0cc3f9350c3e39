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
