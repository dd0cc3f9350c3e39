# Generated from unilog/consume/_async/multi.py by tools/faces.py: do not edit.
"""A checkpoint consumer over several streams: one handler, one transaction per batch, a checkpoint row per stream.

Its streams are ``ConsumerConfig.streams`` and, with ``stream_prefix``, every stream whose name starts with the
prefix, looked for again every ``discover_interval`` seconds (streams created later are read from their start).
Each stream has a lane (:class:`~unilog.consume.lanes.Lane`): a checkpoint row of its own, named
``<name>:<stream>``, sorted by the rules a single-stream consumer of that name would have.

One pass reads after every stream's checkpoint in one round trip (one ``XREAD`` over all of them on a single Redis,
a pipeline on a Redis Cluster), cuts the result to ``batch_size`` entries round-robin (each stream keeps a prefix of
what it returned), then in one transaction: locks the rows of the streams that returned entries (one statement, in
name order, so copies of the consumer wait for each other instead of deadlocking), drops per stream the positions
already applied, calls the handler once with the records of all of them (each record's ``stream`` names its
stream; within a stream, stream order), dead-letters malformed entries per stream, saves every touched row (one
statement) and commits. A crash before the commit leaves no effect and no checkpoint moved; after it, nothing is
replayed. A stream whose row moved underneath (another copy, a reset) is dropped from the batch and read again.

A batch that fails its handler counts a failure on each of its streams at its checkpoint; a stream that reached
``max_attempts`` is applied one record per transaction, alone, and the poison policy settles the record that fails
alone, exactly as the single-stream consumer does. Gaps (:class:`~unilog.errors.StreamGap`), rewinds
(:class:`~unilog.errors.StreamRewound`) and ``strict_start`` are judged per stream and name it.

One source, two faces: written once, as asyncio code under ``_async/``; :class:`MultiConsumer` is generated from it.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import structlog

from ... import metrics, store, tracing
from ...config import Settings
from ...engine import Entry, RedisStreams
from ...errors import ConfigurationError, MalformedEntry
from ...faults import NO_FAULTS, Faults
from ...runtime._sync.loop import Links, Worker
from ...runtime.policy import account_batch
from ...store.checkpoints import Checkpoint
from ...wire import to_str
from ..base import ConsumerConfig, ConsumeResult, describe, is_handler_failure, poison_stop
from ..lanes import (
    MIN_PER_STREAM,
    Lane,
    admit,
    fair_cut,
    label_of,
    make_lane,
    moved_refusal,
    per_stream_count,
    rewind_interval,
)
from ..progress import keep_held, sort_batch
from ..records import Batch, Handler, Record
from ..typed import typed_handler
from .checkpoint import write_dead_letter

log = structlog.get_logger("unilog.consumer")

Read = dict[str, list[Entry]]  # stream -> the entries read after its checkpoint, in stream order


class MultiConsumer(Worker):
    """Runs a handler over several streams with exactly-once effects per stream. One thread (or task) drives one."""

    kind = "consumer"
    metric_kind = "checkpoint"

    def __init__(
        self, settings: Settings, config: ConsumerConfig, handler: Handler, *, faults: Faults = NO_FAULTS
    ) -> None:
        if not config.several:
            raise ConfigurationError(f"consumer {config.name!r}: give streams or stream_prefix (one stream: Consumer)")
        self.settings, self.config, self.faults = settings, config, faults
        self.handler = typed_handler(handler)
        self.stream = label_of(config.streams, config.stream_prefix)  # one label, whatever the number of streams
        self.restart_after_crash = config.restart_after_crash
        self.max_backoff = config.max_backoff
        self.links = Links(
            settings,
            app_name=f"unilog-consumer-{config.name}",
            pg_timeout=config.pg_timeout,
            redis_timeout=config.block_ms / 1000 + 10,
            on_pg_connect=self._forget_checkpoints,
        )
        self.lanes: dict[str, Lane] = {s: make_lane(config, s) for s in config.streams}
        self._discovered_at = 0.0
        self._registered_at = 0.0
        self._unregistered: dict[tuple[str, str], str] = {}  # (stream, row) -> last id committed, not yet registered
        self._last_rewind_check = 0.0
        self._turn = 0  # which stream a cut batch starts at: turned every pass
        self._quiet: set[str] | None = None  # the streams the last read found nothing after (None: not read yet)
        self.handled_total = self.skipped_total = self.malformed_total = self.dead_total = 0

    @property
    def label(self) -> dict[str, Any]:
        return {"consumer": self.config.name}

    def describe(self) -> dict[str, Any]:
        return {**self.settings.describe(), "stream": self.stream, "streams": len(self.lanes)}

    def totals(self) -> dict[str, Any]:
        return {"handled": self.handled_total, "streams": len(self.lanes)}

    def _forget_checkpoints(self, _conn: object = None) -> None:
        for lane in self.lanes.values():
            lane.checkpoint = None

    def forget(self) -> None:
        self._forget_checkpoints()

    def close(self) -> None:
        """Close connections; the committed checkpoints are all that carries over."""
        self.forget()
        self.links.close()

    def checkpoints(self) -> dict[str, Checkpoint]:
        """The last committed checkpoint of each stream, as this consumer knows them (loaded every pass)."""
        return {s: lane.checkpoint for s, lane in self.lanes.items() if lane.checkpoint is not None}

    def connect(self) -> None:
        """Connect to both servers, find the streams, load their checkpoints, register them for retention and check
        Redis did not rewind any of them. Raises a one-line-worthy error if a server is unreachable or data was
        lost."""
        api = self.links.redis()
        self._discover(force=True)
        missing = api.missing_streams(list(self.config.streams))
        if missing:  # a typo in a stream name would otherwise wait in silence, forever
            log.warning(
                "streams do not exist yet; waiting for their first entries",
                consumer=self.config.name,
                missing=len(missing),
                first_missing=missing[:10],
            )
        self._load()
        self._register_all(force=True)
        self._check_not_rewound()

    # -- streams and checkpoints -------------------------------------------------------------------------------------

    def _discover(self, *, force: bool = False) -> None:
        """With a prefix, add a lane for every stream of it not known yet, every ``discover_interval`` seconds."""
        prefix = self.config.stream_prefix
        now = time.monotonic()
        if prefix is None or (not force and now - self._discovered_at < self.config.discover_interval):
            return
        self._discovered_at = now
        names = self.links.redis().stream_names(prefix, self.config.max_streams)
        new = admit(names, self.lanes, self.config.max_streams, log, consumer=self.config.name)
        for stream in new:
            self.lanes[stream] = make_lane(self.config, stream)
        if new:
            log.info("streams found", consumer=self.config.name, new=len(new), streams=len(self.lanes))

    def _load(self) -> None:
        """Load the checkpoints of the lanes that have none in memory (created at their stream's start), in one
        transaction of two statements whatever their number."""
        rows = {lane.row: lane.stream for lane in self.lanes.values() if lane.checkpoint is None}
        if not rows:
            return
        conn = self.links.pg()
        with conn.transaction():
            moved = store.single_row_moved(conn, self.config.name, rows)
            if moved is not None:
                raise moved_refusal("consumer", *moved)
            found = store.ensure_checkpoints(conn, rows)
        for row, stream in rows.items():
            checkpoint = found[row]
            if checkpoint.stream != stream:  # a row of this name made by hand for another stream
                raise ConfigurationError(
                    f"checkpoint {row!r} of consumer {self.config.name!r} is on stream {checkpoint.stream!r}, not "
                    f"{stream!r}: use another name or reset it"
                )
            self.lanes[stream].checkpoint = checkpoint

    def _register_all(self, *, force: bool = False) -> None:
        """Record every lane's checkpoint in its stream's retention registry (see :meth:`_register`)."""
        for lane in self.lanes.values():
            if lane.checkpoint is not None:
                self._unregistered[(lane.stream, lane.row)] = lane.checkpoint.last_id
        self._register(force=force)

    def _register(self, *, force: bool = False) -> None:
        """Register the checkpoints committed since the last registration, in one pipeline, at most every
        ``register_interval`` seconds: an older value only holds back more of a stream (the safe direction)."""
        if not self.config.register or not self._unregistered:
            return
        now = time.monotonic()
        if force or now - self._registered_at >= self.config.register_interval:
            self.links.redis().register_many(self._unregistered)
            self._unregistered = {}
            self._registered_at = now

    def _check_not_rewound(self, quiet: set[str] | None = None) -> None:
        """Raise :class:`StreamRewound` if a stream's last id has been below its checkpoint (Redis lost data) for
        longer than ``rewind_grace`` seconds: the streams read past their start, of ``quiet`` only if given (a
        stream whose last read returned entries after its checkpoint does not end below it), in one pipeline."""
        self._last_rewind_check = time.monotonic()
        read = [
            lane
            for lane in self.lanes.values()
            if lane.checkpoint is not None
            and lane.checkpoint.last_id != "0-0"
            and (quiet is None or lane.stream in quiet)
        ]
        if not read:
            return
        tops = self.links.redis().last_generated_ids([lane.stream for lane in read])
        for lane in read:
            assert lane.checkpoint is not None
            lane.rewind.check(tops[lane.stream], lane.checkpoint.last_id)

    # -- one pass ----------------------------------------------------------------------------------------------------

    def run_once(self, block_ms: int | None = None) -> ConsumeResult:
        """Read one batch after every stream's checkpoint and apply it with the checkpoints in one transaction.

        ``block_ms`` overrides how long to wait for entries (0 or None: use the config; negative: don't wait)."""
        wait = self.config.block_ms if not block_ms else (None if block_ms < 0 else block_ms)
        self._discover()
        self._load()
        if time.monotonic() - self._last_rewind_check >= rewind_interval(len(self.lanes)):
            self._check_not_rewound(self._quiet)  # a rewound stream shows no entries: look among the quiet
        read = self._read(wait)
        if not read:
            return ConsumeResult()
        poisoned = [s for s in read if self.lanes[s].poisoned(self.config.max_attempts)]
        if poisoned:
            return self._isolate({s: read[s] for s in poisoned})
        try:
            return self._apply_checked(read)
        except Exception as exc:
            if is_handler_failure(exc):
                for stream in read:
                    self.lanes[stream].failed()
                self.links.discard_failed_transaction()
            raise  # the loop rolls back, backs off and reads the batch again

    def _read(self, wait: int | None) -> Read:
        """At most ``batch_size`` entries after the streams' checkpoints, a prefix of each stream's, from a start
        that turns every pass. Over few streams, one read of :func:`per_stream_count` entries each. Over many (the
        batch shared out would be under :data:`MIN_PER_STREAM` each), a first read of one entry each finds the
        streams that have some, then a second reads deeper into those the batch takes: a batch spans few streams
        (each one a checkpoint row to lock and save), and no entry is read only to be dropped."""
        after = {s: lane.checkpoint.last_id for s, lane in self.lanes.items() if lane.checkpoint is not None}
        api, batch_size = self.links.redis(), self.config.batch_size
        self._turn += 1
        many = len(after) * MIN_PER_STREAM > batch_size
        found = api.read_many(after, 1 if many else per_stream_count(batch_size, len(after)), wait)
        self._quiet = set(after) - set(found)
        if not many or not found:
            return fair_cut(found, batch_size, self._turn)
        active = list(found)
        start = self._turn % len(active)
        depth = max(MIN_PER_STREAM, batch_size // len(active))
        taken = (active[start:] + active[:start])[: max(1, batch_size // depth)]
        deeper = api.read_many({s: after[s] for s in taken}, depth, None)
        return fair_cut(deeper, batch_size, 0)

    def _apply_checked(self, read: Read) -> ConsumeResult:
        """:meth:`_apply`, again without an entry a handler found malformed (dead-lettered instead), unless the
        policy is to stop."""
        while True:
            try:
                return self._apply(read)
            except MalformedEntry as exc:  # a handler read a record whose data is not JSON: nothing was committed
                lane = self.lanes.get(exc.stream)
                known = exc.entry_id.encode()
                if lane is None or self.config.on_malformed == "stop" or known in lane.malformed:
                    raise
                lane.malformed[known] = exc.reason  # apply the batch again, that entry dead-lettered

    def _apply(self, read: Read) -> ConsumeResult:
        """Apply one batch (``read``: entries after each stream's checkpoint) with the checkpoints, in one
        transaction."""
        started = time.perf_counter()
        conn, api = self.links.pg(), self.links.redis()
        with store.deadline(conn, self.config.pg_timeout), conn.transaction():
            afters = self._lock_unmoved(conn, read)
            fresh: list[Record] = []
            letters: dict[str, list[tuple[bytes, Any, str]]] = {}
            for stream, after in afters.items():
                lane = self.lanes[stream]
                batch = sort_batch(lane.rules, read[stream], after, lane.malformed)
                kept = batch.fresh
                if batch.replays:  # a replayed dead letter is applied only if this stream's row still holds it
                    held = store.take_held(conn, lane.row, [r.origin for r in batch.replays])
                    kept = keep_held(kept, batch.replays, held)
                fresh += kept
                letters[stream] = batch.letters
            if fresh:
                crash_at = self.faults.pick(len(fresh)) if self.faults.fires("consumer.crash_mid_batch") else None
                with tracing.process_span(self.stream, self.config.name, fresh):
                    self.handler(conn, Batch(fresh, crash_at, self.config.name))
            dead = 0
            for stream, found in letters.items():
                dead += self._dead_letter_malformed(conn, api, self.lanes[stream], found)
            self.faults.crash("consumer.crash_before_commit")
            store.save_checkpoints(conn, list(afters.values()))
        for stream in afters:
            for entry_id, _fields, _reason in letters[stream]:
                self.lanes[stream].malformed.pop(entry_id, None)
        entries = [entry for stream in afters for entry in read[stream]]
        return self._committed(afters, entries, len(fresh), dead, started)

    def _lock_unmoved(self, conn: psycopg.Connection[Any], read: Read) -> dict[str, Checkpoint]:
        """Lock the rows of the streams in ``read`` (one statement, in name order) and return a copy of each that
        is as this consumer last saw it, to be advanced; a stream whose row moved underneath (another copy of this
        consumer, a reset) is left out and its checkpoint read again next pass."""
        lanes = [self.lanes[s] for s in read]
        current = store.read_checkpoints(conn, [lane.row for lane in lanes], lock=True)
        afters: dict[str, Checkpoint] = {}
        for lane in lanes:
            now, before = current.get(lane.row), lane.checkpoint
            if now is None or before is None or now.last_id != before.last_id or now.positions != before.positions:
                lane.checkpoint = None
                log.info("checkpoint moved underneath; re-reading", consumer=lane.row)
                continue
            afters[lane.stream] = now.copy()
        return afters

    def _committed(
        self, afters: dict[str, Checkpoint], entries: list[Entry], handled: int, dead: int, started: float
    ) -> ConsumeResult:
        """A batch committed: remember the checkpoints, register them, count the batch."""
        for stream, after in afters.items():
            lane = self.lanes[stream]
            lane.checkpoint = after
            self._unregistered[(stream, lane.row)] = after.last_id
        self._register()
        if not entries:
            return ConsumeResult()
        skipped = account_batch(
            self,
            self.metric_kind,
            self.config.name,
            entries,
            handled,
            started,
            consumer=self.config.name,
            streams=len(afters),
        )
        return ConsumeResult(len(entries), handled, skipped, dead)

    # -- poison records ----------------------------------------------------------------------------------------------

    def _isolate(self, read: Read) -> ConsumeResult:
        """Batches holding these streams' entries failed ``max_attempts`` times: apply each stream's records one per
        transaction, alone, to find the one that fails, and apply the poison policy to it (:meth:`_poisoned`)."""
        total = ConsumeResult()
        for stream, entries in read.items():
            lane = self.lanes[stream]
            log.warning(
                "batch keeps failing; applying a stream's records one by one",
                consumer=lane.row,
                first=to_str(entries[0][0]),
                records=len(entries),
            )
            for entry in entries:
                self._load()
                try:
                    total += self._apply_checked({stream: [entry]})
                except Exception as exc:
                    if not is_handler_failure(exc):
                        raise
                    self.links.discard_failed_transaction()
                    total += self._poisoned(lane, entry, exc)
                if lane.checkpoint is None:  # moved underneath (another copy, a reset): read again from there
                    break
            lane.failures.clear()
        return total

    def _poisoned(self, lane: Lane, entry: Entry, exc: Exception) -> ConsumeResult:
        """``entry`` of ``lane`` failed alone: stop (raise :class:`PoisonRecord`) or dead-letter it and move its
        stream's checkpoint past it, in one transaction with the row that lets a replay of it be applied once."""
        record = Record(lane.stream, *entry, self.config.numbers)
        if self.config.on_poison == "stop":
            raise poison_stop(self.config, lane.stream, record, exc) from exc
        conn, api = self.links.pg(), self.links.redis()
        with store.deadline(conn, self.config.pg_timeout), conn.transaction():
            afters = self._lock_unmoved(conn, {lane.stream: [entry]})
            if not afters:
                return ConsumeResult()
            after = afters[lane.stream]
            batch = sort_batch(lane.rules, [entry], after, {})  # moves the checkpoint past it
            if batch.replays:  # a replay's held row is taken: its letter is held again below, under this row
                store.take_held(conn, lane.row, [r.origin for r in batch.replays])
            letter = self._dead_letter(conn, api, lane, entry, repr(exc), attempts=self.config.max_attempts + 1)
            self.faults.crash(
                "consumer.crash_after_dead_letter"
            )  # as the single-stream consumer's: retried, then one replay
            store.save_checkpoints(conn, [after])
        self._committed({lane.stream: after}, [], 0, 1, 0.0)
        self.dead_total += 1
        metrics.dead_lettered(self.stream, self.config.name, "poison")
        log.error(
            "record dead-lettered", consumer=lane.row, record=describe(record), dead_letter=letter, error=repr(exc)
        )
        return ConsumeResult(1, 0, 0, 1)

    def _dead_letter(
        self,
        conn: psycopg.Connection[Any],
        api: RedisStreams,
        lane: Lane,
        entry: Entry,
        error: str,
        attempts: int = 1,
    ) -> str:
        """The single-stream consumer's dead letter (:func:`~unilog.consume._sync.checkpoint.write_dead_letter`),
        per stream: held under its stream's row, copied to that stream's dead letters."""
        return write_dead_letter(
            conn, api, self.config, lane.unconfirmed, lane.row, lane.stream, entry, error, attempts, label=self.stream
        )

    def _dead_letter_malformed(
        self, conn: psycopg.Connection[Any], api: RedisStreams, lane: Lane, letters: list[Any]
    ) -> int:
        """Move a stream's malformed entries of the batch to its dead letters, with their reasons; return how many."""
        for entry_id, fields, reason in letters:
            letter = self._dead_letter(conn, api, lane, (entry_id, fields), f"malformed: {reason}")
            self.malformed_total += 1
            metrics.dead_lettered(self.stream, self.config.name, "malformed")
            log.warning(
                "malformed entry dead-lettered",
                consumer=lane.row,
                entry=to_str(entry_id),
                dead_letter=letter,
                reason=reason,
            )
        return len(letters)

    # -- modes -------------------------------------------------------------------------------------------------------

    def is_handler_failure(self, exc: Exception) -> bool:
        """A handler error: the batch was rolled back and is retried with back-off; a stream whose batches failed
        ``max_attempts`` times is then applied record by record (:meth:`_isolate`)."""
        return is_handler_failure(exc)

    def after_handler_failure(self, exc: Exception) -> None:
        """The rolled-back batch's checkpoints are read again from Postgres by the retry."""
        self._forget_checkpoints()

    def drain_pass(self) -> tuple[int, bool]:
        """One pass of :meth:`drain` (burst mode: consume until no stream has anything after its checkpoint)."""
        result = self.run_once(block_ms=-1)
        return result.handled, result.read == 0 and all(lane.checkpoint is not None for lane in self.lanes.values())
