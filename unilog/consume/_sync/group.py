# Generated from unilog/consume/_async/group.py by tools/faces.py: do not edit.
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
lists, shows, replays (after a fix) or drops it. An entry that is not a unilog record is dead-lettered at once, with
the reason it could not be decoded.

Over several streams (``GroupConfig.streams`` or ``stream_prefix``, see
:class:`~unilog.consume.settings.SeveralStreams`) the group is created on each stream, at its beginning (a stream
a prefix finds later included); one ``XREADGROUP`` reads them all (a pipeline on a Redis Cluster), and one batch,
one handler call and one transaction hold records of several streams, each record naming its stream. Identities,
watermarks, attempt counts and dead letters stay per stream, so every guarantee above holds per stream.

Groups do not keep order between records; use partitions (:mod:`unilog.consume.partitions`) when records with the same
key must be handled in order.

One source, two faces: this module is written once, as asyncio code under ``_async/``, and generated for threads
under ``_sync/`` (see :mod:`unilog.consume`).
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import structlog

from ... import metrics, store, tracing
from ...config import Settings
from ...engine import Entry, RedisStreams
from ...errors import MalformedEntry
from ...faults import NO_FAULTS, Faults
from ...runtime._sync.loop import Links, Worker
from ...runtime.policy import FATAL, TRANSIENT, account_batch
from ...wire import to_str
from ..base import GroupConfig, GroupResult, below_none, candidates, default_worker_name
from ..lanes import admit, label_of
from ..records import REPLAY_FOR, Batch, Handler, Record, replay_owner
from ..typed import typed_handler

log = structlog.get_logger("unilog.group")

Tagged = tuple[str, Entry]  # an entry and the stream it was read from
PRUNE_STREAMS = 100  # streams pruned in one transaction (its locks held until it ends)


def tagged(read: dict[str, list[Entry]]) -> list[Tagged]:
    """The entries of a read over several streams (stream -> entries), each with its stream."""
    return [(stream, entry) for stream, entries in read.items() for entry in entries]


def by_stream(entries: list[Tagged]) -> dict[str, list[bytes]]:
    """The ids of ``entries``, by stream."""
    ids: dict[str, list[bytes]] = {}
    for stream, (eid, _) in entries:
        ids.setdefault(stream, []).append(eid)
    return ids


