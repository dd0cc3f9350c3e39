"""The group worker for asyncio code: ``async def handler(conn, records)`` on a psycopg ``AsyncConnection``.

:class:`~unilog.GroupConsumer`'s contract, pass for pass (see :mod:`unilog.group`): the worker's own pending entries
first after a (re)connect, idle entries claimed from other workers every ``claim_interval``, then new ones; in one
transaction the records' identities are claimed in ``unilog_processed`` (a redelivered or double-sent record finds
its identity and is skipped, by :func:`unilog.group.candidates`) and the handler is awaited; ``XACK`` after the
commit. A failing batch is retried record by record; a record that keeps failing is dead-lettered after
``max_deliveries`` attempts. Fault points: ``consumer.crash_mid_batch``, ``consumer.crash_before_commit``,
``group.crash_before_ack``. Workers of one group may mix threaded and asyncio processes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog

from . import metrics, tracing
from .config import Settings
from .consume.base import is_handler_failure as _is_handler_failure
from .consumer_async import _never
from .engine import Entry
from .errors import MalformedEntry
from .faults import NO_FAULTS, Faults
from .group import GroupConfig, GroupConsumer, GroupResult, candidates, default_worker_name
from .records import REPLAY_FOR, AsyncHandler, Batch, Record, replay_owner
from .runtime import FATAL, TRANSIENT, account_batch
from .runtime_async import AsyncLinks, AsyncWorker
from .store import aio as store

log = structlog.get_logger(__name__)


class AsyncGroupConsumer(AsyncWorker):
    """One asyncio worker of a consumer group. One task drives one worker."""

    kind = "group worker"

    def __init__(self, settings: Settings, config: GroupConfig, handler: AsyncHandler, *, faults: Faults = NO_FAULTS):
        self.settings, self.config, self.handler, self.faults = settings, config, handler, faults
        self.stream = config.stream or settings.stream
        self.worker = config.worker or default_worker_name()
        self._owner = replay_owner("group", config.group).encode()
        self.restart_after_crash = config.restart_after_crash
        self.max_backoff = config.max_backoff
        self.links = AsyncLinks(
            settings,
            app_name=f"unilog-group-{config.group}-{self.worker}",
            pg_timeout=None,
            redis_timeout=config.block_ms / 1000 + 10,  # must outlast a blocking read
            on_pg_connect=self.new_session,
        )
        self._last_claim = 0.0
        self._last_prune = time.monotonic()
        self._pending_cursor: str | None = "0"
        self.handled_total = self.skipped_total = self.dead_total = 0

    @property
    def label(self) -> dict[str, Any]:
        return {"group": self.config.group, "worker": self.worker}

    def check_start(self) -> None:
        """The threaded worker's start-up: schema, and the group created at the stream's beginning if missing."""
        with GroupConsumer(self.settings, self.config, _never) as checker:
            checker.connect()

    def forget(self) -> None:
        self._pending_cursor = "0"  # after a reconnect, this worker's own pending entries come first

    def on_handler_error(self, exc: Exception) -> bool:
        return _is_handler_failure(exc)

    # -- one pass ----------------------------------------------------------------------------------------------------

    async def run_once(self, block_ms: int | None = None) -> GroupResult:
        """One pass: own pending entries first (after a (re)connect), else claimed idle ones and new ones."""
        _conn, api = await self._links()
        if self._pending_cursor is not None:
            own = await api.read_group(
                self.stream, self.config.group, self.worker, self.config.batch_size, None, self._pending_cursor
            )
            self._pending_cursor = own[-1][0].decode() if own else None
            if own:
                return await self._apply(own)
        claimed = await self._claim_due()
        wait = self.config.block_ms if not block_ms else (None if block_ms < 0 else block_ms)
        fresh = await api.read_group(
            self.stream, self.config.group, self.worker, self.config.batch_size, None if claimed else wait
        )
        result = await self._apply(claimed + fresh)
        await self._prune_due()
        return GroupResult(result.read, result.handled, result.skipped, result.dead, len(claimed))

    async def drain(self) -> int:
        """Apply entries until the group has nothing new and nothing claimable; return records handled."""
        await self.connect()
        total = 0
        while True:
            self._last_claim = 0.0
            result = await self.run_once(block_ms=-1)
            total += result.handled
            if result.read == 0:
                return total

    async def _claim_due(self) -> list[Entry]:
        now = time.monotonic()
        if now - self._last_claim < self.config.claim_interval:
            return []
        self._last_claim = now
        _conn, api = await self._links()
        start, claimed = "0-0", []
        while True:
            start, entries, deleted = await api.autoclaim(
                self.stream, self.config.group, self.worker, self.config.claim_idle_ms, start=start
            )
            claimed += entries
            if deleted:
                log.error(
                    "pending entries were deleted from the stream before anyone applied them",
                    group=self.config.group,
                    count=len(deleted),
                )
                await api.ack(self.stream, self.config.group, deleted)
            if start == "0-0":
                return claimed

    async def _apply(self, entries: list[Entry]) -> GroupResult:
        if not entries:
            return GroupResult()
        try:
            handled, skipped = await self._apply_batch(entries)
        except (*TRANSIENT, *FATAL):
            raise  # infrastructure or set-up (a transaction deadline's TimeoutError is an OSError), not the record
        except MalformedEntry:
            if self.config.on_malformed == "stop":
                raise
            if len(entries) > 1:
                return await self._one_by_one(entries)
            await self._dead_letter(entries[0], "malformed: a handler found it malformed", attempts=1)
            return GroupResult(1, 0, 0, 1)
        except Exception as exc:
            if len(entries) == 1:
                return GroupResult(1, 0, 0, await self._failed(entries[0], exc))
            log.warning("batch failed; retrying its records one by one", group=self.config.group, error=str(exc))
            return await self._one_by_one(entries)
        return GroupResult(len(entries), handled, skipped)

    async def _apply_batch(self, entries: list[Entry]) -> tuple[int, int]:
        """Apply ``entries`` in one transaction (skipping ones applied before), then acknowledge them all."""
        started = time.perf_counter()
        mine = self._owner
        records = [Record(self.stream, eid, fields) for eid, fields in entries if fields.get(REPLAY_FOR, mine) == mine]
        conn, api = await self._links()
        group = self.config.group
        async with asyncio.timeout(self.config.pg_timeout), conn.transaction():
            found = candidates(records, await store.group_watermarks(conn, group, self.stream))
            new = await store.claim_identities(conn, group, self.stream, list(found))
            fresh = [record for identity, record in found.items() if identity in new]
            if fresh:
                crash_at = self.faults.pick(len(fresh)) if self.faults.fires("consumer.crash_mid_batch") else None
                with tracing.process_span(self.stream, group, fresh, group=True):
                    await self.handler(conn, Batch(fresh, crash_at, group))
            self.faults.crash("consumer.crash_before_commit")
        self.faults.crash("group.crash_before_ack")
        await api.settle(self.stream, group, [eid for eid, _ in entries])
        skipped = account_batch(self, "group", group, entries, len(fresh), started, group=group, worker=self.worker)
        return len(fresh), skipped

    async def _one_by_one(self, entries: list[Entry]) -> GroupResult:
        results = [await self._apply([entry]) for entry in entries]
        return GroupResult(
            len(entries), sum(r.handled for r in results), sum(r.skipped for r in results), sum(r.dead for r in results)
        )

    async def _failed(self, entry: Entry, exc: Exception) -> int:
        """Count a failed attempt at ``entry``; dead-letter it after ``max_deliveries``. Returns 1 if dead-lettered."""
        _conn, api = await self._links()
        attempts = await api.attempt(self.stream, self.config.group, entry[0])
        if attempts < self.config.max_deliveries:
            log.warning(
                "record failed; it stays pending and is retried after claim_idle_ms",
                group=self.config.group,
                entry=entry[0].decode(),
                attempt=attempts,
                error=repr(exc),
            )
            return 0
        await self._dead_letter(entry, repr(exc), attempts=attempts)
        return 1

    async def _dead_letter(self, entry: Entry, error: str, *, attempts: int) -> None:
        _conn, api = await self._links()
        letter = await api.dead_letter(
            self.stream, self.config.group, entry[0], entry[1], error=error, consumer=self.worker, attempts=attempts
        )
        self.dead_total += 1
        reason = "malformed" if error.startswith("malformed:") else "max_deliveries"
        metrics.dead_lettered(self.stream, self.config.group, reason)
        log.error(
            "record dead-lettered",
            group=self.config.group,
            entry=entry[0].decode(),
            dead_letter=letter,
            attempts=attempts,
            error=error,
        )

    async def _prune_due(self) -> None:
        now = time.monotonic()
        if now - self._last_prune < self.config.prune_interval:
            return
        self._last_prune = now
        conn, _api = await self._links()
        async with conn.transaction():
            pruned = await store.prune_group(conn, self.config.group, self.stream)
        if pruned:
            log.info("processed records pruned", group=self.config.group, rows=pruned)
