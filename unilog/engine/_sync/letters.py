# Generated from unilog/engine/_async/letters.py by tools/faces.py: do not edit.
"""Writing dead letters: what a consumer of either face asks of Redis for an entry it cannot apply. Handling them
(list, replay, drop) is threaded only: :class:`~unilog.engine.letters.Letters`.

A dead letter may have to reach replicas before the consumer moves past its record (``wait_replicas``; None: 1 on a
cluster, 0 on a single Redis, :func:`~unilog.engine.nodes.replicas_wanted`): it is then sent with ``WAIT`` on one
connection of the node that owns the dead-letter stream's slot, and the :class:`~unilog.engine.base.Written` it
returns says how many replicas acknowledged it."""

from __future__ import annotations

from collections.abc import Mapping

from ...wire import attempts_key, dlq_key, letter_fields, to_str
from ..base import Written
from ..commands import issues
from ..nodes import replicas_wanted
from .base import Adapter


class LettersCore(Adapter):
    """A group's dead letter (acknowledged in the same MULTI) and a checkpoint consumer's (nothing to acknowledge)."""

    @issues("multi", "xadd", "xack", "hdel", "exec", via=("_confirmed",))
    def dead_letter(
        self,
        stream: str,
        group: str,
        entry_id: bytes,
        fields: Mapping[bytes, bytes],
        *,
        error: str,
        consumer: str,
        attempts: int,
        wait_replicas: int | None = 0,
        wait_timeout_ms: int = 1000,
    ) -> Written:
        """Move an entry to the stream's dead-letter stream with why, then acknowledge it (one MULTI: a replica, and
        so a failover, keeps both or neither). With replicas wanted, ``WAIT`` for them after it."""
        letter = letter_fields(fields, entry_id, group=group, consumer=consumer, attempts=attempts, error=error)
        wanted = replicas_wanted(self.client, wait_replicas)
        if not wanted:
            pipe = self.client.pipeline(transaction=True)
            pipe.xadd(dlq_key(stream), letter)  # type: ignore[arg-type]
            pipe.xack(stream, group, entry_id)
            pipe.hdel(attempts_key(stream, group), to_str(entry_id))
            return Written(to_str(pipe.execute()[0]))
        commands = [
            ("MULTI",),
            ("XADD", dlq_key(stream), "*", *_flat(letter)),
            ("XACK", stream, group, entry_id),
            ("HDEL", attempts_key(stream, group), entry_id),
            ("EXEC",),
        ]
        replies, acknowledged = self._confirmed(stream, commands, wanted, wait_timeout_ms)
        executed = replies[-1]
        for reply in executed:
            if isinstance(reply, Exception):
                try:
                    raise reply
                finally:
                    del reply, executed, replies  # each holds the error, whose traceback holds this frame: a cycle
        return Written(to_str(executed[0]), acknowledged, wanted)

    @issues("xadd", "xdel", via=("_confirmed",))
    def dead_letter_entry(
        self,
        stream: str,
        entry_id: bytes,
        fields: Mapping[bytes, bytes],
        *,
        error: str,
        consumer: str,
        attempts: int = 1,
        wait_replicas: int | None = 0,
        wait_timeout_ms: int = 1000,
        replaces: str | None = None,
    ) -> Written:
        """Copy an entry a checkpoint consumer cannot apply to the dead letters, with why (no group: nothing to
        acknowledge). With replicas wanted, ``WAIT`` for them after it; ``replaces``: the id of an earlier copy that
        too few replicas acknowledged, deleted in the same exchange (a retry leaves one copy, not one per attempt)."""
        letter = letter_fields(fields, entry_id, group="", consumer=consumer, attempts=attempts, error=error)
        key = dlq_key(stream)
        wanted = replicas_wanted(self.client, wait_replicas)
        if not wanted:
            return Written(to_str(self.client.xadd(key, letter)))  # type: ignore[arg-type]
        commands = [("XDEL", key, replaces)] if replaces else []
        replies, acknowledged = self._confirmed(
            key, [*commands, ("XADD", key, "*", *_flat(letter))], wanted, wait_timeout_ms
        )
        return Written(to_str(replies[-1]), acknowledged, wanted)


def _flat(fields: Mapping[bytes, bytes]) -> list[bytes]:
    """``XADD``'s field-value arguments."""
    return [part for pair in fields.items() for part in pair]
