"""RideCreated v2 with two backward-breaking changes: fare int -> text, and city added required without a default."""

from __future__ import annotations

from pydantic import BaseModel

from unilog.contracts import record_type


@record_type(stream="rides", object="ride", action="created", version=2)
class RideCreated(BaseModel):
    ride_id: str
    fare: str
    city: str
