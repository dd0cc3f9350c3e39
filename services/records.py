"""The demo's record types: what Rocket Rides writes to its log, declared once for its producers and consumers.

``emit(session, RideCreated(...))`` validates the record in the producer's transaction (a bad one is refused before
anything commits) and writes the distance as an exact decimal string; consumers read it back with
``record.typed(RideCreated)``. ``python -m services.migrate`` registers these types in the schema registry
(``unilog schema register services.records``), so ``unilog asyncapi`` documents them.
"""

from __future__ import annotations

from decimal import Decimal

from pydantic import BaseModel, Field

from unilog.contracts import record_type

from .rides import STREAM


@record_type(stream=STREAM, object="ride", action="create", version=1)
class RideCreated(BaseModel):
    """A ride was created: a row inserted into the rides table, its record staged in the same transaction."""

    id: int = Field(description="the ride's id in the rides table")
    distance: Decimal = Field(
        ge=0, max_digits=14, decimal_places=3, description="kilometres, to the metre, exact (rides.distance)"
    )
    cid: str | None = Field(
        default=None, description="the chaos harness's id of the record (set by its direct producers), else null"
    )
