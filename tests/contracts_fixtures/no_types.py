"""A module that declares no record type."""

from __future__ import annotations

from pydantic import BaseModel


class NotARecord(BaseModel):
    value: int
