"""The dashboard's routes: the page, the status with the lag history, each stream's record types, and dead letters
(show, replay, drop)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
import structlog

from ... import engine, health, store
from ...config import Settings, validate_stream_name
from ...errors import ConfigurationError, ServerUnreachable, UnilogError
from .. import dlq
from .history import History
from .page import PAGE

log = structlog.get_logger(__name__)


def register(app: Any, settings: Settings, history: History, *, read_only: bool, token: str) -> None:
    """Add the routes to ``app``. Mutations need ``X-Unilog-Token: token`` and are refused when ``read_only``."""
    from flask import Response, abort, jsonify, request

    @contextlib.contextmanager
    def redis() -> Iterator[engine.RedisStreams]:
        client = engine.connect(settings.redis_url)
        engine.ping(client, settings.redis_url)
        api = engine.RedisStreams(client)
        try:
            yield api
        finally:
            api.close()

    def guard() -> None:
        if read_only:
            abort(403, "this dashboard is read-only")
        if not secrets_equal(request.headers.get("X-Unilog-Token", ""), token):
            abort(403, "missing or wrong token: reload the page")

    @app.get("/")
    def page() -> Any:
        body = PAGE.replace("{{TOKEN}}", token).replace("{{READ_ONLY}}", "true" if read_only else "false")
        return Response(body, mimetype="text/html", headers={"Cache-Control": "no-store"})

    register_types(app, settings)

    @app.get("/api/status")
    def status() -> Any:
        return jsonify(history.snapshot())

    @app.get("/api/dlq/<stream>")
    def letters(stream: str) -> Any:
        _valid_stream(stream, abort)
        with redis() as api:
            return jsonify([d.summary() for d in dlq.list_letters(api, stream)])

    @app.get("/api/dlq/<stream>/<letter_id>")
    def show(stream: str, letter_id: str) -> Any:
        with redis() as api:
            letter = _letter(api, stream, letter_id, abort)
            return jsonify({**letter.summary(), "at_ms": letter.at_ms, "fields": letter.fields})

    @app.post("/api/dlq/<stream>/<letter_id>/<action>")
    def act(stream: str, letter_id: str, action: str) -> Any:
        guard()
        if action not in ("replay", "drop"):
            abort(404)
        with redis() as api:
            letter = _letter(api, stream, letter_id, abort)
            result = _apply(settings, api, stream, letter, action)
        log.info(
            f"dead letter {action}ed from the dashboard",
            stream=stream,
            letter=letter_id,
            result=result,
            client=request.remote_addr,
        )
        history.sample()
        return jsonify({"ok": True, "action": action, "result": result})


def register_probes(app: Any) -> None:
    """Add ``/healthz`` and ``/readyz`` (:mod:`unilog.health`: ready while the last sample read both servers), and
    answer a request that a server failed under (restarting, failing over) with 503 and its one line, not a
    traceback."""
    from flask import Response, jsonify, request

    @app.get("/healthz")
    @app.get("/readyz")
    def probe() -> Any:
        code, body = health.respond(request.path) or (404, b"")
        return Response(body, status=code, mimetype="application/json")

    @app.errorhandler(engine.RedisError)
    @app.errorhandler(psycopg.OperationalError)
    @app.errorhandler(ServerUnreachable)
    def unavailable(exc: Exception) -> Any:
        error = " ".join(str(exc).split()) or type(exc).__name__
        log.warning("request failed: a server cannot be reached", path=request.path, error=error)
        return jsonify({"error": error}), 503


def register_types(app: Any, settings: Settings) -> None:
    """Add ``/api/types``: :func:`record_types`, or why they cannot be read (503)."""
    from flask import jsonify

    @app.get("/api/types")
    def types() -> Any:
        try:
            return jsonify({"types": record_types(settings), "error": None})
        except UnilogError as exc:
            return jsonify({"types": {}, "error": str(exc)}), 503


def record_types(settings: Settings) -> dict[str, list[dict[str, Any]]]:
    """Each stream's registered record types (``unilog_schemas``), a row per version by name and version: the
    default stream's under its name."""
    from ...store import schemas

    with store.connect(settings.conninfo, autocommit=True, application_name="unilog-dashboard") as conn:
        store.check_schema(conn)
        rows = schemas.registered(conn)
    found: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        found.setdefault(r.stream or settings.stream, []).append(
            {
                "name": r.name,
                "version": r.version,
                "object": r.object,
                "action": r.action,
                "fingerprint": r.fingerprint,
                "retired": r.retired_at is not None,
            }
        )
    return dict(sorted(found.items()))


def _letter(api: engine.RedisStreams, stream: str, letter_id: str, abort: Any) -> dlq.DeadLetter:
    _valid_stream(stream, abort)
    try:
        return dlq.get_letter(api, stream, letter_id)
    except (ConfigurationError, engine.RedisError):
        abort(404, f"no dead letter {letter_id} on {stream}")
        raise  # unreachable: abort raises


def _valid_stream(stream: str, abort: Any) -> None:
    """A stream name from the URL must be one: nothing else may reach a Redis key."""
    try:
        validate_stream_name(stream)
    except ValueError:
        abort(404, "no such stream")


def _apply(settings: Settings, api: engine.RedisStreams, stream: str, letter: dlq.DeadLetter, action: str) -> str:
    if action == "replay":
        return dlq.replay(api, stream, letter)
    try:
        with store.connect(settings.conninfo, application_name="unilog-dashboard") as conn:
            dlq.drop(api, conn, stream, letter)
    except UnilogError as exc:
        raise ConfigurationError(str(exc)) from None
    return "dropped"


def secrets_equal(given: str, expected: str) -> bool:
    import hmac

    return hmac.compare_digest(given.encode(), expected.encode())
