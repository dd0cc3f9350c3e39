"""RideCreated v1: the registered baseline."""

from __future__ import annotations

from pydantic import BaseModel

from unilog.contracts import record_type


@record_type(stream="rides", object="ride", action="created", version=1)
class RideCreated(BaseModel):
    ride_id: str
    fare: int
