"""RideCreated v2 adds city, required without a default, with an upcaster from v1: backward through the upcaster."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from unilog.contracts import record_type, upcaster


@record_type(stream="rides", object="ride", action="created", version=2)
class RideCreated(BaseModel):
    ride_id: str
    fare: int
    city: str


@upcaster(RideCreated, from_version=1)
def _from_v1(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "city": "unknown"}
