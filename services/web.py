"""What both Rocket Rides APIs share (Flask in ``api.py``, FastAPI in ``api_fastapi.py``): the distance's validation,
the answer while the database is down, and the request's server span.

Input is validated before anything is written: a missing, non-numeric, negative, NaN or infinite ``distance`` gets a
422 with a JSON error naming the field. While Postgres cannot be reached (down, restarting, the network cut), every
route answers 503 with ``Retry-After`` and a JSON error instead of a 500: a client (or a load balancer) retries
later, and the pool's pre-ping replaces the dead connections once the database is back.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from unilog import tracing

MAX_ATTEMPTS = 10  # of a SERIALIZABLE transaction that fails to serialize
MAX_DISTANCE = Decimal("100000000")  # fits NUMERIC(14, 3)
RETRY_AFTER_SECONDS = 5  # about what a Postgres restart or a failover takes
UNAVAILABLE_MESSAGE = "the database is unavailable; retry later"
# SQLSTATEs of a server that went or is going away: connection exceptions (class 08), admin and crash shutdown, and
# "the database system is starting up / shutting down"
_GONE_STATES = ("57P01", "57P02", "57P03")


class ValidationError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def parse_distance(payload: dict[str, Any]) -> Decimal:
    """The ride's distance, rounded to metres; raises :class:`ValidationError` naming the field."""
    raw = payload.get("distance")
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        raise ValidationError("distance", "distance is required")
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise ValidationError("distance", f"distance must be a number, got {type(raw).__name__}")
    try:
        value = float(raw)
    except ValueError:
        raise ValidationError("distance", f"distance must be a number, got {raw!r}") from None
    if not math.isfinite(value):
        raise ValidationError("distance", f"distance must be finite, got {raw!r}")
    if value < 0:
        raise ValidationError("distance", f"distance must not be negative, got {raw!r}")
    try:
        distance = Decimal(str(raw).strip() if isinstance(raw, str) else repr(value)).quantize(Decimal("0.001"))
    except InvalidOperation:
        raise ValidationError("distance", f"distance must be a number, got {raw!r}") from None
    if distance >= MAX_DISTANCE:
        raise ValidationError("distance", f"distance must be below {MAX_DISTANCE}, got {raw!r}")
    return distance


def database_unavailable(exc: BaseException) -> bool:
    """Whether a SQLAlchemy error means the database cannot be reached right now (answer 503, not 500).

    True for a connection the driver lost or could not open (no SQLSTATE: refused, reset, timed out), a connection
    exception (class 08), a server shutting down or starting up (57P01-57P03), and the pool's own timeout (every
    connection busy or being opened). A query's error (a constraint, a syntax error) is not one of these."""
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    if isinstance(exc, PoolTimeout):
        return True
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    import psycopg

    orig = exc.orig
    if not isinstance(orig, psycopg.OperationalError | psycopg.InterfaceError):
        return False
    state = getattr(orig, "sqlstate", None)
    return state is None or state.startswith("08") or state in _GONE_STATES


def serialization_failure(exc: Exception) -> bool:
    """Whether a SQLAlchemy ``DBAPIError`` is Postgres's serialization failure (retry the transaction)."""
    return getattr(getattr(exc, "orig", None), "sqlstate", None) == "40001"


def request_span(name: str, headers: Mapping[str, str], method: str, route: str) -> Any:
    """A SERVER span for the request, continuing the caller's W3C trace context; nothing without OpenTelemetry.

    The record staged in the request's transaction carries this span's context (``emit`` and ``emit_async`` read
    it), so a trace follows a ride from the request to the consumers that apply it."""
    if not tracing.ENABLED:
        return contextlib.nullcontext()
    from opentelemetry import propagate, trace

    return trace.get_tracer("rocket-rides").start_as_current_span(
        name,
        context=propagate.extract(headers),
        kind=trace.SpanKind.SERVER,
        attributes={"http.request.method": method, "http.route": route},
    )
