"""RideCreated v3 brings fare back as text with a default: compatible with v2 (no fare), a break against v1's
integer fare (what a transitive mode sees)."""

from __future__ import annotations

from pydantic import BaseModel

from unilog.contracts import record_type


@record_type(stream="rides", object="ride", action="created", version=3)
class RideCreated(BaseModel):
    ride_id: str
    fare: str = ""
