"""The shop's consumer: each ``order created`` record adds its quantity to the product's line in ``sales``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from unilog import Record


def record_sale(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
    for record in records:
        if (record.object, record.action) != ("order", "create"):
            continue  # other records on the stream are not ours
        conn.execute(
            """
            INSERT INTO sales (product, sold) VALUES (%(product)s, %(quantity)s)
            ON CONFLICT (product) DO UPDATE SET sold = sales.sold + EXCLUDED.sold
            """,
            record.data,
        )
    # no commit here: unilog commits these writes and the consumer's checkpoint in one transaction
