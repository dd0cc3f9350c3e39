"""Record types the typed-record tests emit and read (tests/test_typed_records.py): three versions of one type, as
three services deployed at different times would declare them (names prefixed ``Typed``: one process runs the
whole suite, and a name and version is declared once per process), a dataclass type, and one type on a partitioned
stream. Importable by module name (the CLI and the backfill load ``tests.typed_records:RideCreated``)."""

from __future__ import annotations

import dataclasses
import uuid
from decimal import Decimal

from pydantic import BaseModel

from unilog.contracts import record_type, upcaster

STREAM = "typed-rides"


@record_type(stream=STREAM, object="ride", action="created", version=1, name="TypedRide", key="ride_id")
class RideCreatedV1(BaseModel):
    """A ride was requested (v1: the rider's name was called ``name``)."""

    ride_id: uuid.UUID
    name: str
    fare: Decimal


@record_type(stream=STREAM, object="ride", action="created", version=2, name="TypedRide", key="ride_id")
class RideCreated(BaseModel):
    """A ride was requested (v2: ``name`` renamed ``rider``; ``city`` added, with a default)."""

    ride_id: uuid.UUID
    rider: str
    fare: Decimal
    city: str = "unknown"


@upcaster(RideCreated, from_version=1)
def _rename_name_to_rider(data: dict) -> dict:  # type: ignore[type-arg]
    data = dict(data)
    data["rider"] = data.pop("name")
    return data


@record_type(stream=STREAM, object="ride", action="created", version=3, name="TypedRide", key="ride_id")
class RideCreatedV3(BaseModel):
    """What a producer deployed before its consumers writes (v3: ``surge`` added, required)."""

    ride_id: uuid.UUID
    rider: str
    fare: Decimal
    city: str
    surge: Decimal


@record_type(stream=STREAM, object="ride", action="finished", version=1, name="TypedRideFinished")
@dataclasses.dataclass(frozen=True)
class RideFinished:
    """A ride ended (a dataclass type)."""

    ride_id: uuid.UUID
    distance_km: Decimal


@record_type(stream="typed-parts", object="charge", action="captured", version=1, name="TypedCharge", key="account")
class ChargeCaptured(BaseModel):
    """A charge on a partitioned stream, keyed by account."""

    account: str
    amount: Decimal
