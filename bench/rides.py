"""The typed workloads' record: ``BenchRide`` (six fields of the kinds a business record has) and its values.

Shared by ``bench/typed.py`` (emit, consume, drain) and ``bench/codecs.py`` (the codecs' microseconds), so neither
imports the other.
"""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

from pydantic import BaseModel

from unilog.contracts import record_type

EPOCH = dt.datetime(2026, 11, 27, 10, 0, tzinfo=dt.UTC)


@record_type(object="ride", action="created", version=1, name="BenchRide", key="ride_id")
class BenchRide(BaseModel):
    """Six fields of the kinds a business record has (the default stream, as the untyped records)."""

    ride_id: uuid.UUID
    rider: str
    fare: Decimal
    requested_at: dt.datetime
    passengers: int
    city: str


def ride_fields(i: int) -> dict[str, Any]:
    """Record ``i``'s values (Python objects: a dict emit encodes by unilog's rules, or the model's fields)."""
    return {
        "ride_id": uuid.UUID(int=(i * 0x9E3779B97F4A7C15) % (1 << 128)),
        "rider": f"r-{i % 10000:04d}",
        "fare": Decimal(f"{(i % 10000) / 100 + 2.5:.2f}"),
        "requested_at": EPOCH + dt.timedelta(seconds=i),
        "passengers": 1 + i % 4,
        "city": f"city-{i % 50:02d}",
    }


def ride(i: int) -> BenchRide:
    return BenchRide(**ride_fields(i))