class GroupConsumer(Worker):
    """One worker of a consumer group. One thread (or task) drives one worker; run several for several workers."""

    kind = "group worker"

    def __init__(
        self, settings: Settings, config: GroupConfig, handler: Handler, *, faults: Faults = NO_FAULTS
    ) -> None:
        self.settings, self.config, self.faults = settings, config, faults
        self.handler = typed_handler(handler)  # a handler annotated with record types is handed instances
        self.streams: list[str] = list(config.streams) if config.several else [config.stream or settings.stream]
        # one label for metrics, logs and spans, whatever the number of streams (see lanes.label_of)
        self.stream = label_of(config.streams, config.stream_prefix) if config.several else self.streams[0]
        self.worker = config.worker or default_worker_name()
        self._owner = replay_owner("group", config.group).encode()
        self.restart_after_crash = config.restart_after_crash
        self.max_backoff = config.max_backoff
        self.links = Links(
            settings,
            app_name=f"unilog-group-{config.group}-{self.worker}",
            pg_timeout=config.pg_timeout,
            redis_timeout=config.block_ms / 1000 + 10,  # must outlast a blocking read
        )
        self._last_claim = 0.0
        self._last_prune = time.monotonic()
        self._pending: dict[str, str] = dict.fromkeys(self.streams, "0")  # stream -> own pending entries after
        self._discovered_at = 0.0
        self._touched: set[str] = set()  # streams applied to since the last prune
        self.handled_total = self.skipped_total = self.dead_total = 0

    @property
    def label(self) -> dict[str, Any]:
        return {"group": self.config.group, "worker": self.worker}

    def describe(self) -> dict[str, Any]:
        several = {"streams": len(self.streams)} if self.config.several else {}
        return {**self.settings.describe(), "stream": self.stream, **several}

    def totals(self) -> dict[str, Any]:
        return {"handled": self.handled_total, "dead": self.dead_total}

    def forget(self) -> None:
        self._pending = dict.fromkeys(self.streams, "0")  # after a reconnect, own pending entries come first

    def connect(self) -> None:
        """Connect to both servers, find the streams (with a prefix) and create the group on each (at the stream's
        beginning) where it does not exist."""
        self.links.pg()
        self._discover(force=True)
        self._ensure_groups(self.streams)

    def _ensure_groups(self, streams: list[str]) -> None:
        created = self.links.redis().ensure_groups(streams, self.config.group)
        if len(created) == 1:
            log.info("consumer group created", group=self.config.group, stream=created[0])
        elif created:
            log.info("consumer group created", group=self.config.group, streams=len(created), first=created[:10])

    def _discover(self, *, force: bool = False) -> None:
        """With a prefix, read every stream of it not known yet (its group created at its beginning), every
        ``discover_interval`` seconds."""
        prefix = self.config.stream_prefix
        now = time.monotonic()
        if prefix is None or (not force and now - self._discovered_at < self.config.discover_interval):
            return
        self._discovered_at = now
        names = self.links.redis().stream_names(prefix, self.config.max_streams)
        new = admit(names, set(self.streams), self.config.max_streams, log, group=self.config.group)
        if new and not force:  # at connect the caller creates the groups of every stream at once
            self._ensure_groups(new)
        self.streams += new
        self._pending.update(dict.fromkeys(new, "0"))
        if new:
            log.info("streams found", group=self.config.group, new=len(new), streams=len(self.streams))

    def close(self) -> None:
        """Close connections; entries this worker read but did not acknowledge stay pending for others to claim."""
        self.forget()
        self.links.close()

    # -- one pass ----------------------------------------------------------------------------------------------------

    def run_once(self, block_ms: int | None = None) -> GroupResult:
        """One pass: this worker's own unacknowledged entries first (after a (re)connect), else entries claimed from
        idle workers (at most every ``claim_interval``) and new ones; apply them; return what was done."""
        api = self.links.redis()
        # XREADGROUP delivers what it reads: one read takes at most max(batch_size, streams) entries
        group, count = self.config.group, max(1, self.config.batch_size // max(1, len(self.streams)))
        if self._pending:
            # each own pending entry once; one that fails again waits for a claim, its back-off
            own = api.read_group_many(group, self.worker, self._pending, count, None)
            self._pending = {stream: to_str(entries[-1][0]) for stream, entries in own.items()}
            if own:
                return self._apply_all(tagged(own))
        self._discover()
        claimed = self._claim_due()
        wait = self.config.block_ms if not block_ms else (None if block_ms < 0 else block_ms)
        after = dict.fromkeys(self.streams, ">")
        fresh = api.read_group_many(group, self.worker, after, count, None if claimed else wait)
        result = self._apply_all(claimed + tagged(fresh))
        self._prune_due()
        return GroupResult(result.read, result.handled, result.skipped, result.dead, len(claimed))

    def _apply_all(self, entries: list[Tagged]) -> GroupResult:
        """Apply everything one read delivered (it is this worker's now), ``batch_size`` entries a transaction: a
        read over many streams may deliver more than a batch."""
        size = self.config.batch_size
        return GroupResult.total([self._apply(entries[lo : lo + size]) for lo in range(0, len(entries), size)])

    def drain_pass(self) -> tuple[int, bool]:
        """One pass of :meth:`drain` (burst mode: until the group has nothing new and nothing claimable)."""
        self._last_claim = 0.0
        result = self.run_once(block_ms=-1)
        return result.handled, result.read == 0

    def _claim_due(self) -> list[Tagged]:
        now = time.monotonic()
        if now - self._last_claim < self.config.claim_interval:
            return []
        self._last_claim = now
        return self.claim()

    def claim(self) -> list[Tagged]:
        """Take over entries idle for ``claim_idle_ms`` (a dead or stuck worker's) on every stream (the first
        ``XAUTOCLAIM`` of each in one pipeline, more only where a stream has more); acknowledge deleted ones."""
        api = self.links.redis()
        claimed: list[Tagged] = []
        first = api.autoclaim_many(self.streams, self.config.group, self.worker, self.config.claim_idle_ms)
        for stream, (start, entries, deleted) in first.items():
            while True:
                claimed += [(stream, entry) for entry in entries]
                self._deleted(api, stream, deleted)
                if start == "0-0":
                    break
                start, entries, deleted = api.autoclaim(
                    stream, self.config.group, self.worker, self.config.claim_idle_ms, start=start
                )
        if claimed:
            log.info("claimed idle entries", group=self.config.group, worker=self.worker, count=len(claimed))
        return claimed

    def _deleted(self, api: RedisStreams, stream: str, deleted: list[bytes]) -> None:
        """Entries deleted from ``stream`` while pending: acknowledged, and said (they were never applied)."""
        if not deleted:
            return
        log.error(
            "pending entries were deleted from the stream before anyone applied them",
            group=self.config.group,
            stream=stream,
            ids=[to_str(d) for d in deleted][:20],
            count=len(deleted),
        )
        api.ack(stream, self.config.group, deleted)

    def _apply(self, entries: list[Tagged]) -> GroupResult:
        if not entries:
            return GroupResult()
        try:
            handled, skipped = self._apply_batch(entries)
        except (*TRANSIENT, *FATAL):
            raise  # infrastructure or set-up (a deadline's TimeoutError is an OSError), not the record: never count it
        except MalformedEntry as exc:
            if self.config.on_malformed == "stop":
                raise
            if len(entries) > 1:
                return self._one_by_one(entries)
            return self._dead_malformed(*entries[0], exc.reason)
        except Exception as exc:
            if len(entries) == 1:
                return GroupResult(1, 0, 0, self._failed(*entries[0], exc))
            log.warning("batch failed; retrying its records one by one", group=self.config.group, error=str(exc))
            return self._one_by_one(entries)
        return GroupResult(len(entries), handled, skipped)

    def _apply_batch(self, entries: list[Tagged]) -> tuple[int, int]:
        """Apply ``entries`` in one transaction (skipping ones applied before), then acknowledge them all."""
        started = time.perf_counter()
        # another consumer's (or group's) replayed dead letter: this group applied the original, or will
        mine = self._owner
        records = [
            Record(stream, eid, fields, self.config.numbers)
            for stream, (eid, fields) in entries
            if fields.get(REPLAY_FOR, mine) == mine
        ]
        conn = self.links.pg()
        group = self.config.group
        with store.deadline(conn, self.config.pg_timeout), conn.transaction():
            store.read_committed(conn)  # _fresh's re-read of the watermarks needs it
            fresh = self._fresh(conn, records)
            if fresh:
                crash_at = self.faults.pick(len(fresh)) if self.faults.fires("consumer.crash_mid_batch") else None
                with tracing.process_span(self.stream, group, fresh, group=True):
                    self.handler(conn, Batch(fresh, crash_at, group))
            self.faults.crash("consumer.crash_before_commit")
        self.faults.crash("group.crash_before_ack")
        self.links.redis().settle_many(group, by_stream(entries))
        self._touched.update(stream for stream, _ in entries)
        plain = [entry for _, entry in entries]
        skipped = account_batch(self, "group", group, plain, len(fresh), started, group=group, worker=self.worker)
        return len(fresh), skipped

    def _fresh(self, conn: psycopg.Connection[Any], records: list[Record]) -> list[Record]:
        """The records this group has not applied yet, their identities now claimed in this transaction (three
        statements whatever the number of streams; streams in name order, so two workers claiming on the same
        streams wait for each other, not deadlock).

        Another worker may prune between the read of the watermarks and the claim: it moves a watermark past records
        applied before and deletes their rows, and the claim then finds no conflict for a redelivered one. Its claim
        waited for that prune to commit (the rows' locks), so the watermarks read again after it cover every such
        record: those are dropped (their rows, below the watermark, go at the next prune)."""
        if not records:
            return []
        group = self.config.group
        streams: dict[str, list[Record]] = {}
        for record in records:
            streams.setdefault(record.stream, []).append(record)
        marks = store.group_watermarks_many(conn, group, sorted(streams))
        found = {stream: candidates(streams[stream], marks.get(stream, {})) for stream in sorted(streams)}
        new = store.claim_identities_many(conn, group, {s: list(f) for s, f in found.items() if f})
        again = sorted(stream for stream, ids in new.items() if ids)
        if again:
            marks = store.group_watermarks_many(conn, group, again)
            new = {stream: below_none(ids, marks.get(stream, {})) for stream, ids in new.items()}
        kept = {id(record) for s, f in found.items() for identity, record in f.items() if identity in new.get(s, ())}
        return [record for record in records if id(record) in kept]

    def _one_by_one(self, entries: list[Tagged]) -> GroupResult:
        return GroupResult.total([self._apply([entry]) for entry in entries])

    def _dead_malformed(self, stream: str, entry: Entry, reason: str) -> GroupResult:
        """An entry that is not a unilog record, or that a handler could not read as its type: dead-letter it at
        once (retrying cannot help), with the reason the handler's error gave."""
        self.links.discard_failed_transaction()
        self._dead_letter(stream, entry, f"malformed: {reason}", attempts=1)
        return GroupResult(1, 0, 0, 1)

    def _failed(self, stream: str, entry: Entry, exc: Exception) -> int:
        """Count a failed attempt at ``entry``; dead-letter it after ``max_deliveries``. Returns 1 if dead-lettered."""
        self.links.discard_failed_transaction()
        attempts = self.links.redis().attempt(stream, self.config.group, entry[0])
        if attempts < self.config.max_deliveries:
            log.warning(
                "record failed; it stays pending and is retried after claim_idle_ms",
                group=self.config.group,
                stream=stream,
                entry=to_str(entry[0]),
                attempt=attempts,
                max_deliveries=self.config.max_deliveries,
                error=repr(exc),
            )
            return 0
        self._dead_letter(stream, entry, repr(exc), attempts=attempts)
        return 1

    def _dead_letter(self, stream: str, entry: Entry, error: str, *, attempts: int) -> None:
        """Move ``entry`` to the dead letters with ``error`` and acknowledge it (one MULTI); log and count it.

        Too few replicas acknowledging it (``wait_replicas``) is logged and counted, not retried: the letter and its
        acknowledgement stand or fall together in a failover, and a lost pair leaves the record pending, delivered
        again."""
        entry_id, fields = entry
        written = self.links.redis().dead_letter(
            stream,
            self.config.group,
            entry_id,
            fields,
            error=error,
            consumer=self.worker,
            attempts=attempts,
            wait_replicas=self.config.wait_replicas,
            wait_timeout_ms=self.config.wait_timeout_ms,
        )
        letter = written.id
        if not written.confirmed:
            metrics.letter_unreplicated(self.stream, self.config.group)
            log.warning(
                "too few replicas acknowledged a dead letter; a failover now would deliver its record again",
                group=self.config.group,
                dead_letter=letter,
                replicas=written.replicas,
                wanted=written.wanted,
            )
        self.dead_total += 1
        reason = "malformed" if error.startswith("malformed:") else "max_deliveries"
        metrics.dead_lettered(self.stream, self.config.group, reason)
        log.error(
            "record dead-lettered",
            group=self.config.group,
            stream=stream,
            entry=to_str(entry_id),
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
        """Advance this group's watermarks and delete the processed rows at or below them, on every stream this
        worker applied records of since its last prune (over several streams, 100 streams a transaction of two
        statements; one that no worker touched since a restart is pruned at its next record); return rows deleted."""
        conn = self.links.pg()
        streams = sorted(self._touched) if self.config.several else self.streams
        pruned = 0
        for lo in range(0, len(streams), PRUNE_STREAMS):
            part = streams[lo : lo + PRUNE_STREAMS]
            with conn.transaction():
                rows, done = store.prune_watermarks(conn, self.config.group, part)
            pruned += rows
            # a stream another worker was pruning (its lock), or whose prune failed, is tried again next time
            self._touched.difference_update(done)
        if pruned:
            log.info("processed records pruned", group=self.config.group, rows=pruned)
        return pruned
