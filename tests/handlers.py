"""Test handlers. `applied` records every application of a record, so a double apply is visible as a duplicate row."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from unilog import Record

APPLIED_DDL = """
CREATE TABLE IF NOT EXISTS applied (
    consumer TEXT   NOT NULL,
    producer TEXT   NOT NULL,
    seq      BIGINT,
    entry_id TEXT   NOT NULL,
    n        BIGINT,
    data     JSONB
)
"""


def record_applied(name: str, conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO applied (consumer, producer, seq, entry_id, n, data) VALUES (%s, %s, %s, %s, %s, %s::jsonb)",
            [
                (
                    name,
                    r.producer,
                    r.seq,
                    r.id,
                    (r.data or {}).get("n") if isinstance(r.data, dict) else None,
                    r.raw_data.decode() if r.raw_data else "null",
                )
                for r in records
            ],
        )


def cli_handler(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
    """Used by CLI tests (`unilog consume handlers:cli_handler --name cli`)."""
    record_applied("cli", conn, records)


def group_handler(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
    """Used by the group process tests; `SLOW_HANDLER` seconds per batch widen the mid-batch window."""
    import os
    import time

    record_applied("group", conn, records)
    time.sleep(float(os.environ.get("SLOW_HANDLER", "0")))


def ordered_handler(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
    """Used by the partition test: one row per application, in application order, with the worker's name."""
    import os
    import sys
    import time

    worker = sys.argv[sys.argv.index("--worker") + 1] if "--worker" in sys.argv else "?"
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO key_order (key, n, worker) VALUES (%s, %s, %s)",
            [(r.data["key"], r.data["n"], worker) for r in records],
        )
    time.sleep(float(os.environ.get("SLOW_HANDLER", "0")))


def poison_handler(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
    """Used by the poison CLI test: a record whose data has ``"poison": true`` fails the batch it is in."""
    for r in records:
        if r.data.get("poison"):
            raise ValueError(f"cannot apply record {r.data['n']}")
    record_applied("cli", conn, records)


APPLIED_INSERT = (
    "INSERT INTO applied (consumer, producer, seq, entry_id, n, data) VALUES (%s, %s, %s, %s, %s, %s::jsonb)"
)


def _rows(name: str, records: Sequence[Record]) -> list[tuple[Any, ...]]:
    return [
        (name, r.producer, r.seq, r.id, r.data.get("n") if isinstance(r.data, dict) else None, r.raw_data.decode())
        for r in records
    ]


async def async_record_applied(name: str, conn: psycopg.AsyncConnection[Any], records: Sequence[Record]) -> None:
    """:func:`record_applied` on an asyncio connection; iterating ``records`` is where a mid-batch crash fires."""
    async with conn.cursor() as cur:
        await cur.executemany(APPLIED_INSERT, _rows(name, [r for r in records]))


async def async_cli_handler(conn: psycopg.AsyncConnection[Any], records: Sequence[Record]) -> None:
    """Used by CLI tests (`unilog consume handlers:async_cli_handler --name cli`): the command line sees it is async."""
    import asyncio
    import os

    await async_record_applied("cli", conn, records)
    await asyncio.sleep(float(os.environ.get("SLOW_HANDLER", "0")))


async def async_group_handler(conn: psycopg.AsyncConnection[Any], records: Sequence[Record]) -> None:
    """Used by CLI tests (`unilog consume handlers:async_group_handler --group g`)."""
    await async_record_applied("group", conn, records)


MULTI_DDL = """
CREATE TABLE IF NOT EXISTS multi_applied (
    id     BIGSERIAL PRIMARY KEY,
    stream TEXT   NOT NULL,
    seq    BIGINT,
    i      BIGINT,
    batch  TEXT   NOT NULL
)
"""


def multi_applied(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
    """Used by the several-streams tests (`unilog consume handlers:multi_applied --streams ...`): one row per
    application, in application order, with its stream and the batch it came in (a double apply is a duplicate
    (stream, seq)); `SLOW_HANDLER` seconds per batch widen the window a kill lands in."""
    import os
    import time
    import uuid

    batch = uuid.uuid4().hex
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO multi_applied (stream, seq, i, batch) VALUES (%s, %s, %s, %s)",
            [(r.stream, r.seq, (r.data or {}).get("i"), batch) for r in records],
        )
    time.sleep(float(os.environ.get("SLOW_HANDLER", "0")))


async def async_multi_applied(conn: psycopg.AsyncConnection[Any], records: Sequence[Record]) -> None:
    """:func:`multi_applied` as an ``async def`` handler (`unilog consume handlers:async_multi_applied --streams ...`
    runs an ``AsyncMultiConsumer``)."""
    async with conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO multi_applied (stream, seq, i, batch) VALUES (%s, %s, %s, 'async')",
            [(r.stream, r.seq, (r.data or {}).get("i")) for r in records],
        )
