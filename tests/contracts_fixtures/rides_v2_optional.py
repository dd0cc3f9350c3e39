"""RideCreated v2 adds an optional field (compatible both ways), beside a new type RideEnded v1."""

from __future__ import annotations

from pydantic import BaseModel

from unilog.contracts import record_type


@record_type(stream="rides", object="ride", action="created", version=2)
class RideCreated(BaseModel):
    ride_id: str
    fare: int
    note: str | None = None


@record_type(stream="rides", object="ride", action="ended", version=1)
class RideEnded(BaseModel):
    ride_id: str
