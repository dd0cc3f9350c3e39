"""The shop's consumer: each ``OrderCreated`` record adds its quantity to the product's line in ``sales``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from .records import OrderCreated


def record_sale(conn: psycopg.Connection[Any], orders: Sequence[OrderCreated]) -> None:
    # the annotation asks for OrderCreated records: other records on the stream are left out
    for order in orders:
        conn.execute(
            """
            INSERT INTO sales (product, sold) VALUES (%s, %s)
            ON CONFLICT (product) DO UPDATE SET sold = sales.sold + EXCLUDED.sold
            """,
            (order.product, order.quantity),
        )
    # no commit here: unilog commits these writes and the consumer's checkpoint in one transaction
