# Generated from unilog/engine/_async/letters.py by tools/faces.py: do not edit.
"""Writing dead letters: what a consumer of either face asks of Redis for an entry it cannot apply. Handling them
(list, replay, drop) is threaded only: :class:`~unilog.engine.letters.Letters`."""

from __future__ import annotations

from collections.abc import Mapping

from ...wire import attempts_key, dlq_key, letter_fields, to_str
from ..commands import issues
from .base import Adapter


class LettersCore(Adapter):
    """A group's dead letter (acknowledged in the same MULTI) and a checkpoint consumer's (nothing to acknowledge)."""

    @issues("multi", "xadd", "xack", "hdel", "exec")
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
    ) -> str:
        """Move an entry to the stream's dead-letter stream with why, then acknowledge it (one MULTI)."""
        letter = letter_fields(fields, entry_id, group=group, consumer=consumer, attempts=attempts, error=error)
        pipe = self.client.pipeline(transaction=True)
        pipe.xadd(dlq_key(stream), letter)  # type: ignore[arg-type]
        pipe.xack(stream, group, entry_id)
        pipe.hdel(attempts_key(stream, group), to_str(entry_id))
        return to_str((pipe.execute())[0])

    @issues("xadd")
    def dead_letter_entry(
        self,
        stream: str,
        entry_id: bytes,
        fields: Mapping[bytes, bytes],
        *,
        error: str,
        consumer: str,
        attempts: int = 1,
    ) -> str:
        """Copy an entry a checkpoint consumer cannot apply to the dead letters, with why (no group: nothing to
        acknowledge); return the dead letter's id."""
        letter = letter_fields(fields, entry_id, group="", consumer=consumer, attempts=attempts, error=error)
        return to_str(self.client.xadd(dlq_key(stream), letter))  # type: ignore[arg-type]
