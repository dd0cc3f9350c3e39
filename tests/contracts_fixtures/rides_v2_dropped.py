"""RideCreated v2 drops the required field fare: backward compatible, a forward break."""

from __future__ import annotations

from pydantic import BaseModel

from unilog.contracts import record_type


@record_type(stream="rides", object="ride", action="created", version=2)
class RideCreated(BaseModel):
    ride_id: str
