"""Checkpoint consumers: user handlers whose effects and checkpoint commit in one Postgres transaction.

For each batch the consumer reads entries after its checkpoint from Redis (blocking ``XREAD`` outside any
transaction, so an idle consumer holds no transaction open), then in one transaction: locks its checkpoint row,
drops entries whose (producer, epoch, seq) position it already applied (double-sends, re-sends after a streamer
crash), calls the handler with the rest, saves the new checkpoint and commits.

Guarantee: a crash at any point before the commit leaves neither effect nor checkpoint, so the batch is replayed;
a crash after it replays nothing. Each record's effect is applied exactly once, as long as the handler's effects
live in the transaction it is given. The row lock makes two copies of one consumer apply batches one after the
other, never the same batch twice. The same fault points fire in both faces (``consumer.crash_mid_batch``,
``consumer.crash_before_commit``, ``consumer.crash_after_dead_letter``).

One source, two faces: this module is written once, as asyncio code under ``_async/``, and generated for threads
under ``_sync/`` (see :mod:`unilog.consume`).
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import structlog

from ... import metrics, tracing
from ...config import Settings
from ...engine.aio import AsyncRedisStreams, Entry
from ...errors import ConfigurationError, MalformedEntry, NotReplicated, UnilogError
from ...faults import NO_FAULTS, Faults
from ...runtime._async.loop import AsyncLinks, AsyncWorker
from ...runtime.policy import account_batch
from ...store import aio as store
from ...store.checkpoints import Checkpoint
from ...wire import to_str
from ..base import ConsumerConfig, ConsumeResult, describe, is_handler_failure, poison_stop
from ..progress import RewindWatch, Rules, keep_held, sort_batch
from ..records import REPLAY_OF, AsyncHandler, Batch, Record, replay_owner
from ..typed import typed_handler

log = structlog.get_logger("unilog.consumer")


class AsyncConsumer(AsyncWorker):
    """Runs a handler over a stream with exactly-once effects. One thread (or task) drives one consumer."""

    kind = "consumer"
    metric_kind = "checkpoint"  # the partition worker's consumers say "partition"

    def __init__(
        self, settings: Settings, config: ConsumerConfig, handler: AsyncHandler, *, faults: Faults = NO_FAULTS
    ) -> None:
        if config.several:
            raise ConfigurationError(
                f"consumer {config.name!r}: a config with streams or stream_prefix is a MultiConsumer's "
                "(AsyncMultiConsumer's), not a single-stream consumer's"
            )
        self.settings, self.config, self.faults = settings, config, faults
        self.handler = typed_handler(handler)  # a handler annotated with record types is handed instances
        self.stream = config.stream or settings.stream
        self.restart_after_crash = config.restart_after_crash
        self.max_backoff = config.max_backoff
        self.links = AsyncLinks(
            settings,
            app_name=f"unilog-consumer-{config.name}",
            pg_timeout=config.pg_timeout,
            redis_timeout=config.block_ms / 1000 + 10,  # must outlast a blocking read
            on_pg_connect=self._forget_checkpoint,
        )
        self._checkpoint: Checkpoint | None = None
        self._rewind = RewindWatch(config.name, self.stream, config.rewind_grace)
        owner = replay_owner("consumer", config.name).encode()
        self._rules = Rules(config.name, self.stream, owner, config.on_malformed, config.strict_start, config.numbers)
        self._registered_at = 0.0
        self._last_rewind_check = 0.0
        self._malformed: dict[bytes, str] = {}  # entries found malformed by a handler: dead-lettered next pass
        self._failures: dict[str, int] = {}  # handler failures of the batch after this checkpoint id
        self._unconfirmed: dict[bytes, str] = {}  # entry id -> its dead letter too few replicas acknowledged
        self.handled_total = self.skipped_total = self.malformed_total = self.dead_total = 0

    @property
    def label(self) -> dict[str, Any]:
        return {"consumer": self.config.name}

    def describe(self) -> dict[str, Any]:
        return {**self.settings.describe(), "stream": self.stream}

    def totals(self) -> dict[str, Any]:
        return {"handled": self.handled_total}

    def _forget_checkpoint(self, _conn: object = None) -> None:
        self._checkpoint = None

    def forget(self) -> None:
        self._checkpoint = None

    async def close(self) -> None:
        """Close connections; the committed checkpoint is all that carries over."""
        self.forget()
        await self.links.close()

    @property
    def checkpoint(self) -> Checkpoint:
        """The last committed checkpoint as this consumer knows it (loaded by :meth:`connect` and every pass)."""
        if self._checkpoint is None:
            raise UnilogError(f"consumer {self.config.name!r}: its checkpoint is read on connect() and each pass")
        return self._checkpoint

    async def connect(self) -> None:
        """Connect to both servers, load the checkpoint, register it for retention and check Redis did not rewind.

        Raises a one-line-worthy error if a server is unreachable or data was lost.
        """
        api = await self.links.redis()
        others = await api.missing_stream(self.stream)
        if others is not None:  # a typo in a stream name would otherwise wait in silence, forever
            log.warning(
                "the stream does not exist yet; waiting for its first entry",
                consumer=self.config.name,
                stream=self.stream,
                existing_streams=others,
            )
        checkpoint = await self.load_checkpoint()
        await self._register(checkpoint.last_id, force=True)
        await self._check_not_rewound(checkpoint)
        self._last_rewind_check = time.monotonic()

    async def load_checkpoint(self) -> Checkpoint:
        """The last committed checkpoint (read from Postgres, or created at the stream's start, if not known)."""
        if self._checkpoint is None:
            conn = await self.links.pg()
            async with conn.transaction():
                checkpoint = await store.ensure_checkpoint(conn, self.config.name, self.stream)
            if checkpoint.stream != self.stream:
                raise ConfigurationError(
                    f"consumer {self.config.name!r} has a checkpoint on stream {checkpoint.stream!r}, not "
                    f"{self.stream!r}: use another name or reset it"
                )
            self._checkpoint = checkpoint
        return self._checkpoint

    async def _register(self, last_id: str, *, force: bool = False) -> None:
        """Record the checkpoint in the retention registry, at most every ``register_interval`` seconds: an older
        value only holds back more of the stream (the safe direction), and each write is an fsync'd round trip."""
        if not self.config.register:
            return
        now = time.monotonic()
        if force or now - self._registered_at >= self.config.register_interval:
            await (await self.links.redis()).register(self.stream, self.config.name, last_id)
            self._registered_at = now

    async def _check_not_rewound(self, checkpoint: Checkpoint) -> None:
        """Raise :class:`StreamRewound` if the stream's last id has been below our checkpoint (Redis lost data) for
        longer than ``rewind_grace`` seconds."""
        if checkpoint.last_id != "0-0":
            api = await self.links.redis()
            self._rewind.check(await api.last_generated_id(self.stream), checkpoint.last_id)

    async def _idle_checks(self, checkpoint: Checkpoint) -> None:
        """While idle, look for a rewound stream, at most once a second (no gap shows until new entries arrive)."""
        now = time.monotonic()
        if now - self._last_rewind_check >= 1.0:
            self._last_rewind_check = now
            await self._check_not_rewound(checkpoint)

    # -- one pass ----------------------------------------------------------------------------------------------------

    async def run_once(self, block_ms: int | None = None) -> ConsumeResult:
        """Read one batch after the checkpoint and apply it with the checkpoint in one transaction.

        ``block_ms`` overrides how long to wait for entries (0 or None: use the config; negative: don't wait).
        """
        wait = self.config.block_ms if not block_ms else (None if block_ms < 0 else block_ms)
        before = await self.load_checkpoint()
        entries = await (await self.links.redis()).read(self.stream, before.last_id, self.config.batch_size, wait)
        if not entries:
            await self._idle_checks(before)
            return ConsumeResult()
        if self._failures.get(before.last_id, 0) >= self.config.max_attempts:
            return await self._isolate(entries)
        try:
            return await self._apply_checked(entries, before)
        except Exception as exc:
            if is_handler_failure(exc):
                self._failures = {before.last_id: self._failures.get(before.last_id, 0) + 1}
                await self.links.discard_failed_transaction()
            raise  # the loop rolls back, backs off and reads the batch again

    async def _apply_checked(self, entries: list[Entry], before: Checkpoint) -> ConsumeResult:
        """:meth:`_apply`, again without an entry a handler found malformed (dead-lettered instead), unless the
        policy is to stop."""
        while True:
            try:
                return await self._apply(entries, before)
            except MalformedEntry as exc:  # a handler read a record whose data is not JSON: nothing was committed
                known = exc.entry_id.encode()
                if self.config.on_malformed == "stop" or known in self._malformed:
                    raise
                self._malformed[known] = exc.reason  # apply the batch again, that entry dead-lettered

    async def _apply(self, entries: list[Entry], before: Checkpoint) -> ConsumeResult:
        """Apply one batch read after ``before`` with the checkpoint, in one transaction."""
        started = time.perf_counter()
        conn, api = await self.links.pg(), await self.links.redis()
        async with store.deadline(conn, self.config.pg_timeout), conn.transaction():
            current = await store.lock_checkpoint(conn, self.config.name)
            if current is None or current.last_id != before.last_id or current.positions != before.positions:
                # another copy of this consumer (or a reset) moved the checkpoint: drop what we read, reload
                self._checkpoint = None
                log.info("checkpoint moved underneath; re-reading", consumer=self.config.name)
                return ConsumeResult()
            after = current.copy()
            batch = sort_batch(self._rules, entries, after, self._malformed)
            fresh = batch.fresh
            if batch.replays:  # a replayed dead letter is applied only if this consumer still holds it
                held = await store.take_held(conn, self.config.name, [r.origin for r in batch.replays])
                fresh = keep_held(fresh, batch.replays, held)
            if fresh:
                crash_at = self.faults.pick(len(fresh)) if self.faults.fires("consumer.crash_mid_batch") else None
                with tracing.process_span(self.stream, self.config.name, fresh):
                    await self.handler(conn, Batch(fresh, crash_at, self.config.name))
            await self._dead_letter_malformed(conn, api, batch.letters)
            self.faults.crash("consumer.crash_before_commit")
            await store.save_checkpoint(conn, after)
        for entry_id, _fields, _reason in batch.letters:
            self._malformed.pop(entry_id, None)
        return await self._committed(entries, after, len(fresh), len(batch.letters), started)

    async def _committed(
        self, entries: list[Entry], after: Checkpoint, handled: int, dead: int, started: float
    ) -> ConsumeResult:
        """A batch committed: remember the checkpoint, register it, count the batch."""
        self._checkpoint = after
        await self._register(after.last_id)
        skipped = account_batch(
            self,
            self.metric_kind,
            self.config.name,
            entries,
            handled,
            started,
            consumer=self.config.name,
            last_id=after.last_id,
        )
        return ConsumeResult(len(entries), handled, skipped, dead)

    # -- poison records ----------------------------------------------------------------------------------------------

    async def _isolate(self, entries: list[Entry]) -> ConsumeResult:
        """The batch failed ``max_attempts`` times: apply its records one per transaction to find the one that
        fails, and apply the poison policy to it (:meth:`_poisoned`)."""
        log.warning(
            "batch keeps failing; applying its records one by one",
            consumer=self.config.name,
            first=to_str(entries[0][0]),
            records=len(entries),
        )
        total = ConsumeResult()
        for entry in entries:
            before = await self.load_checkpoint()
            try:
                total += await self._apply_checked([entry], before)
            except Exception as exc:
                if not is_handler_failure(exc):
                    raise
                await self.links.discard_failed_transaction()
                total += await self._poisoned(entry, before, exc)
            if self._checkpoint is None:  # moved underneath (another copy, a reset): read again from there
                break
        self._failures.clear()
        return total

    async def _poisoned(self, entry: Entry, before: Checkpoint, exc: Exception) -> ConsumeResult:
        """``entry`` failed alone: stop (raise :class:`PoisonRecord`) or dead-letter it and move the checkpoint
        past it, in one transaction with the row that lets a replay of it be applied once."""
        record = Record(self.stream, *entry, self.config.numbers)
        if self.config.on_poison == "stop":
            raise poison_stop(self.config, self.stream, record, exc) from exc
        conn, api = await self.links.pg(), await self.links.redis()
        async with store.deadline(conn, self.config.pg_timeout), conn.transaction():
            current = await store.lock_checkpoint(conn, self.config.name)
            if current is None or current.last_id != before.last_id or current.positions != before.positions:
                self._checkpoint = None
                return ConsumeResult()
            after = current.copy()
            batch = sort_batch(self._rules, [entry], after, {})  # moves the checkpoint past it
            if batch.replays:  # a replay's held row is taken: its letter is held again below, under this name
                await store.take_held(conn, self.config.name, [r.origin for r in batch.replays])
            letter = await self._dead_letter(  # attempts: the batch's failures, and its own
                conn, api, entry, repr(exc), attempts=self.config.max_attempts + 1
            )
            # a crash here leaves a dead letter for a record still ahead of the checkpoint: it is retried, and a
            # replay of that letter is skipped unless the retry dead-letters it again (then one replay applies)
            self.faults.crash("consumer.crash_after_dead_letter")
            await store.save_checkpoint(conn, after)
        self._checkpoint = after
        await self._register(after.last_id)
        self.dead_total += 1
        metrics.dead_lettered(self.stream, self.config.name, "poison")
        where = describe(record)
        log.error("record dead-lettered", consumer=self.config.name, record=where, dead_letter=letter, error=repr(exc))
        return ConsumeResult(1, 0, 0, 1)

    async def _dead_letter(
        self, conn: psycopg.AsyncConnection[Any], api: AsyncRedisStreams, entry: Entry, error: str, attempts: int = 1
    ) -> str:
        """:func:`write_dead_letter` under this consumer's name, on its stream."""
        return await write_dead_letter(
            conn, api, self.config, self._unconfirmed, self.config.name, self.stream, entry, error, attempts
        )

    async def _dead_letter_malformed(
        self, conn: psycopg.AsyncConnection[Any], api: AsyncRedisStreams, letters: list[tuple[bytes, Any, str]]
    ) -> None:
        """Move a batch's malformed entries to the dead letters, with their reasons (see :meth:`_dead_letter`)."""
        for entry_id, fields, reason in letters:
            letter = await self._dead_letter(conn, api, (entry_id, fields), f"malformed: {reason}")
            self.malformed_total += 1
            metrics.dead_lettered(self.stream, self.config.name, "malformed")
            log.warning(
                "malformed entry dead-lettered",
                consumer=self.config.name,
                entry=to_str(entry_id),
                dead_letter=letter,
                reason=reason,
            )

    # -- modes -------------------------------------------------------------------------------------------------------

    def is_handler_failure(self, exc: Exception) -> bool:
        """A handler error (:func:`unilog.consume.base.is_handler_failure`): the batch was rolled back; the loop
        retries it with back-off. After ``max_attempts`` failures of the batch the next pass applies it record by
        record, and the poison policy settles the record that fails alone (:meth:`_poisoned`): a record is never
        skipped without a dead letter."""
        return is_handler_failure(exc)

    def after_handler_failure(self, exc: Exception) -> None:
        """The rolled-back batch's checkpoint is read again from Postgres by the retry."""
        self._checkpoint = None

    async def drain_pass(self) -> tuple[int, bool]:
        """One pass of :meth:`drain` (burst mode: consume until the stream has nothing after the checkpoint)."""
        result = await self.run_once(block_ms=-1)
        return result.handled, result.read == 0 and self._checkpoint is not None


async def write_dead_letter(
    conn: psycopg.AsyncConnection[Any],
    api: AsyncRedisStreams,
    config: ConsumerConfig,
    unconfirmed: dict[bytes, str],
    row: str,
    stream: str,
    entry: Entry,
    error: str,
    attempts: int = 1,
    label: str | None = None,
) -> str:
    """Hold the record under checkpoint ``row`` (so a replay of it is applied once) and copy it to ``stream``'s dead
    letters, in this transaction, before the checkpoint passes it: a crash before the commit may dead-letter it twice,
    never lose it. Returns the dead letter's id. Both the single-stream consumer and each stream of a several-streams
    one (its row ``<name>:<stream>``; ``label``, the consumer's bounded ``stream`` label for the metric) write their
    letters here.

    With replicas wanted (``wait_replicas``), raise :class:`~unilog.errors.NotReplicated` unless enough acknowledged
    the letter: the transaction rolls back (no checkpoint past the record, no held row) and the record is retried, its
    next letter replacing this one (one copy, not one per attempt; ``unconfirmed`` remembers it by entry id)."""
    entry_id, fields = entry
    origin = fields.get(REPLAY_OF) or entry_id
    await store.hold_letter(conn, row, stream, to_str(origin))
    written = await api.dead_letter_entry(
        stream,
        entry_id,
        fields,
        error=error,
        consumer=row,
        attempts=attempts,
        wait_replicas=config.wait_replicas,
        wait_timeout_ms=config.wait_timeout_ms,
        replaces=unconfirmed.pop(entry_id, None),
    )
    if not written.confirmed:
        unconfirmed[entry_id] = written.id
        metrics.letter_unreplicated(label or stream, config.name)
        raise NotReplicated(
            f"consumer {row!r} on stream {stream!r}: dead letter {written.id} of entry {to_str(entry_id)} was "
            f"acknowledged by {written.replicas} of {written.wanted} replicas within {config.wait_timeout_ms} ms; the "
            "checkpoint stays before the record, which is retried (a Redis without replicas: --wait-replicas 0)"
        )
    return written.id
