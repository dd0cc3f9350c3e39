"""Operator actions on a whole deployment, given its :class:`~unilog.config.Settings`: what a deploy step, a
runbook or a test harness does before and around the long-running processes.

Each function opens its own connections and closes them; none is on a hot path.
"""

from __future__ import annotations

from collections.abc import Iterable

from . import dlq, engine
from .config import Settings
from .consume.records import load_handler, load_object

__all__ = ["dead_letters", "declare", "enable_wal_capture", "load_handler", "load_object"]


def _api(settings: Settings) -> engine.RedisStreams:
    client = engine.connect(settings.redis_url)
    engine.ping(client, settings.redis_url)
    return engine.RedisStreams(client)


def declare(settings: Settings, stream: str, *, consumers: Iterable[str] = (), groups: Iterable[str] = ()) -> None:
    """Declare consumers before traffic starts: register each checkpoint consumer at the stream's beginning (unless
    it already holds a place), so retention never trims what it has not read even if it first runs later, and create
    each consumer group at the beginning. Idempotent."""
    api = _api(settings)
    try:
        registered = api.registered(stream)
        for name in consumers:
            if name not in registered:
                api.register(stream, name, "0-0")
        for group in groups:
            api.ensure_group(stream, group)
    finally:
        api.close()


def dead_letters(settings: Settings, stream: str, group: str | None = None) -> list[dlq.DeadLetter]:
    """Every dead letter of ``stream`` (of ``group`` only, if given), oldest first."""
    api = _api(settings)
    try:
        return dlq.list_letters(api, stream, group)
    finally:
        api.close()


def enable_wal_capture(settings: Settings) -> None:
    """Switch the database to WAL capture mode, as ``unilog capture wal`` does (see :func:`unilog.stream.capture.
    enable_wal`): no streamer may run meanwhile."""
    from .stream.capture import enable_wal

    enable_wal(settings)
