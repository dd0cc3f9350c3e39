"""What both faces of the consumers share: their settings, a pass's result, how failures and records are named, and
which records a group may not have applied yet."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PoisonRecord, UnilogError
from ..runtime import FATAL, TRANSIENT
from ..store.groups import Identity
from .records import Record
from .settings import (  # noqa: F401 - where both faces import them from
    POISON_POLICIES,
    ConsumerConfig,
    GroupConfig,
    PartitionConfig,
    default_worker_name,
)


@dataclass(frozen=True)
class ConsumeResult:
    """What one pass did: entries read, records handed to the handler, duplicates skipped, records dead-lettered."""

    read: int = 0
    handled: int = 0
    skipped: int = 0
    dead: int = 0

    def __add__(self, other: ConsumeResult) -> ConsumeResult:
        return ConsumeResult(
            self.read + other.read, self.handled + other.handled, self.skipped + other.skipped, self.dead + other.dead
        )


def is_handler_failure(exc: BaseException) -> bool:
    """A handler's own failure: not the infrastructure's (retried as such), not a refusal no retry can fix (a
    missing privilege) and not one of unilog's verdicts."""
    return isinstance(exc, Exception) and not isinstance(exc, (UnilogError, *TRANSIENT, *FATAL))


def describe(record: Record) -> str:
    """``record <id> (producer:epoch:seq, action)``: how a log line or an error names one record."""
    pos = record.position
    where = "no unilog position" if pos is None else f"position {record.producer}:{pos[0]}:{pos[1]}"
    return f"record {record.id} ({where}, action {record.action!r})"


def poison_stop(config: ConsumerConfig, stream: str, record: Record, exc: Exception) -> PoisonRecord:
    """The error a checkpoint consumer (of one stream or several) stops with under ``on_poison="stop"``: ``record``
    of ``stream`` failed its handler alone, after its batch failed ``max_attempts`` times."""
    return PoisonRecord(
        f"consumer {config.name!r} on stream {stream!r}: {describe(record)} failed its handler alone after "
        f"{config.max_attempts} failed attempts at its batch: {exc!r}. The records before it are applied; fix the "
        "handler and restart, or run with --on-poison dead-letter",
        record.id,
    )


@dataclass(frozen=True)
class GroupResult:
    """What one pass did."""

    read: int = 0
    handled: int = 0
    skipped: int = 0
    dead: int = 0
    claimed: int = 0

    @staticmethod
    def total(results: list[GroupResult]) -> GroupResult:
        """The sum of ``results`` (their reads, applies, skips and dead letters; claims are the pass's own)."""
        return GroupResult(
            sum(r.read for r in results),
            sum(r.handled for r in results),
            sum(r.skipped for r in results),
            sum(r.dead for r in results),
        )


def candidates(records: list[Record], marks: dict[tuple[str, int], int]) -> dict[Identity, Record]:
    """The records a group may not have applied yet, by identity: none at or below its watermark, and a double-sent
    copy in the same batch once. The caller claims their identities; those it gets are the fresh ones."""
    found: dict[Identity, Record] = {}
    for record in records:
        identity = _identity(record)
        if not _applied(identity, marks):
            found.setdefault(identity, record)
    return found


def below_none(identities: set[Identity], marks: dict[tuple[str, int], int]) -> set[Identity]:
    """Those of ``identities`` above their (producer, epoch)'s watermark in ``marks``: the others were applied."""
    return {i for i in identities if not _applied(i, marks)}


def _applied(identity: Identity, marks: dict[tuple[str, int], int]) -> bool:
    """Whether ``identity`` is at or below its watermark (an entry without unilog metadata never is)."""
    return bool(identity[0]) and identity[2] <= marks.get((identity[0], identity[1]), 0)


def _identity(record: Record) -> Identity:
    """(producer, epoch, seq); entries without unilog metadata are identified by the stream id they were first
    appended as (a replay of one is the same record)."""
    pos = record.position
    if pos is not None:
        return record.producer, pos[0], pos[1]
    ms, _, seq = record.origin.partition("-")
    return "", int(ms), int(seq or 0)
