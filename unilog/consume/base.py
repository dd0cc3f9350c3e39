"""What both faces of the consumers share: their settings, a pass's result, how failures and records are named, and
which records a group may not have applied yet."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from ..config import validate_name, validate_stream_name
from ..errors import UnilogError
from ..records import Record, check_malformed_policy
from ..runtime import FATAL, TRANSIENT
from ..store.groups import Identity

POISON_POLICIES = ("stop", "dead-letter")


@dataclass(frozen=True)
class ConsumerConfig:
    """A checkpoint consumer's identity and pacing.

    ``name`` keys its checkpoint; ``stream`` None means ``Settings.stream``. ``block_ms`` is how long one read waits
    for new entries, so an idle consumer reacts within milliseconds of an ``XADD``. With ``register`` the consumer
    records its checkpoint in the stream's registry after a commit, at most every ``register_interval`` seconds (an
    older value only holds back more of the stream), and trimming never passes it. A batch transaction (handler
    included) that takes longer than ``pg_timeout`` seconds has its connection broken: it rolls back and is retried,
    so a silent Postgres never hangs the consumer. With ``strict_start`` (rebuilds) a producer whose first record in
    the stream is not its position 1 stops the consumer: its history was trimmed.
    ``on_malformed``: what to do with an entry that is not a unilog record (``data`` not JSON, position fields not
    integers): ``"dead-letter"`` moves it to ``unilog:dlq:{<stream>}`` with the reason and goes on past it in the same
    transaction as the rest of its batch; ``"stop"`` raises :class:`~unilog.errors.MalformedEntry`. Entries with
    JSON ``data`` but no unilog position (another service's ``XADD``) are records: applied in stream order, once
    per checkpoint, but never deduplicated (unilog cannot know whether their writer sent one twice).
    ``max_attempts`` and ``on_poison``: after a handler fails one batch ``max_attempts`` times, the batch is applied
    one record per transaction to find the failing record; then ``"stop"`` raises
    :class:`~unilog.errors.PoisonRecord` (the records before it are applied, it and those after are not), and
    ``"dead-letter"`` moves it to ``unilog:dlq:{<stream>}`` with the error (``attempts``: the batch's failures and
    its own), advances the checkpoint past it in the same transaction and goes on. A replay of it (``unilog dlq
    replay``) is then applied by this consumer once.
    """

    name: str
    stream: str | None = None
    batch_size: int = 1000
    block_ms: int = 1000
    max_backoff: float = 10.0
    restart_after_crash: bool = True
    register: bool = True
    pg_timeout: float | None = 60.0
    strict_start: bool = False
    register_interval: float = 0.0
    on_malformed: str = "dead-letter"
    max_attempts: int = 3
    on_poison: str = "stop"
    rewind_grace: float = 0.0

    def __post_init__(self) -> None:
        validate_name("consumer", self.name)
        if self.stream is not None:
            validate_stream_name(self.stream)
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        check_malformed_policy(self.on_malformed)
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.on_poison not in POISON_POLICIES:
            raise ValueError(f"on_poison must be one of {', '.join(POISON_POLICIES)}, not {self.on_poison!r}")
        if self.rewind_grace < 0:
            raise ValueError("rewind_grace must not be negative")


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


def default_worker_name() -> str:
    """``host-pid``: unique per process, stable for its life."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class GroupConfig:
    """A group worker's identity and pacing.

    ``group`` names the group (and its state in ``unilog_processed``); ``worker`` names this worker in Redis.
    ``claim_idle_ms`` is how long an entry must sit unacknowledged before another worker claims it (and the back-off
    between attempts at a failing record); ``max_deliveries`` failed attempts send a record to the dead letters.
    """

    group: str
    worker: str = ""
    stream: str | None = None
    batch_size: int = 500
    block_ms: int = 1000
    claim_idle_ms: int = 30_000
    claim_interval: float = 5.0
    max_deliveries: int = 5
    on_malformed: str = "dead-letter"  # or "stop": see ConsumerConfig
    prune_interval: float = 10.0
    max_backoff: float = 10.0
    restart_after_crash: bool = True
    pg_timeout: float | None = 60.0

    def __post_init__(self) -> None:
        validate_name("group", self.group)
        if self.stream is not None:
            validate_stream_name(self.stream)
        if self.max_deliveries < 1:
            raise ValueError("max_deliveries must be at least 1")
        check_malformed_policy(self.on_malformed)


@dataclass(frozen=True)
class GroupResult:
    """What one pass did."""

    read: int = 0
    handled: int = 0
    skipped: int = 0
    dead: int = 0
    claimed: int = 0


def candidates(records: list[Record], marks: dict[tuple[str, int], int]) -> dict[Identity, Record]:
    """The records a group may not have applied yet, by identity: none at or below its watermark, and a double-sent
    copy in the same batch once. The caller claims their identities; those it gets are the fresh ones."""
    found: dict[Identity, Record] = {}
    for record in records:
        identity = _identity(record)
        if identity[0] and identity[2] <= marks.get((identity[0], identity[1]), 0):
            continue
        found.setdefault(identity, record)
    return found


def _identity(record: Record) -> Identity:
    """(producer, epoch, seq); entries without unilog metadata are identified by the stream id they were first
    appended as (a replay of one is the same record)."""
    pos = record.position
    if pos is not None:
        return record.producer, pos[0], pos[1]
    ms, _, seq = record.origin.partition("-")
    return "", int(ms), int(seq or 0)
