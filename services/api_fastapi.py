"""The Rocket Rides API on asyncio: FastAPI, SQLAlchemy's ``AsyncSession``, served by uvicorn.

The same API as the Flask one in ``api.py`` (``POST /rides`` JSON or form, the same 422 errors, ``GET /health``),
built the way an asyncio team would: the request's ``AsyncSession`` transaction inserts the ride and stages its
record with ``await unilog.emit_async(session, ...)``, SERIALIZABLE, retrying serialization failures. Run it with
``uvicorn services.api_fastapi:app``; ``unilog demo --api fastapi`` and ``unilog chaos --api fastapi`` run the fleet
with it.
"""

from __future__ import annotations

import asyncio
import json
import os
from decimal import Decimal
from typing import Any
from urllib.parse import parse_qsl

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

import unilog
from unilog.config import sqlalchemy_url
from unilog.log import configure_logging

from .records import RideCreated
from .rides import Ride
from .web import (
    MAX_ATTEMPTS,
    RETRY_AFTER_SECONDS,
    UNAVAILABLE_MESSAGE,
    ValidationError,
    database_unavailable,
    parse_distance,
    request_span,
    serialization_failure,
)

log = structlog.get_logger(__name__)


async def create_ride(sessions: async_sessionmaker[AsyncSession], distance: Decimal) -> Ride:
    """Insert the ride and stage its record in one SERIALIZABLE transaction, retrying serialization failures."""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            async with sessions.begin() as session:
                ride = Ride(distance=distance)
                session.add(ride)
                await session.flush()
                await unilog.emit_async(session, RideCreated(id=ride.id, distance=distance), key=f"ride-{ride.id}")
                session.expunge(ride)
                return ride
        except DBAPIError as exc:
            if not serialization_failure(exc) or attempt == MAX_ATTEMPTS:
                raise
            log.info("serialization failure; retrying", attempt=attempt)
            await asyncio.sleep(0.001 * 2**attempt)
    raise AssertionError("unreachable")


async def _payload(request: Request) -> Any:
    """The body as a dict: JSON, or an urlencoded form; anything else is returned as is (and refused)."""
    body = await request.body()
    if request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return dict(parse_qsl(body.decode(errors="replace"), keep_blank_values=True))
    try:
        return json.loads(body)
    except ValueError:
        return None


def create_app(database_url: str | None = None) -> FastAPI:
    """The ASGI app; ``database_url`` defaults to ``$DATABASE_URL`` (read here, at the entry point)."""
    url = database_url or os.environ.get("DATABASE_URL", "")
    engine = create_async_engine(sqlalchemy_url(url), isolation_level="SERIALIZABLE", pool_pre_ping=True, pool_size=10)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    app = FastAPI(title="Rocket Rides")

    @app.post("/rides")
    async def post_ride(request: Request) -> JSONResponse:
        with request_span("POST /rides", request.headers, request.method, request.url.path):
            payload = await _payload(request)
            if not isinstance(payload, dict):
                error = {"field": "body", "message": "body must be a JSON object or a form"}
                return JSONResponse({"error": error}, status_code=422)
            try:
                distance = parse_distance(payload)
            except ValidationError as exc:
                return JSONResponse({"error": {"field": exc.field, "message": str(exc)}}, status_code=422)
            ride = await create_ride(sessions, distance)
            return JSONResponse({"ride": {"id": ride.id, "distance": float(ride.distance)}}, status_code=201)

    @app.get("/health")
    async def health() -> dict[str, str]:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
        return {"status": "ok"}

    app.add_exception_handler(DBAPIError, _unavailable)
    app.add_exception_handler(PoolTimeout, _unavailable)
    return app


async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    """503 with ``Retry-After`` while the database cannot be reached; any other database error stays a 500."""
    if not database_unavailable(exc):
        raise exc
    log.warning("database unavailable: answered 503", path=request.url.path, error=str(exc).splitlines()[0])
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    return JSONResponse({"error": {"message": UNAVAILABLE_MESSAGE}}, status_code=503, headers=headers)


def __getattr__(name: str) -> Any:
    # `uvicorn services.api_fastapi:app` builds the app lazily, so importing this module needs no DATABASE_URL
    if name == "app":
        configure_logging()
        return create_app()
    raise AttributeError(name)
