"""Operator actions on a whole deployment, given its :class:`~unilog.config.Settings`: what a deploy step, a
runbook or a test harness does before and around the long-running processes.

Each function opens its own connections and closes them; none is on a hot path.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .. import engine, store
from ..config import Settings
from ..consume.records import load_handler, load_object
from ..errors import ConfigurationError, ConsumerRunning
from . import dlq

__all__ = [
    "Deleted",
    "dead_letters",
    "declare",
    "delete_consumer",
    "delete_group",
    "enable_wal_capture",
    "load_handler",
    "load_object",
]


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
    """Switch the database to WAL capture mode, as ``unilog capture wal`` does (see :func:`unilog.stream.modes.
    enable_wal`): no streamer may run meanwhile."""
    from ..stream.modes import enable_wal

    enable_wal(settings)


@dataclass(frozen=True)
class Deleted:
    """What :func:`delete_consumer` or :func:`delete_group` removed: ``position`` is the checkpoint's last id, or
    the group's last delivered id (None if it had none); ``applied`` the held records of a consumer, or the rows of
    processed identities and watermarks of a group; ``registered`` whether a registration (or the Redis group)
    went; ``letters`` the dead letters deleted."""

    kind: str
    name: str
    stream: str
    position: str | None
    applied: int
    registered: bool
    letters: int


def delete_consumer(settings: Settings, name: str, stream: str | None = None) -> Deleted:
    """Delete checkpoint consumer ``name``: its checkpoint and held records (Postgres), then its registration and
    its dead letters on its stream (Redis). ``stream`` defaults to the checkpoint's, else ``settings.stream``.

    Refused with :class:`~unilog.errors.ConsumerRunning` while a process of it is connected (its
    ``unilog-consumer-NAME`` or ``unilog-spark-NAME`` Postgres session shows it), and with
    :class:`~unilog.errors.ConfigurationError` if there is nothing of that name. Run again, it finishes a delete
    that was interrupted. The consumer's own state (its tables) is the application's: it stays."""
    api = _api(settings)
    try:
        with store.connect(settings.conninfo) as conn:
            store.check_schema(conn)
            sessions = store.sessions_of(conn, [f"unilog-consumer-{name}", f"unilog-spark-{name}"], [])
            _refuse_running(f"consumer {name!r}", sessions)
            with conn.transaction():
                checkpoint, held = store.delete_checkpoint(conn, name)
        on = stream or (checkpoint.stream if checkpoint else settings.stream)
        registered = api.unregister(on, name)
        letters = [d.id for d in dlq.list_letters(api, on, consumer=name)]
        if checkpoint is None and not registered and not letters:
            raise ConfigurationError(f"no consumer {name!r} on {on!r}: no checkpoint, registration or dead letters")
        api.delete_dead_letters(on, letters)
        position = checkpoint.last_id if checkpoint else None
        return Deleted("consumer", name, on, position, held, registered, len(letters))
    finally:
        api.close()


def delete_group(settings: Settings, group: str, stream: str | None = None) -> Deleted:
    """Delete consumer group ``group`` of ``stream`` (default ``settings.stream``): what it applied (Postgres), then
    the Redis group with its pending entries and attempt counts, and its dead letters.

    Refused with :class:`~unilog.errors.ConsumerRunning` while one of its workers is connected (a
    ``unilog-group-GROUP-WORKER`` Postgres session), and with :class:`~unilog.errors.ConfigurationError` if there
    is nothing of that name. Run again, it finishes a delete that was interrupted."""
    on = stream or settings.stream
    api = _api(settings)
    try:
        groups = {str(g.get("name")): g for g in api.groups(on)}
        with store.connect(settings.conninfo) as conn:
            store.check_schema(conn)
            sessions = store.sessions_of(conn, [], [_worker_prefix(group)])
            # group a-b's workers' names start like group a's: theirs are not this group's
            longer = [_worker_prefix(g) for g in groups if g.startswith(group + "-")]
            _refuse_running(f"group {group!r}", [s for s in sessions if not s[1].startswith(tuple(longer))])
            with conn.transaction():
                applied = store.delete_group_state(conn, group, on)
        destroyed = api.destroy_group(on, group)
        letters = [d.id for d in dlq.list_letters(api, on, group=group)]
        if group not in groups and not destroyed and not applied and not letters:
            raise ConfigurationError(f"no group {group!r} on {on!r}: no Redis group, applied records or dead letters")
        api.delete_dead_letters(on, letters)
        position = str(groups[group]["last-delivered-id"]) if group in groups else None
        return Deleted("group", group, on, position, applied, destroyed, len(letters))
    finally:
        api.close()


def _worker_prefix(group: str) -> str:
    """How the Postgres sessions of ``group``'s workers are named (``unilog-group-GROUP-WORKER``), as far as
    Postgres keeps a name (63 bytes)."""
    return f"unilog-group-{group}-"[:63]


def _refuse_running(what: str, sessions: list[tuple[int, str]]) -> None:
    if sessions:
        shown = ", ".join(f"pid {pid} ({app})" for pid, app in sessions[:3])
        raise ConsumerRunning(f"{what} is running ({shown}): stop it first, then delete it")
