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

import importlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import psycopg
import structlog

from . import engine, store
from .config import Settings, validate_stream_name
from .errors import (
    ConfigurationError,
    HandlerNotFound,
    InjectedCrash,
    MalformedEntry,
    StreamGap,
    StreamRewound,
)
from .faults import NO_FAULTS, Faults
from .runtime import Links, Worker

log = structlog.get_logger(__name__)


_NO_DATA = object()


class Record:
    """One log record as a handler sees it. ``data`` is decoded from JSON on first access.

    ``producer`` ('' for entries not written by a unilog streamer) and ``position``, the record's (epoch, seq)
    within its producer (None for entries without unilog metadata), are read when the record is made: every
    consumer needs them to deduplicate, so they are plain attributes (this class is the consumers' hot path).
    """

    __slots__ = ("_data", "_fields", "_id", "position", "producer", "stream")

    def __init__(self, stream: str, entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        self.stream = stream
        self._id = entry_id
        self._fields = fields
        self._data: Any = _NO_DATA
        try:
            producer = fields.get(b"producer")
            self.producer: str = producer.decode() if producer else ""
            seq = fields.get(b"seq")
            self.position: tuple[int, int] | None = None if seq is None else (int(fields.get(b"epoch", b"0")), int(seq))
        except ValueError as exc:  # not integers, not UTF-8: another writer's entry, or a damaged one
            raise MalformedEntry(stream, entry_id.decode(errors="replace"), f"bad position fields ({exc})") from None

    def _text(self, name: bytes) -> str | None:
        value = self._fields.get(name)
        return None if value is None else value.decode()

    @property
    def id(self) -> str:
        """The stream entry id, like ``1700000000000-0``."""
        return self._id.decode()

    @property
    def data(self) -> Any:
        """The record's payload, decoded from the entry's ``data`` field (None if it has none)."""
        if self._data is _NO_DATA:
            raw = self._fields.get(b"data")
            try:
                self._data = None if raw is None else json.loads(raw)
            except ValueError as exc:  # the consumer dead-letters the entry (or stops): see MalformedEntry
                raise MalformedEntry(self.stream, self.id, f"data is not JSON ({exc})") from None
        return self._data

    @property
    def raw_data(self) -> bytes | None:
        """The payload's JSON text as stored in the stream."""
        return self._fields.get(b"data")

    @property
    def action(self) -> str | None:
        return self._text(b"action")

    @property
    def object(self) -> str | None:
        return self._text(b"object")

    @property
    def key(self) -> str | None:
        return self._text(b"key")

    @property
    def seq(self) -> int | None:
        pos = self.position
        return None if pos is None else pos[1]

    @property
    def created_ms(self) -> int | None:
        value = self._fields.get(b"created")
        return None if value is None else int(value)

    def __repr__(self) -> str:
        return f"Record(stream={self.stream!r}, id={self.id!r}, action={self.action!r}, position={self.position})"


Handler = Callable[[psycopg.Connection[Any], Sequence[Record]], Any]


class Batch(Sequence[Record]):
    """The records handed to a handler; iterating it is where an injected mid-batch crash happens.

    ``consumer`` names who is applying them: the checkpoint consumer's name, or the group's.
    """

    def __init__(self, records: list[Record], crash_at: int | None = None, consumer: str = "") -> None:
        self._records = records
        self._crash_at = crash_at
        self.consumer = consumer

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, index: Any) -> Any:
        return self._records[index]

    def __iter__(self) -> Iterator[Record]:
        for i, record in enumerate(self._records):
            if i == self._crash_at:
                raise InjectedCrash("consumer.crash_mid_batch")
            yield record


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
    integers): ``"dead-letter"`` moves it to ``<stream>:dlq`` with the reason and goes on past it in the same
    transaction as the rest of its batch; ``"stop"`` raises :class:`~unilog.errors.MalformedEntry`. Entries with
    JSON ``data`` but no unilog position (another service's ``XADD``) are records: applied in stream order, once
    per checkpoint, but never deduplicated (unilog cannot know whether their writer sent one twice).
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

    def __post_init__(self) -> None:
        if not self.name or not self.name.strip():
            raise ValueError("a consumer needs a non-empty name")
        if self.stream is not None:
            validate_stream_name(self.stream)
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        check_malformed_policy(self.on_malformed)


MALFORMED_POLICIES = ("dead-letter", "stop")


def check_malformed_policy(policy: str) -> None:
    if policy not in MALFORMED_POLICIES:
        raise ValueError(f"on_malformed must be one of {', '.join(MALFORMED_POLICIES)}, not {policy!r}")


@dataclass(frozen=True)
class ConsumeResult:
    """What one pass did: entries read, records handed to the handler, duplicates skipped."""

    read: int = 0
    handled: int = 0
    skipped: int = 0


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
        self._registered_at = 0.0
        self._malformed: dict[bytes, str] = {}  # entries found malformed by a handler: dead-lettered next pass
        self._letters: list[tuple[bytes, dict[bytes, bytes], str]] = []  # malformed entries of the batch at hand
        self.malformed_total = 0

    kind = "consumer"

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
        while True:
            try:
                return self._apply(entries, before)
            except MalformedEntry as exc:  # a handler read a record whose data is not JSON: nothing was committed
                known = exc.entry_id.encode()
                if self.config.on_malformed == "stop" or known in self._malformed:
                    raise
                self._malformed[known] = exc.reason  # apply the batch again, that entry dead-lettered

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
            fresh = self._dedupe(entries, after)
            if fresh:
                crash_at = self.faults.pick(len(fresh)) if self.faults.fires("consumer.crash_mid_batch") else None
                self.handler(conn, Batch(fresh, crash_at, self.config.name))
            self._dead_letter_malformed()
            self.faults.crash("consumer.crash_before_commit")
            store.save_checkpoint(conn, after)
        self._checkpoint = after
        for entry_id, _fields, _reason in self._letters:
            self._malformed.pop(entry_id, None)
        self._register(after.last_id)
        skipped = len(entries) - len(fresh)
        self.handled_total += len(fresh)
        self.skipped_total += skipped
        log.info(
            "batch consumed",
            consumer=self.config.name,
            records=len(fresh),
            skipped=skipped,
            last_id=after.last_id,
            ms=round((time.perf_counter() - started) * 1000, 2),
        )
        return ConsumeResult(len(entries), len(fresh), skipped)

    def _dedupe(self, entries: list[engine.Entry], checkpoint: store.Checkpoint) -> list[Record]:
        """Records not yet applied, advancing ``checkpoint`` past every entry read.

        Raises :class:`StreamGap` when a producer's positions jump past the checkpoint: the entries in between
        were trimmed or lost, and applying what follows would silently skip them.
        """
        fresh: list[Record] = []
        positions = checkpoint.positions
        self._letters = []
        for entry_id, fields in entries:
            try:
                if self._malformed and entry_id in self._malformed:
                    raise MalformedEntry(self.stream, engine.to_str(entry_id), self._malformed[entry_id])
                record = Record(self.stream, entry_id, fields)
            except MalformedEntry as exc:
                if self.config.on_malformed == "stop":
                    raise
                self._letters.append((entry_id, fields, exc.reason))
                continue
            pos = record.position
            if pos is not None:
                last = positions.get(record.producer)
                if last is not None and pos <= last:
                    continue
                self._check_contiguous(record, last, pos)
                positions[record.producer] = pos
            fresh.append(record)
        checkpoint.last_id = entries[-1][0].decode()
        return fresh

    def _dead_letter_malformed(self) -> None:
        """Move this batch's malformed entries to the dead letters, before the checkpoint passes them: a crash
        before the commit may dead-letter one twice, never lose it."""
        for entry_id, fields, reason in self._letters:
            letter = self._engine().dead_letter_entry(
                self.stream, entry_id, fields, error=f"malformed: {reason}", consumer=self.config.name
            )
            self.malformed_total += 1
            log.warning(
                "malformed entry dead-lettered",
                consumer=self.config.name,
                entry=engine.to_str(entry_id),
                dead_letter=letter,
                reason=reason,
            )

    def _check_contiguous(self, record: Record, last: tuple[int, int] | None, pos: tuple[int, int]) -> None:
        expected = 1 if last is None or pos[0] != last[0] else last[1] + 1
        if pos[1] == expected:
            return
        if last is None and self.config.strict_start:
            raise StreamGap(
                f"consumer {self.config.name!r} on stream {self.stream!r}: producer {record.producer!r} starts at "
                f"position {pos[0]}:{pos[1]}, not {pos[0]}:1: its earlier records were trimmed from the stream, so a "
                "rebuild from the stream alone would miss them (rebuild from the archive instead)"
            )
        if last is None:
            # a consumer that never saw this producer starts wherever the retained stream starts
            log.warning(
                "history before this position is not in the stream",
                consumer=self.config.name,
                producer=record.producer,
                position=pos,
            )
            return
        raise StreamGap(
            f"consumer {self.config.name!r} on stream {self.stream!r}: producer {record.producer!r} positions "
            f"{pos[0]}:{expected}..{pos[0]}:{pos[1] - 1} are missing before entry {record.id} (checkpoint at "
            f"{last[0]}:{last[1]}): they were trimmed or Redis lost them. Stopping instead of skipping them; "
            "repair this consumer with `unilog reconcile` (or rebuild it) and reset its checkpoint"
        )

    def _check_not_rewound(self) -> None:
        """Raise :class:`StreamRewound` if the stream's last id is below our checkpoint (Redis lost data)."""
        cp = self.checkpoint
        if cp.last_id == "0-0":
            return
        top = self._engine().last_generated_id(self.stream)
        if top is None or engine.id_tuple(top) < engine.id_tuple(cp.last_id):
            raise StreamRewound(
                f"consumer {self.config.name!r}: stream {self.stream!r} ends at {top or 'nothing (no such key)'}, "
                f"below this consumer's checkpoint {cp.last_id}: Redis lost entries it had confirmed (restart without "
                "persistence, truncated AOF or failover). See the README's recovery steps"
            )

    def drain(self) -> int:
        """Consume until the stream has nothing after the checkpoint (burst mode); return records handled."""
        self.connect()
        total = 0
        while True:
            result = self.run_once(block_ms=-1)
            total += result.handled
            if result.read == 0 and self._checkpoint is not None:
                return total

    # -- the loop ----------------------------------------------------------------------------------------------------

    def on_handler_error(self, exc: Exception) -> bool:
        """A handler error: the batch was rolled back; the loop retries it with back-off (it is never skipped)."""
        self.links.discard_failed_transaction()
        self._checkpoint = None
        return True


def load_object(ref: str) -> Any:
    """Import ``module:attribute`` (or ``module.attribute``) and return the attribute."""
    module_name, sep, attr = ref.partition(":")
    if not sep:
        module_name, _, attr = ref.rpartition(".")
    if not module_name or not attr:
        raise HandlerNotFound(f"{ref!r} must look like package.module:name")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise HandlerNotFound(f"cannot import {module_name!r} for {ref!r}: {exc}") from None
    if not hasattr(module, attr):
        raise HandlerNotFound(f"{module_name!r} has no {attr!r} ({ref!r})")
    return getattr(module, attr)


def load_handler(ref: str) -> Handler:
    """Import ``module:function`` (or ``module.function``) and return the handler."""
    handler = load_object(ref)
    if not callable(handler):
        raise HandlerNotFound(f"{ref!r} is not callable: a handler is a function (conn, records)")
    return cast(Handler, handler)


def positions_through(api: engine.RedisStreams, stream: str, last_id: str | None) -> dict[str, tuple[int, int]]:
    """The highest (epoch, seq) per producer among the entries up to ``last_id`` (None: the whole stream)."""
    positions: dict[str, tuple[int, int]] = {}
    for entry_id, fields in api.entries(stream, "-", last_id or "+"):
        record = Record(stream, entry_id, fields)
        pos = record.position
        if pos is not None and pos > positions.get(record.producer, (0, 0)):
            positions[record.producer] = pos
    return positions


def reset_checkpoint(
    conn: psycopg.Connection[Any],
    api: engine.RedisStreams,
    name: str,
    stream: str,
    to: str,
    *,
    reset_state: Callable[[psycopg.Connection[Any], str], Any] | None = None,
) -> store.Checkpoint:
    """Move consumer ``name``'s checkpoint to ``beginning``, ``end`` or a stream id, in one transaction.

    The positions per producer are recomputed from the stream so deduplication stays right: after a reset to an id,
    entries after it are applied again; before it, skipped. ``reset_state(conn, name)`` (for a rebuild) clears the
    consumer's own state in the same transaction, so state and checkpoint never disagree. A running copy of the
    consumer notices the moved checkpoint and follows it.
    """
    if to == "beginning":
        last_id, positions = "0-0", {}
    elif to == "end":
        last_id = api.last_generated_id(stream) or "0-0"
        positions = positions_through(api, stream, None)
    else:
        try:
            engine.id_tuple(to)
        except ValueError:
            raise ConfigurationError(
                f"--to must be beginning, end or a stream id like 1700000000000-0, not {to!r}"
            ) from None
        last_id, positions = to, positions_through(api, stream, to)
    with conn.transaction():
        store.ensure_checkpoint(conn, name, stream)
        store.lock_checkpoint(conn, name)
        if reset_state is not None:
            reset_state(conn, name)
        checkpoint = store.Checkpoint(name, stream, last_id, positions)
        store.save_checkpoint(conn, checkpoint)
    api.register(stream, name, last_id)
    log.info("checkpoint reset", consumer=name, stream=stream, to=to, last_id=last_id)
    return checkpoint
