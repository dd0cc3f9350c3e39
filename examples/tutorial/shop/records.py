"""The shop's record types: what its log says, declared once for the API that writes it and the consumers."""

from __future__ import annotations

from pydantic import BaseModel, Field

from unilog.contracts import record_type


@record_type(object="order", action="create", version=1)
class OrderCreated(BaseModel):
    """An order was placed."""

    id: int
    product: str = Field(min_length=1, max_length=100)
    quantity: int = Field(gt=0)
