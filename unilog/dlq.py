"""Dead letters: records a group gave up on, kept in ``<stream>:dlq`` with why, until replayed or dropped.

A dead letter carries the original entry's fields plus ``dlq_original_id``, ``dlq_group``, ``dlq_consumer``,
``dlq_attempts``, ``dlq_error`` and ``dlq_at``. Replaying appends the original fields to the stream again (same
position): the group applies it (it never recorded the record as applied), every other consumer skips it as a
duplicate. Dropping records it as settled for its group, so the group's watermark can move past it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import engine, store
from .errors import ConfigurationError


@dataclass(frozen=True)
class DeadLetter:
    """One dead letter, decoded."""

    id: str
    original_id: str
    group: str
    consumer: str
    attempts: int
    error: str
    at_ms: int
    fields: dict[str, str]

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "original_id": self.original_id,
            "group": self.group,
            "consumer": self.consumer,
            "attempts": self.attempts,
            "error": self.error,
            "position": ":".join(self.fields.get(k, "") for k in ("producer", "epoch", "seq")),
            "action": self.fields.get("action"),
            "object": self.fields.get("object"),
        }


def _decode(entry_id: bytes, raw: dict[bytes, bytes]) -> DeadLetter:
    fields = {engine.to_str(k): engine.to_str(v) for k, v in raw.items()}
    meta = {k: fields.pop(k) for k in list(fields) if k.startswith("dlq_")}
    return DeadLetter(
        id=engine.to_str(entry_id),
        original_id=meta.get("dlq_original_id", ""),
        group=meta.get("dlq_group", ""),
        consumer=meta.get("dlq_consumer", ""),
        attempts=int(meta.get("dlq_attempts", "0")),
        error=meta.get("dlq_error", ""),
        at_ms=int(meta.get("dlq_at", "0")),
        fields=fields,
    )


def list_letters(api: engine.RedisStreams, stream: str, group: str | None = None) -> list[DeadLetter]:
    """Every dead letter of ``stream`` (of ``group`` only, if given), oldest first."""
    letters = [_decode(eid, fields) for eid, fields in api.dead_letters(stream)]
    return [d for d in letters if group is None or d.group == group]


def get_letter(api: engine.RedisStreams, stream: str, letter_id: str) -> DeadLetter:
    """One dead letter by id; raises :class:`ConfigurationError` if there is none."""
    raw = api.dead_letters(stream, letter_id)
    if not raw:
        raise ConfigurationError(f"no dead letter {letter_id!r} on {engine.dlq_key(stream)!r}")
    return _decode(raw[0][0], raw[0][1])


def replay(api: engine.RedisStreams, stream: str, letter: DeadLetter) -> str:
    """Append the dead letter's record to ``stream`` again and remove it from the dead letters; return the new id."""
    return api.replay_dead_letter(stream, letter.id, letter.fields)


def drop(api: engine.RedisStreams, conn: Any, stream: str, letter: DeadLetter) -> None:
    """Give up on the record for good: settle it for its group (in Postgres), then remove the dead letter."""
    seq = letter.fields.get("seq")
    if seq is not None and letter.group:
        with conn.transaction():
            identity = (letter.fields.get("producer", ""), int(letter.fields.get("epoch", "0")), int(seq))
            store.mark_dropped(conn, letter.group, stream, identity)
    api.delete_dead_letter(stream, letter.id)
