"""The checkpoint consumer for asyncio code: ``async def handler(conn, records)`` on a psycopg ``AsyncConnection``.

The contract is :class:`~unilog.Consumer`'s, pass for pass: entries are read after the checkpoint (redis-py's
asyncio client, outside any transaction), then one transaction locks the checkpoint row, drops what was applied
already (:func:`~unilog.progress.sort_batch`, the rules the threaded consumer uses), awaits the handler, saves the
checkpoint and commits. A crash before the commit leaves nothing; a crash after it replays nothing. The same fault
points fire (``consumer.crash_mid_batch``, ``consumer.crash_before_commit``, ``consumer.crash_after_dead_letter``),
failures follow the same policy (:func:`unilog.runtime.failure_action`), a batch that keeps failing is applied
record by record and its poison record stops the consumer or is dead-lettered, and :meth:`AsyncConsumer.run`
finishes the pass in progress when its stop event is set.

It runs in any event loop: ``asyncio.create_task(consumer.run(stop))`` beside a web app's own tasks, or
``unilog consume module:async_handler`` (the command line sees the handler is a coroutine function).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import structlog

from . import metrics, tracing
from .config import Settings
from .consumer import Consumer, ConsumerConfig, ConsumeResult, _describe, _is_handler_failure
from .engine import Entry
from .engine.aio import AsyncRedisStreams
from .errors import MalformedEntry, PoisonRecord
from .faults import NO_FAULTS, Faults
from .progress import RewindWatch, Rules, keep_held, sort_batch
from .records import REPLAY_OF, Batch, Record, replay_owner
from .runtime import account_batch
from .runtime_async import AsyncWorker
from .store import Checkpoint
from .store import aio as store

log = structlog.get_logger(__name__)

AsyncHandler = Callable[[psycopg.AsyncConnection[Any], Batch], Awaitable[Any]]


class AsyncConsumer(AsyncWorker):
    """Runs an async handler over a stream with exactly-once effects. One task drives one consumer."""

    kind = "consumer"
    metric_kind = "checkpoint"

    def __init__(
        self, settings: Settings, config: ConsumerConfig, handler: AsyncHandler, *, faults: Faults = NO_FAULTS
    ):
        self.settings, self.config, self.handler, self.faults = settings, config, handler, faults
        self.stream = config.stream or settings.stream
        self.restart_after_crash = config.restart_after_crash
        self.max_backoff = config.max_backoff
        self.app_name = f"unilog-consumer-{config.name}"
        self.redis_timeout = config.block_ms / 1000 + 10  # must outlast a blocking read
        self._checkpoint: Checkpoint | None = None
        self._rewind = RewindWatch(config.name, self.stream, config.rewind_grace)
        owner = replay_owner("consumer", config.name).encode()
        self._rules = Rules(config.name, self.stream, owner, config.on_malformed, config.strict_start)
        self._malformed: dict[bytes, str] = {}
        self._failures: dict[str, int] = {}
        self._last_rewind_check = 0.0
        self.handled_total = self.skipped_total = self.dead_total = 0

    @property
    def label(self) -> dict[str, Any]:
        return {"consumer": self.config.name}

    def check_start(self) -> None:
        with Consumer(self.settings, self.config, _never) as checker:
            checker.connect()

    def forget(self) -> None:
        self._checkpoint = None

    async def _load_checkpoint(self, conn: psycopg.AsyncConnection[Any]) -> Checkpoint:
        if self._checkpoint is None:
            async with conn.transaction():
                checkpoint = await store.read_checkpoint(conn, self.config.name)
            if checkpoint is None:  # reset away meanwhile: create it again as at start-up
                await asyncio.to_thread(self.check_start)
                return await self._load_checkpoint(conn)
            self._checkpoint = checkpoint
        return self._checkpoint

    # -- one pass ----------------------------------------------------------------------------------------------------

    async def run_once(self, block_ms: int | None = None) -> ConsumeResult:
        """Read one batch after the checkpoint and apply it with the checkpoint in one transaction.

        ``block_ms`` overrides how long to wait for entries (0 or None: use the config; negative: don't wait)."""
        conn, api = await self._links()
        before = await self._load_checkpoint(conn)
        wait = self.config.block_ms if not block_ms else (None if block_ms < 0 else block_ms)
        entries = await api.read(self.stream, before.last_id, self.config.batch_size, wait)
        if not entries:
            await self._idle_checks(api, before)
            return ConsumeResult()
        if self._failures.get(before.last_id, 0) >= self.config.max_attempts:
            return await self._isolate(entries)
        try:
            return await self._apply_checked(entries, before)
        except Exception as exc:
            if _is_handler_failure(exc):
                self._failures = {before.last_id: self._failures.get(before.last_id, 0) + 1}
            raise

    async def _idle_checks(self, api: AsyncRedisStreams, checkpoint: Checkpoint) -> None:
        now = time.monotonic()
        if now - self._last_rewind_check >= 1.0 and checkpoint.last_id != "0-0":
            self._last_rewind_check = now
            self._rewind.check(await api.last_generated_id(self.stream), checkpoint.last_id)

    async def _apply_checked(self, entries: list[Entry], before: Checkpoint) -> ConsumeResult:
        """:meth:`_apply`, again without an entry a handler found malformed (dead-lettered instead)."""
        while True:
            try:
                return await self._apply(entries, before)
            except MalformedEntry as exc:
                known = exc.entry_id.encode()
                if self.config.on_malformed == "stop" or known in self._malformed:
                    raise
                self._malformed[known] = exc.reason

    async def _apply(self, entries: list[Entry], before: Checkpoint) -> ConsumeResult:
        """Apply one batch read after ``before`` with the checkpoint, in one transaction."""
        started = time.perf_counter()
        conn, api = await self._links()
        async with asyncio.timeout(self.config.pg_timeout), conn.transaction():
            current = await store.read_checkpoint(conn, self.config.name, lock=True)
            if current is None or current.last_id != before.last_id or current.positions != before.positions:
                self._checkpoint = None  # another copy of this consumer (or a reset) moved it: re-read
                return ConsumeResult()
            after = current.copy()
            batch = sort_batch(self._rules, entries, after, self._malformed)
            fresh = batch.fresh
            if batch.replays:
                held = await store.take_held(conn, self.config.name, [r.origin for r in batch.replays])
                fresh = keep_held(fresh, batch.replays, held)
            if fresh:
                crash_at = self.faults.pick(len(fresh)) if self.faults.fires("consumer.crash_mid_batch") else None
                with tracing.process_span(self.stream, self.config.name, fresh):
                    await self.handler(conn, Batch(fresh, crash_at, self.config.name))
            for entry_id, fields, reason in batch.letters:
                await self._dead_letter(conn, api, (entry_id, fields), f"malformed: {reason}")
                metrics.dead_lettered(self.stream, self.config.name, "malformed")
            self.faults.crash("consumer.crash_before_commit")
            await store.save_checkpoint(conn, after)
        return await self._committed(api, entries, after, len(fresh), len(batch.letters), started)

    async def _committed(
        self, api: AsyncRedisStreams, entries: list[Entry], after: Checkpoint, handled: int, dead: int, started: float
    ) -> ConsumeResult:
        self._checkpoint = after
        for entry_id, _fields in entries:
            self._malformed.pop(entry_id, None)
        if self.config.register:
            await api.register(self.stream, self.config.name, after.last_id)
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
        """The batch failed ``max_attempts`` times: apply its records one per transaction; the one that fails alone
        stops the consumer (:class:`PoisonRecord`) or is dead-lettered, by ``on_poison``."""
        log.warning("batch keeps failing; applying its records one by one", consumer=self.config.name)
        total = ConsumeResult()
        for entry in entries:
            before = self._checkpoint
            if before is None:
                break  # moved underneath: read again from there
            try:
                total += await self._apply_checked([entry], before)
            except Exception as exc:
                if not _is_handler_failure(exc):
                    raise
                total += await self._poisoned(entry, before, exc)
        self._failures.clear()
        return total

    async def _poisoned(self, entry: Entry, before: Checkpoint, exc: Exception) -> ConsumeResult:
        record = Record(self.stream, *entry)
        if self.config.on_poison == "stop":
            raise PoisonRecord(
                f"consumer {self.config.name!r} on stream {self.stream!r}: {_describe(record)} failed its handler "
                f"alone after {self.config.max_attempts} failed attempts at its batch: {exc!r}. The records before it "
                "are applied; fix the handler and restart, or run with --on-poison dead-letter",
                record.id,
            ) from exc
        started = time.perf_counter()
        conn, api = await self._links()
        async with asyncio.timeout(self.config.pg_timeout), conn.transaction():
            current = await store.read_checkpoint(conn, self.config.name, lock=True)
            if current is None or current.last_id != before.last_id or current.positions != before.positions:
                self._checkpoint = None
                return ConsumeResult()
            after = current.copy()
            sort_batch(self._rules, [entry], after, {})  # moves the checkpoint past it
            await self._dead_letter(conn, api, entry, repr(exc))
            self.faults.crash("consumer.crash_after_dead_letter")
            await store.save_checkpoint(conn, after)
        metrics.dead_lettered(self.stream, self.config.name, "poison")
        return await self._committed(api, [entry], after, 0, 1, started)

    async def _dead_letter(
        self, conn: psycopg.AsyncConnection[Any], api: AsyncRedisStreams, entry: Entry, error: str
    ) -> None:
        """Hold the record (so a replay of it is applied once) and copy it to the dead letters, in this transaction;
        a crash before the commit may dead-letter it twice, never lose it."""
        entry_id, fields = entry
        origin = fields.get(REPLAY_OF) or entry_id
        await store.hold_letter(conn, self.config.name, self.stream, origin.decode())
        letter = await api.dead_letter_entry(self.stream, entry_id, fields, error=error, consumer=self.config.name)
        self.dead_total += 1
        log.error(
            "record dead-lettered", consumer=self.config.name, entry=entry_id.decode(), dead_letter=letter, error=error
        )

    # -- modes -------------------------------------------------------------------------------------------------------

    def on_handler_error(self, exc: Exception) -> bool:
        """The batch was rolled back (the transaction block exited with the error): re-read the checkpoint and let
        the loop retry it with back-off."""
        self._checkpoint = None
        return _is_handler_failure(exc)

    async def drain(self) -> int:
        """Consume until nothing follows the checkpoint (burst mode); return records handled. A failing handler is
        retried with back-off, then the poison policy settles the record."""
        await self.connect()
        total, delay = 0, 0.1
        while True:
            try:
                result = await self.run_once(block_ms=-1)
            except Exception as exc:
                if not _is_handler_failure(exc):
                    raise
                log.warning("handler failed; rolled back, retrying", error=repr(exc), **self.label)
                self.on_handler_error(exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_backoff)
                continue
            delay = 0.1
            total += result.handled
            if result.read == 0 and self._checkpoint is not None:
                return total


def _never(_conn: Any, _records: Any) -> None:
    raise AssertionError("the start-up check applies nothing")
