"""A checkpoint consumer's rules, with no I/O: which entries of a batch it applies, and when it stops instead of
skipping (a gap in a producer's positions, a stream that ends below the checkpoint).

The threaded :class:`~unilog.Consumer` and the asyncio :class:`~unilog.AsyncConsumer` both apply a batch
through :func:`sort_batch` and :func:`keep_held` and watch for rewinds with :class:`RewindWatch`, so
the two cannot drift apart on what "exactly once" means.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import structlog

from .. import engine
from ..errors import MalformedEntry, StreamGap, StreamRewound
from ..log import Once
from ..store import Checkpoint
from .records import REPLAY_FOR, Record

log = structlog.get_logger(__name__)

Letter = tuple[bytes, dict[bytes, bytes], str]  # a malformed entry: its id, its fields, why


@dataclass
class Sorted:
    """A batch sorted against a checkpoint: records to apply (replays among them, to be checked against the held
    letters) and malformed entries to dead-letter."""

    fresh: list[Record] = field(default_factory=list)
    replays: list[Record] = field(default_factory=list)
    letters: list[Letter] = field(default_factory=list)


@dataclass(frozen=True)
class Rules:
    """Who sorts: the consumer's ``name``, its ``stream``, its replay ``owner`` tag, its malformed-entry policy,
    ``strict_start`` (a producer first seen past its position 1 stops it) and how its records read ``numbers``.
    ``warned``: the warnings already logged, kept here because the consumer keeps its rules across retries and
    restarts, which sort the same batch again."""

    name: str
    stream: str
    owner: bytes
    on_malformed: str = "dead-letter"
    strict_start: bool = False
    numbers: str = "float"  # Record's: how data reads non-integral numbers
    warned: Once = field(default_factory=Once, compare=False, repr=False)


def sort_batch(
    rules: Rules, entries: list[engine.Entry], checkpoint: Checkpoint, malformed: Mapping[bytes, str]
) -> Sorted:
    """Sort ``entries`` (read after ``checkpoint``) and advance ``checkpoint`` past all of them.

    Dropped: another consumer's replays, and positions at or below the checkpoint's (double-sends and re-sends).
    ``malformed``: entries a handler found malformed in an earlier attempt. Raises :class:`StreamGap` when a
    producer's positions jump past the checkpoint, and :class:`MalformedEntry` under the ``stop`` policy.
    """
    out = Sorted()
    positions = checkpoint.positions
    for entry_id, fields in entries:
        owner = fields.get(REPLAY_FOR)
        if owner is not None and owner != rules.owner:
            continue  # another consumer's (or group's) replay: we applied the original, or will
        try:
            record = Record(rules.stream, entry_id, fields, rules.numbers)
            if entry_id in malformed:
                _past(positions, record)  # a record a handler could not read (UnreadableRecord) has its position
                raise MalformedEntry(rules.stream, engine.to_str(entry_id), malformed[entry_id])
        except MalformedEntry as exc:
            if rules.on_malformed == "stop":
                raise
            out.letters.append((entry_id, fields, exc.reason))
            continue
        pos = record.position
        if owner is not None:
            out.replays.append(record)  # behind the checkpoint by construction: positions stay as they are
        elif pos is not None:
            last = positions.get(record.producer)
            if last is not None and pos <= last:
                continue
            check_contiguous(rules, record, last, pos)
            positions[record.producer] = pos
        out.fresh.append(record)
    checkpoint.last_id = engine.to_str(entries[-1][0])
    return out


def _past(positions: dict[str, tuple[int, int]], record: Record) -> None:
    """Move ``positions`` past a record that is dead-lettered rather than applied, so the next one is no gap."""
    pos = record.position
    if pos is not None and (record.producer not in positions or positions[record.producer] < pos):
        positions[record.producer] = pos


def keep_held(fresh: list[Record], replays: list[Record], held: set[str]) -> list[Record]:
    """``fresh`` without the replays whose origin is not in ``held`` (already applied, or replayed twice: the
    second copy in one batch is dropped)."""
    drop = set()
    for record in replays:
        if record.origin in held:
            held.discard(record.origin)
        else:
            drop.add(id(record))
    return [r for r in fresh if id(r) not in drop]


def check_contiguous(rules: Rules, record: Record, last: tuple[int, int] | None, pos: tuple[int, int]) -> None:
    """Raise :class:`StreamGap` unless ``pos`` follows ``last`` (the checkpoint's position for the producer)."""
    expected = 1 if last is None or pos[0] != last[0] else last[1] + 1
    if pos[1] == expected:
        return
    if last is None and rules.strict_start:
        raise StreamGap(
            f"consumer {rules.name!r} on stream {rules.stream!r}: producer {record.producer!r} starts at "
            f"position {pos[0]}:{pos[1]}, not {pos[0]}:1: its earlier records were trimmed from the stream, so a "
            "rebuild from the stream alone would miss them (rebuild from the archive instead)"
        )
    if last is None:
        # a consumer that never saw this producer starts wherever the retained stream starts: said once, not again
        # on each retry of the batch (its checkpoint still has no position for the producer until the batch commits)
        if rules.warned.first(("history", record.producer, pos)):
            log.warning(
                "history before this position is not in the stream",
                consumer=rules.name,
                producer=record.producer,
                position=pos,
            )
        return
    raise StreamGap(
        f"consumer {rules.name!r} on stream {rules.stream!r}: producer {record.producer!r} positions "
        f"{pos[0]}:{expected}..{pos[0]}:{pos[1] - 1} are missing before entry {record.id} (checkpoint at "
        f"{last[0]}:{last[1]}): they were trimmed or Redis lost them. Stopping instead of skipping them; "
        "repair this consumer with `unilog reconcile` (or rebuild it) and reset its checkpoint"
    )


class RewindWatch:
    """Raises :class:`StreamRewound` once the stream has ended below the checkpoint for ``grace`` seconds (0: at
    once). See ``ConsumerConfig.rewind_grace`` for when a grace is safe."""

    def __init__(self, name: str, stream: str, grace: float) -> None:
        self.name, self.stream, self.grace = name, stream, grace
        self._since: float | None = None
        self._warned = Once()  # the waiting is logged once per checkpoint it happens at, not on every check

    def check(self, top: str | None, last_id: str) -> None:
        """``top``: the stream's last generated id (None: no such key); ``last_id``: the checkpoint's."""
        if last_id == "0-0" or (top is not None and engine.id_tuple(top) >= engine.id_tuple(last_id)):
            self._since = None
            self._warned.clear()
            return
        now = time.monotonic()
        if self._since is None:
            self._since = now
        if now - self._since < self.grace:
            if not self._warned.first(last_id):
                return
            log.warning(
                "stream ends below the checkpoint; waiting for the streamer to re-send what it kept staged",
                consumer=self.name,
                stream=self.stream,
                top=top,
                checkpoint=last_id,
            )
            return
        raise StreamRewound(
            f"consumer {self.name!r}: stream {self.stream!r} ends at {top or 'nothing (no such key)'}, "
            f"below this consumer's checkpoint {last_id}: Redis lost entries it had confirmed (restart without "
            "persistence, truncated AOF or failover). See the recovery steps in docs/guides/delivery-guarantees.md"
        )
