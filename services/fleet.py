"""Rocket Rides as the harness runs it: the demo's processes, tables and totals in one description.

``unilog demo`` and ``unilog chaos`` (see ``commands.py``) hand :data:`APP` to the harness's runners, and the
chaos fleet's processes find it here (``<package>.fleet:APP``); the harness itself knows nothing about rides.
"""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import unilog
from unilog.harness.app import App

from .migrate import prepare
from .rides import STREAM, canonical_totals, consumer_totals


def stage_ride(conn: Any, cid: str, rng: random.Random, stream: str) -> int:
    """Insert a ride of a random distance and stage its typed record (carrying ``cid``) in the caller's transaction,
    as a direct library producer would; return the ride's id. ``stream`` is the app's, which ``RideCreated`` binds."""
    from .records import RideCreated  # here: `unilog demo` reads APP to check for pydantic before it is imported

    if stream != STREAM:
        raise ValueError(f"RideCreated records go to {STREAM!r}, not {stream!r}")
    distance = Decimal(repr(round(rng.uniform(0.1, 1000.0), 3))).quantize(Decimal("0.001"))
    row = conn.execute("INSERT INTO rides (distance) VALUES (%s) RETURNING id", (distance,)).fetchone()
    unilog.emit(conn, RideCreated(id=row[0], distance=distance, cid=cid), key=f"ride-{row[0]}")
    return int(row[0])


APP = App(
    name="Rocket Rides",
    package=__package__ or "services",  # `services` from the repository, `unilog_demo` from an installed wheel
    stream=STREAM,
    prepare=prepare,
    canonical_totals=canonical_totals,
    consumer_totals=consumer_totals,
    stage=stage_ride,
    source_table="rides",
    source_object="ride",
    state_tables=("consumer_states",),
    asgi_api="api_fastapi:app",
    # the demo extra's packages each API imports (pyproject.toml): greenlet is SQLAlchemy's asyncio layer's,
    # pydantic the record types' (unilog-outbox[contracts])
    api_requires=("flask", "pydantic"),
    asgi_requires=("fastapi", "greenlet", "pydantic"),
)
