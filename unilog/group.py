"""Group consumers: N workers share one stream through a Redis consumer group, each record applied exactly once.

Redis delivers each entry to one worker of the group (``XREADGROUP``) and redelivers it if that worker never
acknowledges it (``XAUTOCLAIM`` after ``claim_idle_ms``). At-least-once delivery becomes exactly-once effect here:
in the transaction of the effect the worker inserts each record's identity (producer, epoch, seq) into
``unilog_processed`` and hands the handler only the records whose identity was new; it ``XACK``s after the commit.
A redelivered record, or a double-sent copy, finds its identity and is skipped. The table is pruned behind a
watermark (every seq at or below it applied), so it stays small.

A handler failure rolls the batch back and retries its records one by one, so one poison record cannot hold the
others back; a record that fails is left pending, retried after ``claim_idle_ms`` (its back-off), and after
``max_deliveries`` failed attempts moved to the dead-letter stream ``unilog:dlq:{<stream>}`` with the error, the
worker and the attempt count, then acknowledged. It never stalls the group and is never dropped silently: ``unilog dlq``
lists, shows, replays (after a fix) or drops it.

Groups do not keep order between records; use partitions (:mod:`unilog.partitions`) when records with the same
key must be handled in order.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog

from . import engine, metrics, store, tracing
from .config import Settings, validate_name, validate_stream_name
from .errors import MalformedEntry
from .faults import NO_FAULTS, Faults
from .records import REPLAY_FOR, Batch, Handler, Record, check_malformed_policy, replay_owner
from .runtime import FATAL, TRANSIENT, Links, Worker, account_batch

log = structlog.get_logger(__name__)


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


class GroupConsumer(Worker):
    """One worker of a consumer group. One thread drives one worker; run several processes for several workers."""

    def __init__(self, settings: Settings, config: GroupConfig, handler: Handler, *, faults: Faults = NO_FAULTS):
        self.settings = settings
        self.config = config
        self.stream = config.stream or settings.stream
        self.worker = config.worker or default_worker_name()
        self._owner = replay_owner("group", config.group).encode()
        self.handler = handler
        self.faults = faults
        self.restart_after_crash = config.restart_after_crash
        self.max_backoff = config.max_backoff
        self.links = Links(
            settings,
            app_name=f"unilog-group-{config.group}-{self.worker}",
            pg_timeout=config.pg_timeout,
            redis_timeout=config.block_ms / 1000 + 10,
        )
        self._last_claim = 0.0
        self._last_prune = time.monotonic()
        self._pending_cursor: str | None = "0"
        self.handled_total = 0
        self.skipped_total = 0
        self.dead_total = 0

    kind = "group worker"

    @property
    def label(self) -> dict[str, Any]:
        return {"group": self.config.group, "worker": self.worker}

    def describe(self) -> dict[str, Any]:
        return {"stream": self.stream, **self.settings.describe()}

    def totals(self) -> dict[str, Any]:
        return {"handled": self.handled_total, "dead": self.dead_total}

    # -- connections -------------------------------------------------------------------------------------------------

    def _conn(self) -> psycopg.Connection[Any]:
        return self.links.pg()

    def _engine(self) -> engine.RedisStreams:
        return self.links.redis()

    def connect(self) -> None:
        """Connect to both servers and create the group (at the stream's beginning) if it does not exist."""
        self._conn()
        if self._engine().ensure_group(self.stream, self.config.group):
            log.info("consumer group created", group=self.config.group, stream=self.stream)

    def close(self) -> None:
        """Close connections; entries this worker read but did not acknowledge stay pending for others to claim."""
        super().close()
        self._pending_cursor = "0"

    # -- one pass ----------------------------------------------------------------------------------------------------

    def run_once(self, block_ms: int | None = None) -> GroupResult:
        """One pass: this worker's own unacknowledged entries first (after a (re)connect), else entries claimed from
        idle workers (at most every ``claim_interval``) and new ones; apply them; return what was done."""
        api = self._engine()
        if self._pending_cursor is not None:
            # each own pending entry once; one that fails again waits for a claim, its back-off
            own = api.read_group(
                self.stream, self.config.group, self.worker, self.config.batch_size, None, self._pending_cursor
            )
            self._pending_cursor = engine.to_str(own[-1][0]) if own else None
            if own:
                return self._apply(own)
        claimed = self._claim_due()
        wait = self.config.block_ms if not block_ms else (None if block_ms < 0 else block_ms)
        fresh = api.read_group(
            self.stream, self.config.group, self.worker, self.config.batch_size, None if claimed else wait
        )
        result = self._apply(claimed + fresh)
        self._prune_due()
        return GroupResult(result.read, result.handled, result.skipped, result.dead, len(claimed))

    def drain(self) -> int:
        """Apply entries until the group has nothing new and nothing claimable; return records handled."""
        self.connect()
        total = 0
        while True:
            self._last_claim = 0.0
            result = self.run_once(block_ms=-1)
            total += result.handled
            if result.read == 0:
                return total

    def _claim_due(self) -> list[engine.Entry]:
        now = time.monotonic()
        if now - self._last_claim < self.config.claim_interval:
            return []
        self._last_claim = now
        return self.claim()

    def claim(self) -> list[engine.Entry]:
        """Take over entries idle for ``claim_idle_ms`` (a dead or stuck worker's); acknowledge deleted ones."""
        api = self._engine()
        start, claimed = "0-0", []
        while True:
            start, entries, deleted = api.autoclaim(
                self.stream, self.config.group, self.worker, self.config.claim_idle_ms, start=start
            )
            claimed += entries
            if deleted:
                log.error(
                    "pending entries were deleted from the stream before anyone applied them",
                    group=self.config.group,
                    ids=[engine.to_str(d) for d in deleted][:20],
                    count=len(deleted),
                )
                api.ack(self.stream, self.config.group, deleted)
            if start == "0-0":
                break
        if claimed:
            log.info("claimed idle entries", group=self.config.group, worker=self.worker, count=len(claimed))
        return claimed

    def _apply(self, entries: list[engine.Entry]) -> GroupResult:
        if not entries:
            return GroupResult()
        try:
            handled, skipped = self._apply_batch(entries)
        except (*TRANSIENT, *FATAL):
            raise  # infrastructure or set-up, not the record: never count it against the record
        except MalformedEntry:
            if self.config.on_malformed == "stop":
                raise
            return self._one_by_one(entries) if len(entries) > 1 else self._dead_malformed(entries[0])
        except Exception as exc:
            if len(entries) == 1:
                return GroupResult(1, 0, 0, self._failed(entries[0], exc))
            log.warning("batch failed; retrying its records one by one", group=self.config.group, error=str(exc))
            return self._one_by_one(entries)
        return GroupResult(len(entries), handled, skipped)

    def _apply_batch(self, entries: list[engine.Entry]) -> tuple[int, int]:
        """Apply ``entries`` in one transaction (skipping ones applied before), then acknowledge them all."""
        started = time.perf_counter()
        # another consumer's (or group's) replayed dead letter: this group applied the original, or will
        mine = self._owner
        records = [Record(self.stream, eid, fields) for eid, fields in entries if fields.get(REPLAY_FOR, mine) == mine]
        conn = self._conn()
        with store.deadline(conn, self.config.pg_timeout), conn.transaction():
            fresh = self._fresh(conn, records)
            if fresh:
                crash_at = self.faults.pick(len(fresh)) if self.faults.fires("consumer.crash_mid_batch") else None
                with tracing.process_span(self.stream, self.config.group, fresh, group=True):
                    self.handler(conn, Batch(fresh, crash_at, self.config.group))
            self.faults.crash("consumer.crash_before_commit")
        self.faults.crash("group.crash_before_ack")
        ids = [eid for eid, _ in entries]
        api = self._engine()
        api.settle(self.stream, self.config.group, ids)
        skipped = account_batch(
            self, "group", self.config.group, entries, len(fresh), started, group=self.config.group, worker=self.worker
        )
        return len(fresh), skipped

    def _fresh(self, conn: psycopg.Connection[Any], records: list[Record]) -> list[Record]:
        """The records this group has not applied yet, their identities now claimed in this transaction."""
        found = candidates(records, store.group_watermarks(conn, self.config.group, self.stream))
        new = store.claim_identities(conn, self.config.group, self.stream, list(found))
        return [record for identity, record in found.items() if identity in new]

    def _one_by_one(self, entries: list[engine.Entry]) -> GroupResult:
        results = [self._apply([entry]) for entry in entries]
        return GroupResult(
            len(entries), sum(r.handled for r in results), sum(r.skipped for r in results), sum(r.dead for r in results)
        )

    def _dead_malformed(self, entry: engine.Entry) -> GroupResult:
        """An entry that is not a unilog record: dead-letter it at once (retrying cannot help), with the reason."""
        self.links.discard_failed_transaction()
        try:
            Record(self.stream, *entry).data  # noqa: B018 - decoding is the check
            reason = "a handler found it malformed"
        except MalformedEntry as exc:
            reason = exc.reason
        self._dead_letter(entry, f"malformed: {reason}", attempts=1)
        return GroupResult(1, 0, 0, 1)

    def _failed(self, entry: engine.Entry, exc: Exception) -> int:
        """Count a failed attempt at ``entry``; dead-letter it after ``max_deliveries``. Returns 1 if dead-lettered."""
        self.links.discard_failed_transaction()
        attempts = self._engine().attempt(self.stream, self.config.group, entry[0])
        if attempts < self.config.max_deliveries:
            log.warning(
                "record failed; it stays pending and is retried after claim_idle_ms",
                group=self.config.group,
                entry=engine.to_str(entry[0]),
                attempt=attempts,
                max_deliveries=self.config.max_deliveries,
                error=repr(exc),
            )
            return 0
        self._dead_letter(entry, repr(exc), attempts=attempts)
        return 1

    def _dead_letter(self, entry: engine.Entry, error: str, *, attempts: int) -> None:
        """Move ``entry`` to the dead letters with ``error`` and acknowledge it (one MULTI); log and count it."""
        entry_id, fields = entry
        letter = self._engine().dead_letter(
            self.stream, self.config.group, entry_id, fields, error=error, consumer=self.worker, attempts=attempts
        )
        self.dead_total += 1
        reason = "malformed" if error.startswith("malformed:") else "max_deliveries"
        metrics.dead_lettered(self.stream, self.config.group, reason)
        log.error(
            "record dead-lettered",
            group=self.config.group,
            entry=engine.to_str(entry_id),
            dead_letter=letter,
            attempts=attempts,
            error=error,
        )

    def _prune_due(self) -> None:
        now = time.monotonic()
        if now - self._last_prune < self.config.prune_interval:
            return
        self._last_prune = now
        self.prune()

    def prune(self) -> int:
        """Advance this group's watermarks and delete the processed rows at or below them; return rows deleted."""
        conn = self._conn()
        with conn.transaction():
            if not store.try_prune_lock(conn, self.config.group, self.stream):
                return 0  # another worker is pruning
            pruned = store.advance_watermarks(conn, self.config.group, self.stream)
        if pruned:
            log.info("processed records pruned", group=self.config.group, rows=pruned)
        return pruned


def candidates(records: list[Record], marks: dict[tuple[str, int], int]) -> dict[store.Identity, Record]:
    """The records a group may not have applied yet, by identity: none at or below its watermark, and a double-sent
    copy in the same batch once. The caller claims their identities; those it gets are the fresh ones."""
    found: dict[store.Identity, Record] = {}
    for record in records:
        identity = _identity(record)
        if identity[0] and identity[2] <= marks.get((identity[0], identity[1]), 0):
            continue
        found.setdefault(identity, record)
    return found


def _identity(record: Record) -> store.Identity:
    """(producer, epoch, seq); entries without unilog metadata are identified by the stream id they were first
    appended as (a replay of one is the same record)."""
    pos = record.position
    if pos is not None:
        return record.producer, pos[0], pos[1]
    ms, _, seq = record.origin.partition("-")
    return "", int(ms), int(seq or 0)
