"""The Rocket Rides model for ``unilog reconcile``: rides are canonical, consumer_states are derived.

``unilog reconcile --model services.reconcile:model`` (the default) compares every distance consumer with the totals
recomputed from ``rides`` on Spark, exactly (distances are NUMERIC), and ``--repair`` resets a diverged one.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import psycopg

from .rides import CHECKSUM_MOD, CHECKSUM_MUL, Totals, consumer_totals


class RidesModel:
    table = "rides"
    columns = ("id", "distance")
    spark_schema = "id long, distance decimal(14,3)"
    empty = Totals(Decimal(0), 0, 0)

    def rows_from_records(self, records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [
            (int(r["id"]), Decimal(str(r["distance"])).quantize(Decimal("0.001")))  # "12.346"; older records: 12.346
            for r in records
            if r.get("object") == "ride" and r.get("action") == "create"
        ]

    def totals(self, df: Any) -> Totals:
        from pyspark.sql import functions as f

        row = df.agg(
            f.sum("distance").alias("total"),
            f.count("*").alias("n"),
            f.sum(
                f.pmod(
                    f.col("id").cast("decimal(38,0)") * f.lit(str(CHECKSUM_MUL)).cast("decimal(38,0)"),
                    f.lit(CHECKSUM_MOD),
                )
            ).alias("check"),
        ).collect()[0]
        return Totals(Decimal(row["total"] or 0), int(row["n"]), int(row["check"] or 0) % CHECKSUM_MOD)

    def states(self, conn: psycopg.Connection[Any]) -> dict[str, Totals]:
        return consumer_totals(conn)

    def repair(self, conn: psycopg.Connection[Any], name: str, totals: Totals) -> None:
        conn.execute(
            """
            INSERT INTO consumer_states (name, total_distance, ride_count, checksum) VALUES (%s, %s, %s, %s)
            ON CONFLICT (name) DO UPDATE SET total_distance = excluded.total_distance,
                ride_count = excluded.ride_count, checksum = excluded.checksum
            """,
            (name, totals.total_distance, totals.ride_count, totals.checksum),
        )


model = RidesModel()
