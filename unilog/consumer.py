"""Checkpoint consumers: user handlers whose effects and checkpoint commit in one Postgres transaction.

For each batch the consumer reads entries after its checkpoint from Redis (blocking ``XREAD`` outside any
transaction, so an idle consumer holds no transaction open), then in one transaction: locks its checkpoint row,
drops entries whose (producer, epoch, seq) position it already applied (double-sends, re-sends after a streamer
crash), calls the handler with the rest, saves the new checkpoint and commits.

Guarantee: a crash at any point before the commit leaves neither effect nor checkpoint, so the batch is replayed;
a crash after it replays nothing. Each record's effect is applied exactly once, as long as the handler's effects
live in the transaction it is given. The row lock makes two copies of one consumer apply batches one after the
other, never the same batch twice.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog

from . import engine, metrics, store, tracing
from .config import Settings, validate_name, validate_stream_name
from .errors import (
    ConfigurationError,
    MalformedEntry,
    PoisonRecord,
    UnilogError,
)
from .faults import NO_FAULTS, Faults
from .progress import RewindWatch, Rules, keep_held, sort_batch
from .records import (
    REPLAY_OF,
    Batch,
    Handler,
    Record,
    check_malformed_policy,
    load_handler,
    load_object,
    replay_owner,
)
from .resets import positions_through, reset_checkpoint
from .runtime import FATAL, TRANSIENT, Backoff, Links, Worker, account_batch

__all__ = [  # Batch, Handler, Record and the loaders are re-exported: they lived here first
    "Batch",
    "ConsumeResult",
    "Consumer",
    "ConsumerConfig",
    "Handler",
    "Record",
    "load_handler",
    "load_object",
    "positions_through",
    "reset_checkpoint",
]

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ConsumerConfig:
    """A checkpoint consumer's identity and pacing.

    ``name`` keys its checkpoint; ``stream`` None means ``Settings.stream``. ``block_ms`` is how long one read waits
    for new entries, so an idle consumer reacts within milliseconds of an ``XADD``. With ``register`` the consumer
    records its checkpoint in the stream's registry after each commit, and trimming never passes it. A batch
    transaction (handler included) that takes longer than ``pg_timeout`` seconds has its connection broken: it rolls
    back and is retried, so a silent Postgres never hangs the consumer. With ``strict_start`` (rebuilds) a producer
    whose first record in the stream is not its position 1 stops the consumer: its history was trimmed.
    ``on_malformed``: what to do with an entry that is not a unilog record (``data`` not JSON, position fields not
    integers): ``"dead-letter"`` moves it to ``unilog:dlq:{<stream>}`` with the reason and goes on past it in the same
    transaction as the rest of its batch; ``"stop"`` raises :class:`~unilog.errors.MalformedEntry`. Entries with
    JSON ``data`` but no unilog position (another service's ``XADD``) are records: applied in stream order, once
    per checkpoint, but never deduplicated (unilog cannot know whether their writer sent one twice).
    ``max_attempts`` and ``on_poison``: after a handler fails one batch ``max_attempts`` times, the batch is applied
    one record per transaction to find the failing record; then ``"stop"`` raises
    :class:`~unilog.errors.PoisonRecord` (the records before it are applied, it and those after are not), and
    ``"dead-letter"`` moves it to ``unilog:dlq:{<stream>}`` with the error, advances the checkpoint past it in the same
    transaction and goes on. A replay of it (``unilog dlq replay``) is then applied by this consumer once.
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


POISON_POLICIES = ("stop", "dead-letter")


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


class Consumer(Worker):
    """Runs a handler over a stream with exactly-once effects. One thread drives one consumer."""

    def __init__(
        self,
        settings: Settings,
        config: ConsumerConfig,
        handler: Handler,
        *,
        faults: Faults = NO_FAULTS,
    ) -> None:
        self.settings = settings
        self.config = config
        self.stream = config.stream or settings.stream
        self.handler = handler
        self.faults = faults
        self.restart_after_crash = config.restart_after_crash
        self.max_backoff = config.max_backoff
        self.links = Links(
            settings,
            app_name=f"unilog-consumer-{config.name}",
            pg_timeout=config.pg_timeout,
            redis_timeout=config.block_ms / 1000 + 10,  # must outlast a blocking read
            on_pg_connect=self._forget_checkpoint,
        )
        self._checkpoint: store.Checkpoint | None = None
        self.handled_total = 0
        self.skipped_total = 0
        self._last_rewind_check = 0.0
        self._rewind = RewindWatch(config.name, self.stream, config.rewind_grace)
        self._rules = Rules(
            config.name,
            self.stream,
            replay_owner("consumer", config.name).encode(),
            config.on_malformed,
            config.strict_start,
        )
        self._registered_at = 0.0
        self._malformed: dict[bytes, str] = {}  # entries found malformed by a handler: dead-lettered next pass
        self._letters: list[tuple[bytes, dict[bytes, bytes], str]] = []  # malformed entries of the batch at hand
        self.malformed_total = 0
        self.dead_total = 0
        self._failures: dict[str, int] = {}  # handler failures of the batch after this checkpoint id

    kind = "consumer"
    metric_kind = "checkpoint"  # the partition worker's consumers say "partition"

    @property
    def label(self) -> dict[str, Any]:
        return {"consumer": self.config.name}

    def describe(self) -> dict[str, Any]:
        return {"stream": self.stream, **self.settings.describe()}

    def totals(self) -> dict[str, Any]:
        return {"handled": self.handled_total}

    # -- connections -------------------------------------------------------------------------------------------------

    def _conn(self) -> psycopg.Connection[Any]:
        return self.links.pg()

    def _engine(self) -> engine.RedisStreams:
        return self.links.redis()

    def _forget_checkpoint(self, _conn: object = None) -> None:
        self._checkpoint = None

    def connect(self) -> None:
        """Connect to both servers, load the checkpoint, register it for retention and check Redis did not rewind.

        Raises a one-line-worthy error if a server is unreachable or data was lost.
        """
        others = self._engine().missing_stream(self.stream)
        if others is not None:  # a typo in a stream name would otherwise wait in silence, forever
            log.warning(
                "the stream does not exist yet; waiting for its first entry",
                consumer=self.config.name,
                stream=self.stream,
                existing_streams=others,
            )
        self._register(self.checkpoint.last_id, force=True)
        self._check_not_rewound()
        self._last_rewind_check = time.monotonic()

    def _register(self, last_id: str, *, force: bool = False) -> None:
        """Record the checkpoint in the retention registry, at most every ``register_interval`` seconds: an older
        value only holds back more of the stream (the safe direction), and each write is an fsync'd round trip."""
        if not self.config.register:
            return
        now = time.monotonic()
        if force or now - self._registered_at >= self.config.register_interval:
            self._engine().register(self.stream, self.config.name, last_id)
            self._registered_at = now

    def _idle_checks(self) -> None:
        """While idle, look for a rewound stream, at most once a second (no gap shows until new entries arrive)."""
        now = time.monotonic()
        if now - self._last_rewind_check >= 1.0:
            self._last_rewind_check = now
            self._check_not_rewound()

    def close(self) -> None:
        """Close connections; the committed checkpoint is all that carries over."""
        super().close()
        self._checkpoint = None

    @property
    def checkpoint(self) -> store.Checkpoint:
        """The last committed checkpoint (loaded from Postgres, or created at the stream's start)."""
        if self._checkpoint is None:
            conn = self._conn()
            with conn.transaction():
                cp = store.ensure_checkpoint(conn, self.config.name, self.stream)
            if cp.stream != self.stream:
                raise ConfigurationError(
                    f"consumer {self.config.name!r} has a checkpoint on stream {cp.stream!r}, not {self.stream!r}: "
                    "use another name or reset it"
                )
            self._checkpoint = cp
        return self._checkpoint

    # -- one pass ----------------------------------------------------------------------------------------------------

    def run_once(self, block_ms: int | None = None) -> ConsumeResult:
        """Read one batch after the checkpoint and apply it with the checkpoint in one transaction.

        ``block_ms`` overrides how long to wait for entries (0 or None: use the config; negative: don't wait).
        """
        wait = self.config.block_ms if not block_ms else (None if block_ms < 0 else block_ms)
        before = self.checkpoint
        entries = self._engine().read(self.stream, before.last_id, self.config.batch_size, wait)
        if not entries:
            self._idle_checks()
            return ConsumeResult()
        if self._failures.get(before.last_id, 0) >= self.config.max_attempts:
            return self._isolate(entries)
        try:
            return self._apply_checked(entries, before)
        except Exception as exc:
            if _is_handler_failure(exc):
                self._failures = {before.last_id: self._failures.get(before.last_id, 0) + 1}
            raise  # the loop rolls back, backs off and reads the batch again

    def _apply_checked(self, entries: list[engine.Entry], before: store.Checkpoint) -> ConsumeResult:
        """:meth:`_apply`, again without an entry a handler found malformed (dead-lettered instead), unless the
        policy is to stop."""
        while True:
            try:
                return self._apply(entries, before)
            except MalformedEntry as exc:  # a handler read a record whose data is not JSON: nothing was committed
                known = exc.entry_id.encode()
                if self.config.on_malformed == "stop" or known in self._malformed:
                    raise
                self._malformed[known] = exc.reason  # apply the batch again, that entry dead-lettered

    def _isolate(self, entries: list[engine.Entry]) -> ConsumeResult:
        """The batch failed ``max_attempts`` times: apply its records one per transaction to find the one that
        fails, and apply the poison policy to it (:meth:`_poisoned`)."""
        log.warning(
            "batch keeps failing; applying its records one by one",
            consumer=self.config.name,
            first=engine.to_str(entries[0][0]),
            records=len(entries),
        )
        total = ConsumeResult()
        for entry in entries:
            before = self.checkpoint
            try:
                total += self._apply_checked([entry], before)
            except Exception as exc:
                if not _is_handler_failure(exc):
                    raise
                self.links.discard_failed_transaction()
                total += self._poisoned(entry, before, exc)
            if self._checkpoint is None:  # moved underneath (another copy, a reset): read again from there
                break
        self._failures.clear()
        return total

    def _poisoned(self, entry: engine.Entry, before: store.Checkpoint, exc: Exception) -> ConsumeResult:
        """``entry`` failed alone: stop (raise :class:`PoisonRecord`) or dead-letter it and move the checkpoint
        past it, in one transaction with the row that lets a replay of it be applied once."""
        record = Record(self.stream, *entry)
        where = _describe(record)
        if self.config.on_poison == "stop":
            raise PoisonRecord(
                f"consumer {self.config.name!r} on stream {self.stream!r}: {where} failed its handler alone after "
                f"{self.config.max_attempts} failed attempts at its batch: {exc!r}. The records before it are "
                "applied; fix the handler and restart, or run with --on-poison dead-letter",
                record.id,
            ) from exc
        conn = self._conn()
        with store.deadline(conn, self.config.pg_timeout), conn.transaction():
            current = store.lock_checkpoint(conn, self.config.name)
            if current is None or current.last_id != before.last_id or current.positions != before.positions:
                self._checkpoint = None
                return ConsumeResult()
            after = current.copy()
            self._dedupe(conn, [entry], after)  # moves the checkpoint past it (and takes a replay's held row)
            store.hold_letter(conn, self.config.name, self.stream, record.origin)
            letter = self._engine().dead_letter_entry(
                self.stream,
                entry[0],
                entry[1],
                error=repr(exc),
                consumer=self.config.name,
                attempts=self.config.max_attempts + 1,  # the batch's failures, and its own
            )
            # a crash here leaves a dead letter for a record still ahead of the checkpoint: it is retried, and a
            # replay of that letter is skipped unless the retry dead-letters it again (then one replay applies)
            self.faults.crash("consumer.crash_after_dead_letter")
            store.save_checkpoint(conn, after)
        self._checkpoint = after
        self.dead_total += 1
        metrics.dead_lettered(self.stream, self.config.name, "poison")
        log.error("record dead-lettered", consumer=self.config.name, record=where, dead_letter=letter, error=repr(exc))
        return ConsumeResult(1, 0, 0, 1)

    def _apply(self, entries: list[engine.Entry], before: store.Checkpoint) -> ConsumeResult:
        """Apply one batch read after ``before`` with the checkpoint, in one transaction."""
        started = time.perf_counter()
        conn = self._conn()
        with store.deadline(conn, self.config.pg_timeout), conn.transaction():
            current = store.lock_checkpoint(conn, self.config.name)
            if current is None or current.last_id != before.last_id or current.positions != before.positions:
                # another copy of this consumer (or a reset) moved the checkpoint: drop what we read, reload
                self._checkpoint = None
                log.info("checkpoint moved underneath; re-reading", consumer=self.config.name)
                return ConsumeResult()
            after = current.copy()
            fresh = self._dedupe(conn, entries, after)
            if fresh:
                crash_at = self.faults.pick(len(fresh)) if self.faults.fires("consumer.crash_mid_batch") else None
                with tracing.process_span(self.stream, self.config.name, fresh):
                    self.handler(conn, Batch(fresh, crash_at, self.config.name))
            self._dead_letter_malformed(conn)
            self.faults.crash("consumer.crash_before_commit")
            store.save_checkpoint(conn, after)
        self._checkpoint = after
        for entry_id, _fields, _reason in self._letters:
            self._malformed.pop(entry_id, None)
        self._register(after.last_id)
        skipped = account_batch(
            self,
            self.metric_kind,
            self.config.name,
            entries,
            len(fresh),
            started,
            consumer=self.config.name,
            last_id=after.last_id,
        )
        return ConsumeResult(len(entries), len(fresh), skipped, len(self._letters))

    def _dedupe(
        self, conn: psycopg.Connection[Any], entries: list[engine.Entry], checkpoint: store.Checkpoint
    ) -> list[Record]:
        """Records not yet applied, advancing ``checkpoint`` past every entry read (in ``conn``'s transaction): see
        :func:`~unilog.progress.sort_batch`. A replayed dead letter is kept only if it is this consumer's and still
        held (its held row is taken in this transaction, so it is applied once)."""
        batch = sort_batch(self._rules, entries, checkpoint, self._malformed)
        self._letters = batch.letters
        if not batch.replays:
            return batch.fresh
        held = store.take_held(conn, self.config.name, [r.origin for r in batch.replays])
        return keep_held(batch.fresh, batch.replays, held)

    def _dead_letter_malformed(self, conn: psycopg.Connection[Any]) -> None:
        """Move this batch's malformed entries to the dead letters, before the checkpoint passes them: a crash
        before the commit may dead-letter one twice, never lose it. Each is held, so its replay is tried once."""
        for entry_id, fields, reason in self._letters:
            origin = fields.get(REPLAY_OF) or entry_id
            store.hold_letter(conn, self.config.name, self.stream, engine.to_str(origin))
            letter = self._engine().dead_letter_entry(
                self.stream, entry_id, fields, error=f"malformed: {reason}", consumer=self.config.name
            )
            self.malformed_total += 1
            metrics.dead_lettered(self.stream, self.config.name, "malformed")
            log.warning(
                "malformed entry dead-lettered",
                consumer=self.config.name,
                entry=engine.to_str(entry_id),
                dead_letter=letter,
                reason=reason,
            )

    def _check_not_rewound(self) -> None:
        """Raise :class:`StreamRewound` if the stream's last id has been below our checkpoint (Redis lost data) for
        longer than ``rewind_grace`` seconds."""
        last_id = self.checkpoint.last_id
        if last_id != "0-0":
            self._rewind.check(self._engine().last_generated_id(self.stream), last_id)

    def drain(self) -> int:
        """Consume until the stream has nothing after the checkpoint (burst mode); return records handled.

        A handler's failure is retried as in :meth:`run` (with back-off, then the poison policy)."""
        self.connect()
        total, backoff = 0, Backoff(self.max_backoff)
        while True:
            try:
                result = self.run_once(block_ms=-1)
            except Exception as exc:
                if not _is_handler_failure(exc):
                    raise
                log.warning("handler failed; rolled back, retrying", error=repr(exc), **self.label)
                self.on_handler_error(exc)
                backoff.wait(threading.Event())
                continue
            backoff.reset()
            total += result.handled
            if result.read == 0 and self._checkpoint is not None:
                return total

    # -- the loop ----------------------------------------------------------------------------------------------------

    def on_handler_error(self, exc: Exception) -> bool:
        """A handler error: the batch was rolled back; the loop retries it with back-off. After ``max_attempts``
        failures of the batch the next pass applies it record by record, and the poison policy settles the record
        that fails alone (:meth:`_poisoned`): a record is never skipped without a dead letter."""
        self.links.discard_failed_transaction()
        self._checkpoint = None
        return True


def _is_handler_failure(exc: BaseException) -> bool:
    """A handler's own failure: not the infrastructure's (retried as such), not a refusal no retry can fix (a
    missing privilege) and not one of unilog's verdicts."""
    return isinstance(exc, Exception) and not isinstance(exc, (UnilogError, *TRANSIENT, *FATAL))


def _describe(record: Record) -> str:
    """``entry <id> (producer:epoch:seq, action)``: how a log line or an error names one record."""
    pos = record.position
    where = "no unilog position" if pos is None else f"position {record.producer}:{pos[0]}:{pos[1]}"
    return f"record {record.id} ({where}, action {record.action!r})"
