"""Least-privilege Redis ACL users: the commands and key patterns each kind of unilog process needs.

:func:`acl_lines` renders them as ``ACL SETUSER`` lines for the configured streams (``unilog acl`` prints them).
Each user starts from nothing (``reset``) and gets only its commands, on its streams' keys: the stream itself, its
partitions (``<stream>.p*``), its dead letters and unilog's bookkeeping keys for it. No user gets ``KEYS``,
``FLUSH*``, ``CONFIG`` or any other administrative command.

The commands are not listed here: :data:`USES` names the adapter methods each kind of process calls, and each
method declares the commands it issues, beside its code (``@issues`` in :mod:`unilog.engine`). A new command is
one edit, in the method's declaration; a kind that starts calling another method is one edit, here.
``tests/test_acl_commands.py`` runs each kind under its user and checks Redis saw nothing else from it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from ..engine import RedisStreams as R
from ..engine import connect, ids_many, ping, raw_pages
from ..engine.commands import commands_of
from ..wire import attempts_key, dlq_key, hwm_key, meta_key, registry_key, workers_key

# Every process connects (redis-py's health checks: PING) and checks the server answers (INFO: version, loading).
_CONNECTING: tuple[Callable[..., Any], ...] = (connect, ping)

# What each kind of process calls in the Redis adapter (the asyncio consumers call the twins of the same names).
USES: dict[str, tuple[Callable[..., Any], ...]] = {
    # `unilog streamer` in either capture mode (and `unilog capture`, whose settling runs one): publishing, the
    # producer's high-water mark (and the entries past it, to settle a batch in doubt when a WAL slot was lost),
    # partition counts, the check for keys in the layout before hash tags, retention
    "streamer": (
        R.publish,
        R.publish_many,
        R.high_water,
        R.high_waters,
        R.unsaved_entries,
        R.partitions,
        R.partitions_many,
        R.legacy_keys,
        R.legacy_keys_many,
        R.registered,
        R.groups,
        R.pending_summary,
        R.trim,
        R.memory,
    ),
    # checkpoint consumers (both faces): reads after the checkpoint (of several streams at once, and the look for a
    # prefix's streams), the missing-stream and rewind checks, retention registration, dead letters; partitioned
    # workers: partition counts, heartbeats, the wait over partitions;
    # the Spark source and sink, the archive and reconciliation: pages of the stream, registration; `unilog consume`
    # before a new consumer starts: the stream's length, or the entries after --from ID
    "consumer": (
        R.read,
        R.read_many,
        R.stream_names,
        R.info,
        R.entries_after,
        R.missing_stream,
        R.missing_streams,
        R.last_generated_id,
        R.last_generated_ids,
        R.register,
        R.register_many,
        R.dead_letter_entry,
        R.partitions,
        R.heartbeat,
        R.leave,
        R.wait_for_entries,
        R.entries,
        raw_pages,
        ids_many,
    ),
    # group workers (both faces): deliveries, claims, acknowledgements, attempt counts, dead letters; `unilog consume`
    # before a new group starts: whether it exists, the stream's length or last id, the entries after --from ID
    "group": (
        R.ensure_group,
        R.ensure_groups,
        R.read_group,
        R.read_group_many,
        R.ack,
        R.autoclaim,
        R.autoclaim_many,
        R.attempt,
        R.settle,
        R.settle_many,
        R.stream_names,
        R.dead_letter,
        R.groups,
        R.info,
        R.last_generated_id,
        R.entries_after,
    ),
    # `unilog status`, `metrics` and `dashboard` (every stream surveyed at once, with what each registration holds);
    # dead letters (list, show, replay, drop); consumers (register, unregister, reset, rebuild, delete), groups
    # (delete) and `unilog.ops.admin.declare`; `unilog stream partition` and `relayout`
    "operator": (
        R.survey,
        R.count_ranges,
        R.partitions,
        R.info,
        R.first_after,
        R.entries_after,
        R.groups,
        R.pending_summary,
        R.dead_letters,
        R.replay_dead_letter,
        R.delete_dead_letter,
        R.delete_dead_letters,
        R.destroy_group,
        R.registered,
        R.register,
        R.unregister,
        R.entries,
        R.last_generated_id,
        R.ensure_group,
        R.set_partitions,
        R.relayout,
    ),
}


def commands(kind: str) -> list[str]:
    """The commands a ``kind`` process issues: those its adapter methods declare (sorted)."""
    return sorted({command for used in (*_CONNECTING, *USES[kind]) for command in commands_of(used, R)})


COMMANDS: dict[str, list[str]] = {kind: commands(kind) for kind in USES}
KINDS = tuple(COMMANDS)


def key_patterns(stream: str) -> list[str]:
    """The key patterns of ``stream``: itself, its partitions, its dead letters and unilog's keys for them."""
    streams = [stream, f"{stream}.p*"]
    keys = [*streams, *(dlq_key(s) for s in streams)]
    for s in streams:
        keys += [hwm_key(s), meta_key(s), registry_key(s), attempts_key(s, "*"), workers_key(s, "*")]
    return keys


def acl_line(
    kind: str, user: str, streams: Sequence[str], password: str = "<password>", *, aclfile: bool = False
) -> str:
    """One ``ACL SETUSER`` line: ``user`` may run ``kind``'s commands on ``streams``' keys, with ``password``.

    ``aclfile``: the same user as a line of a Redis ACL file (``user NAME ...``, for ``redis-server --aclfile``),
    with the password's SHA-256 (``#hex``) so the file does not hold the password itself.
    """
    patterns = [f"~{key}" for stream in streams for key in key_patterns(stream)]
    commands = [f"+{command}" for command in COMMANDS[kind]]
    head = ["user", user] if aclfile else ["ACL SETUSER", user]
    return " ".join([*head, "reset", "on", _secret(password, aclfile), "resetchannels", *patterns, *commands])


def acl_lines(
    users: dict[str, str],
    streams: Sequence[str],
    password: str = "<password>",
    *,
    aclfile: bool = False,
    admin_password: str | None = None,
) -> list[str]:
    """The ``ACL SETUSER`` lines for ``users`` (kind -> user name); ``aclfile``: an ACL file's lines, ending with
    the ``default`` user's (Redis would otherwise create it with no password and every right): ``off`` unless
    ``admin_password`` is given, then every right under that password (health checks, an administrator)."""
    lines = [acl_line(kind, user, streams, password, aclfile=aclfile) for kind, user in users.items()]
    if aclfile:
        admin = ["on", _secret(admin_password, True), "~*", "&*", "+@all"] if admin_password else ["off"]
        lines.append(" ".join(["user", "default", "reset", *admin]))
    return lines


def _secret(password: str, hashed: bool) -> str:
    return f"#{hashlib.sha256(password.encode()).hexdigest()}" if hashed else f">{password}"
