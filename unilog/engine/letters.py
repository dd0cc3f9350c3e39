"""Dead letters: entries no consumer could apply, moved to the stream's dead-letter stream with why; listed,
replayed and dropped by operators.

Writing them (both faces do) is generated from :mod:`unilog.engine._async.letters`; handling them is the threaded
face's only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..wire import dlq_key, to_str
from ._sync.letters import LettersCore
from .base import Entry
from .commands import issues
from .read import Reading


class Letters(Reading, LettersCore):
    """Writing dead letters (a group's, acknowledged in the same MULTI; a checkpoint consumer's:
    :class:`~unilog.engine._sync.letters.LettersCore`, generated: both faces have them) and handling them (read like
    any stream: hence :class:`~unilog.engine.read.Reading`)."""

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

    @issues("xdel")
    def delete_dead_letters(self, stream: str, letter_ids: Sequence[str]) -> int:
        """Delete the dead letters ``letter_ids`` of ``stream`` (``XDEL`` in pages of 1000); return how many were
        there."""
        ids = list(letter_ids)
        return sum(int(self.client.xdel(dlq_key(stream), *ids[i : i + 1000])) for i in range(0, len(ids), 1000))
