"""The demo's data model: rides (canonical) and the consumers' derived state.

Distances are ``NUMERIC(14, 3)`` (kilometres to the metre), so sums are exact: two consumers that applied the same
rides in different batches agree to the last digit, and a comparison with the canonical table needs no tolerance.
Besides the total and the count, each consumer keeps an order-independent checksum of the ride ids it applied, so
a lost ride and a double-counted one are both detected even when they cancel out in the count.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import BigInteger, Numeric, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

STREAM = "rocket-rides-log"
CHECKSUM_MOD = 2**63 - 1
CHECKSUM_MUL = 0x9E3779B97F4A7C15  # spreads consecutive ids over the whole range


class Base(DeclarativeBase):
    pass


class Ride(Base):
    __tablename__ = "rides"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    distance: Mapped[Decimal] = mapped_column(Numeric(14, 3), nullable=False)


class ConsumerState(Base):
    __tablename__ = "consumer_states"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    total_distance: Mapped[Decimal] = mapped_column(Numeric(20, 3), nullable=False, default=Decimal(0))
    ride_count: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    checksum: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)


def ride_checksum(ride_id: int) -> int:
    """One ride's contribution to the checksum (the checksum is their sum mod 2^63-1)."""
    return ride_id * CHECKSUM_MUL % CHECKSUM_MOD


CANONICAL_SQL = f"""
    SELECT coalesce(sum(distance), 0)::numeric(20, 3), count(*),
           coalesce(mod(sum(mod(id::numeric * {CHECKSUM_MUL}, {CHECKSUM_MOD})), {CHECKSUM_MOD}), 0)::bigint
    FROM rides
"""


@dataclass(frozen=True)
class Totals:
    """A total distance, a ride count and a checksum: the canonical ones or one consumer's."""

    total_distance: Decimal
    ride_count: int
    checksum: int

    def as_dict(self) -> dict[str, Any]:
        return {"total_distance": str(self.total_distance), "ride_count": self.ride_count, "checksum": self.checksum}

    def __add__(self, other: Totals) -> Totals:
        return Totals(
            self.total_distance + other.total_distance,
            self.ride_count + other.ride_count,
            (self.checksum + other.checksum) % CHECKSUM_MOD,
        )

    def __sub__(self, other: Totals) -> Totals:
        return Totals(
            self.total_distance - other.total_distance,
            self.ride_count - other.ride_count,
            (self.checksum - other.checksum) % CHECKSUM_MOD,
        )


def canonical_totals(conn: Any) -> Totals:
    """Totals recomputed from the ``rides`` table (a psycopg connection)."""
    row = conn.execute(CANONICAL_SQL).fetchone()
    return Totals(Decimal(row[0]), int(row[1]), int(row[2]))


def consumer_totals(conn: Any) -> dict[str, Totals]:
    """Every consumer's state, by name."""
    rows = conn.execute("SELECT name, total_distance, ride_count, checksum FROM consumer_states ORDER BY name")
    return {r[0]: Totals(Decimal(r[1]), int(r[2]), int(r[3])) for r in rows}
