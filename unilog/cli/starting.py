"""Before ``unilog consume`` starts a worker: refuse options that contradict each other, place a new consumer or
group where ``--from`` says, and say in one log line (a warning) how much of the retained stream a new one will
replay.

A mistyped name (or handler reference) used to start a new consumer silently, which replayed the whole retained
stream into shared state; the line below makes that visible before anything is applied, and ``--from end`` lets a
consumer that should see only what comes next start there.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import structlog

from .. import engine, store
from ..config import Settings
from ..errors import InvalidUsage
from ..routing import partition_stream
from .common import redis_api

log = structlog.get_logger("unilog.consumer")

CHILD = "UNILOG_CONSUME_CHILD"  # set for the processes of --workers N: the parent already prepared the start
_STARTS = ("start", "end")
Announcement = tuple[str, dict[str, Any]]  # a log line: its event and fields


def several(args: argparse.Namespace) -> bool:
    """Whether the command line asks for a consumer over several streams (``--streams``, ``--stream-prefix``)."""
    return bool(getattr(args, "streams", None)) or getattr(args, "stream_prefix", None) is not None


def check_options(args: argparse.Namespace) -> None:
    """Refuse, in one line, options that contradict each other or that the kind of consumer they pick ignores."""
    group, partitioned, name = args.group, args.partitioned, args.name
    if partitioned and group:
        raise InvalidUsage(
            "--partitioned and --group contradict each other: run a partitioned consumer (--name NAME --partitioned) "
            "or a group worker (--group GROUP)"
        )
    if name and group:
        raise InvalidUsage(
            f"--name {name} and --group {group} contradict each other: --name names a checkpoint or partitioned "
            "consumer, --group a group; give one"
        )
    if not (group or partitioned):
        if args.worker:
            raise InvalidUsage("--worker names a worker of a group or a partitioned consumer, not of --name alone")
        if args.workers > 1:
            raise InvalidUsage(
                "--workers runs workers of a group (--group) or a partitioned consumer (--partitioned); copies of one "
                "checkpoint consumer would only take turns"
            )
    start = args.start_from
    if start is not None:
        if several(args):
            raise InvalidUsage(
                "--from applies to a consumer of one stream: a consumer over several streams (--streams, "
                "--stream-prefix) starts each stream it has no checkpoint on at the stream's start"
            )
        if partitioned:
            raise InvalidUsage("--from applies to a checkpoint consumer or a group, not to a partitioned consumer")
        if start not in _STARTS and not _is_id(start):
            raise InvalidUsage(f"--from must be start, end or a stream entry id like 1700000000000-0, not {start!r}")


def prepare_start(args: argparse.Namespace, settings: Settings) -> None:
    """For a new consumer or group: start it where ``--from`` says and log (a warning) how many retained entries it
    will replay; for an existing one, refuse ``--from``. Nothing is done in a process that ``--workers`` started.

    A long-running consumer waits here for a server that cannot be reached, is restarting or failing over
    (:func:`unilog.runtime.waiting.wait_for_servers`: one line per retry); ``--once`` stops at once (exit code 4)."""
    if os.environ.get(CHILD) or not (args.group or args.name) or several(args):
        return  # a missing --name is refused, in one line, where the worker is made; several streams: --from is refused
    if args.once:
        _prepare(args, settings)
        return
    from ..runtime.waiting import wait_for_servers

    name = f"start {args.group or args.name}"
    wait_for_servers(lambda: _prepare(args, settings), name=name, consumer=args.group or args.name)


def _prepare(args: argparse.Namespace, settings: Settings) -> None:
    stream = args.stream or settings.stream
    api = redis_api(settings)
    try:
        with api.explained(stream):  # a key of another type at the stream's name: the line says so
            if args.group:
                line = _prepare_group(api, args.group, stream, args.start_from)
            elif args.partitioned:
                line = _prepare_partitioned(api, settings, args.name, stream)
            else:
                line = _prepare_checkpoint(api, settings, args.name, stream, args.start_from)
    finally:
        api.close()
    if line is not None:
        event, fields = line
        log.warning(event, **fields)


def _prepare_checkpoint(
    api: engine.RedisStreams, settings: Settings, name: str, stream: str, start: str | None
) -> Announcement | None:
    from ..consume.resets import reset_checkpoint

    with store.connect(settings.conninfo) as conn:
        store.check_schema(conn)
        existing = store.read_checkpoint(conn, name)
        if existing is not None:
            if start is not None:
                raise InvalidUsage(
                    f"consumer {name!r} already has a checkpoint on {existing.stream!r} (at {existing.last_id}): "
                    f"--from is for a new consumer; move it with `unilog consumer reset {name} --to ...`"
                )
            return None
        count = _replayed(api, stream, start or "start")
        if start not in (None, "start"):
            _check_id_in_stream(api, stream, start)
            reset_checkpoint(conn, api, name, stream, start)
    return _new_line(("consumer", name), stream, count, start)


def _prepare_group(api: engine.RedisStreams, group: str, stream: str, start: str | None) -> Announcement | None:
    existing = next((g for g in api.groups(stream) if g.get("name") == group), None)
    if existing is not None:
        if start is not None:
            raise InvalidUsage(
                f"group {group!r} already exists on {stream!r}: --from is for a new group; its workers go on from "
                "its own position"
            )
        return None
    count = _replayed(api, stream, start or "start")
    if start not in (None, "start"):
        _check_id_in_stream(api, stream, start)
    api.ensure_group(stream, group, {"start": "0", "end": "$"}.get(start or "start", start or "0"))
    return _new_line(("group", group), stream, count, start)


def _prepare_partitioned(api: engine.RedisStreams, settings: Settings, name: str, stream: str) -> Announcement | None:
    count = api.partitions(stream)
    if count <= 1:
        return None  # the worker refuses an unpartitioned stream, in one line
    with store.connect(settings.conninfo) as conn:
        store.check_schema(conn)
        if any(store.read_checkpoint(conn, f"{name}.p{i}") is not None for i in range(count)):
            return None
    entries = sum(api.info(partition_stream(stream, i)).length for i in range(count))
    return _new_line(("consumer", name), stream, entries, None)


def _replayed(api: engine.RedisStreams, stream: str, start: str) -> int:
    """How many retained entries a new consumer starting at ``start`` applies first."""
    if start == "end":
        return 0
    if start == "start":
        return api.info(stream).length
    return api.entries_after(stream, start)


def _check_id_in_stream(api: engine.RedisStreams, stream: str, start: str) -> None:
    """An id past the stream's last entry would skip records not yet written: refuse it (a typo, most likely)."""
    if start == "end":
        return
    last = api.last_generated_id(stream)
    if last is None or engine.id_tuple(start) > engine.id_tuple(last):
        raise InvalidUsage(
            f"--from {start} is after the last entry of {stream!r} ({last or 'it has none'}): a consumer starting "
            "there would skip records not written yet; use --from end"
        )


def _new_line(who: tuple[str, str], stream: str, count: int, start: str | None) -> Announcement | None:
    """The log line of a new consumer (``who``: its kind and name) that replays ``count`` retained entries (none at
    all: no line), or starts at the end."""
    kind, name = who
    if start == "end":
        return "new consumer starts after the last entry", {kind: name, "stream": stream, "start": "end"}
    if count == 0:
        return None
    fields: dict[str, Any] = {kind: name, "stream": stream, "entries": count, "start": start or "start"}
    if start is None:
        fields["hint"] = "--from end starts after the last entry instead"
    return f"new consumer replays {count} retained entries", fields


def _is_id(value: str) -> bool:
    try:
        engine.id_tuple(value)
    except ValueError:
        return False
    return True


def child_environment() -> dict[str, Any]:
    """The environment of a process started by ``--workers N``: the parent prepared the start already."""
    return {**os.environ, CHILD: "1"}
