"""Dead letters: records a group or a checkpoint consumer gave up on, kept in ``unilog:dlq:{<stream>}`` with why, until
replayed or dropped.

A dead letter carries the original entry's fields plus ``dlq_original_id``, ``dlq_group`` (empty for a checkpoint
consumer's), ``dlq_consumer`` (the group's worker, or the checkpoint consumer), ``dlq_attempts``, ``dlq_error`` and
``dlq_at``. Replaying appends the original fields to the stream again (same position) with ``replay_of`` (the
record's first entry id) and ``replay_for`` (who dead-lettered it). Only that group or consumer applies the replay,
once: a group never recorded the record as applied; a checkpoint consumer recorded it as held (in Postgres, in the
transaction that moved its checkpoint past it) and applies a replay only while it is held. Every other consumer
skips it. Dropping settles it for good: the group's watermark can move past it, the consumer no longer holds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import engine, store
from ..consume.records import REPLAY_FOR, REPLAY_OF, replay_owner
from ..errors import ConfigurationError


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

    @property
    def owner(self) -> str:
        """Who dead-lettered it: ``group:<name>`` or ``consumer:<name>`` (the ``replay_for`` of its replay)."""
        return replay_owner("group", self.group) if self.group else replay_owner("consumer", self.consumer)

    @property
    def origin(self) -> str:
        """The id the record was first appended as (a dead letter of a replay keeps the first one)."""
        return self.fields.get(REPLAY_OF.decode()) or self.original_id

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "original_id": self.original_id,
            "owner": self.owner,
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


def list_letters(
    api: engine.RedisStreams, stream: str, group: str | None = None, consumer: str | None = None
) -> list[DeadLetter]:
    """Every dead letter of ``stream`` oldest first: of ``group`` only, or of checkpoint consumer ``consumer`` only,
    if given."""
    letters = [_decode(eid, fields) for eid, fields in api.dead_letters(stream)]
    if group is not None:
        letters = [d for d in letters if d.group == group]
    if consumer is not None:
        letters = [d for d in letters if not d.group and d.consumer == consumer]
    return letters


def get_letter(api: engine.RedisStreams, stream: str, letter_id: str) -> DeadLetter:
    """One dead letter by id; raises :class:`ConfigurationError` if there is none."""
    raw = api.dead_letters(stream, letter_id)
    if not raw:
        raise ConfigurationError(f"no dead letter {letter_id!r} on {engine.dlq_key(stream)!r}")
    return _decode(raw[0][0], raw[0][1])


def replay(api: engine.RedisStreams, stream: str, letter: DeadLetter) -> str:
    """Append the dead letter's record to ``stream`` again, marked for its owner only, and remove it from the dead
    letters (one ``MULTI``); return the new entry's id."""
    fields = {**letter.fields, REPLAY_OF.decode(): letter.origin, REPLAY_FOR.decode(): letter.owner}
    return api.replay_dead_letter(stream, letter.id, fields)


def drop(api: engine.RedisStreams, conn: Any, stream: str, letter: DeadLetter) -> None:
    """Give up on the record for good: settle it for its group, or stop holding it for its checkpoint consumer (in
    Postgres), then remove the dead letter. A crash in between leaves a letter whose replay is skipped."""
    seq = letter.fields.get("seq")
    if not letter.group:
        with conn.transaction():
            store.release_held(conn, letter.consumer, letter.origin)
    elif seq is not None:
        with conn.transaction():
            identity = (letter.fields.get("producer", ""), int(letter.fields.get("epoch", "0")), int(seq))
            store.mark_dropped(conn, letter.group, stream, identity)
    api.delete_dead_letter(stream, letter.id)
