"""The record types the docs site's AsyncAPI page (reference/asyncapi.md) is generated from, by docs/gen_asyncapi.py:
a small Rocket Rides log, until the demo (services/) declares its own typed records."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, Field

from unilog.contracts import record_type, upcaster


class Place(BaseModel):
    """A point on the map."""

    lat: float = Field(description="latitude, degrees")
    lon: float = Field(description="longitude, degrees")


@record_type(stream="rides", object="ride", action="requested", version=1, name="RideRequested", key="ride_id")
class RideRequestedV1(BaseModel):
    ride_id: UUID
    rider: str
    pickup: Place


@record_type(stream="rides", object="ride", action="requested", version=2, key="ride_id")
class RideRequested(BaseModel):
    """A rider asked for a ride; v2 adds the drop-off and the quoted fare."""

    ride_id: UUID
    rider: str
    pickup: Place
    dropoff: Place | None = None
    quote: Decimal = Field(description="the quoted fare in euros, exact")


@upcaster(RideRequested, from_version=1)
def _quote(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "quote": "0"}


class Card(BaseModel):
    kind: Literal["card"] = "card"
    last4: str


class Cash(BaseModel):
    kind: Literal["cash"] = "cash"


@record_type(stream="rides", object="ride", action="completed", version=1, key="ride_id")
class RideCompleted(BaseModel):
    """A ride ended and was paid."""

    ride_id: UUID
    fare: Decimal
    paid_with: Card | Cash = Field(discriminator="kind")
    at: datetime
