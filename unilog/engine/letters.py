"""Dead letters: entries no consumer could apply, moved to the stream's dead-letter stream with why; listed,
replayed and dropped by operators."""

from __future__ import annotations

from collections.abc import Mapping

from ..wire import attempts_key, dlq_key, letter_fields, to_str
from .base import Entry
from .commands import issues
from .read import Reading


class Letters(Reading):
    """Writing dead letters (a group's, acknowledged in the same MULTI; a checkpoint consumer's) and handling them
    (read like any stream: hence :class:`~unilog.engine.read.Reading`)."""

    @issues("multi", "xadd", "xack", "hdel", "exec")
    def dead_letter(
        self,
        stream: str,
        group: str,
        entry_id: bytes,
        fields: dict[bytes, bytes],
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
        letter_id = pipe.execute()[0]
        return to_str(letter_id)

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

    @issues("xrange", via=("entries",))
    def dead_letters(self, stream: str, letter_id: str | None = None) -> list[Entry]:
        """Every dead letter of ``stream`` oldest first, or just ``letter_id`` (an empty list if it is gone)."""
        if letter_id is not None:
            return list(self.client.xrange(dlq_key(stream), min=letter_id, max=letter_id))  # type: ignore[arg-type]
        return list(self.entries(dlq_key(stream)))

    @issues("multi", "xadd", "xdel", "exec")
    def replay_dead_letter(self, stream: str, letter_id: str, fields: Mapping[str, str]) -> str:
        """Append a dead letter's original fields to ``stream`` and delete the letter, in one ``MULTI``; return the
        new entry's id."""
        pipe = self.client.pipeline(transaction=True)
        pipe.xadd(stream, dict(fields))  # type: ignore[arg-type]
        pipe.xdel(dlq_key(stream), letter_id)
        return to_str(pipe.execute()[0])

    @issues("xdel")
    def delete_dead_letter(self, stream: str, letter_id: str) -> None:
        self.client.xdel(dlq_key(stream), letter_id)
