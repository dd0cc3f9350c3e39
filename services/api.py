"""The Rocket Rides API: ``POST /rides`` creates a ride and stages its log record in one transaction.

Flask, because it is the most widely known Python web framework and it is synchronous, like unilog's producer
call: the request's SQLAlchemy session *is* the transaction the record is staged in, with no async driver or
thread hand-off in between. It runs under gunicorn in the fleet (``flask --app services.api run`` for development).

The transaction is SERIALIZABLE, as in the reference design, and serialization failures are retried. Input is
validated before anything is written (``web.parse_distance``). ``api_fastapi.py`` is the same API on asyncio.
"""

from __future__ import annotations

import os
import time
from decimal import Decimal
from typing import Any

import structlog
from flask import Flask, jsonify, request
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

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

__all__ = ["ValidationError", "create_app", "create_ride", "parse_distance"]

log = structlog.get_logger(__name__)


def create_ride(sessions: sessionmaker[Session], distance: Decimal) -> Ride:
    """Insert the ride and stage its record in one SERIALIZABLE transaction, retrying serialization failures."""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            with sessions.begin() as session:
                ride = Ride(distance=distance)
                session.add(ride)
                session.flush()
                unilog.emit(session, RideCreated(id=ride.id, distance=distance), key=f"ride-{ride.id}")
                session.expunge(ride)
                return ride
        except DBAPIError as exc:
            if not serialization_failure(exc) or attempt == MAX_ATTEMPTS:
                raise
            log.info("serialization failure; retrying", attempt=attempt)
            time.sleep(0.001 * 2**attempt)
    raise AssertionError("unreachable")


def create_app(database_url: str | None = None) -> Flask:
    """The WSGI app; ``database_url`` defaults to ``$DATABASE_URL`` (read here, at the entry point)."""
    url = database_url or os.environ.get("DATABASE_URL", "")
    engine = create_engine(sqlalchemy_url(url), isolation_level="SERIALIZABLE", pool_pre_ping=True, pool_size=10)
    sessions = sessionmaker(engine, expire_on_commit=False)
    app = Flask("rocket-rides")

    @app.post("/rides")
    def post_ride() -> Any:
        with _request_span("POST /rides"):
            return _post_ride(sessions)

    @app.get("/health")
    def health() -> Any:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return jsonify(status="ok")

    app.register_error_handler(DBAPIError, _unavailable)
    app.register_error_handler(PoolTimeout, _unavailable)
    return app


def _unavailable(exc: Exception) -> Any:
    """503 with ``Retry-After`` while the database cannot be reached; any other database error stays a 500."""
    if not database_unavailable(exc):
        raise exc
    log.warning("database unavailable: answered 503", path=request.path, error=str(exc).splitlines()[0])
    response = jsonify(error={"message": UNAVAILABLE_MESSAGE})
    return response, 503, {"Retry-After": str(RETRY_AFTER_SECONDS)}


def _post_ride(sessions: sessionmaker[Session]) -> Any:
    """Validate the body, create the ride and stage its record; the response."""
    payload = request.get_json(silent=True) if request.is_json else request.form.to_dict()
    if not isinstance(payload, dict):
        return jsonify(error={"field": "body", "message": "body must be a JSON object or a form"}), 422
    try:
        distance = parse_distance(payload)
    except ValidationError as exc:
        return jsonify(error={"field": exc.field, "message": str(exc)}), 422
    ride = create_ride(sessions, distance)
    return jsonify(ride={"id": ride.id, "distance": float(ride.distance)}), 201


def _request_span(name: str) -> Any:
    return request_span(name, request.headers, request.method, request.path)  # type: ignore[arg-type]


def __getattr__(name: str) -> Any:
    # `gunicorn services.api:app` builds the app lazily, so importing this module needs no DATABASE_URL
    if name == "app":
        configure_logging()
        return create_app()
    raise AttributeError(name)
