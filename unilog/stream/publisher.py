"""What the streamer's captures publish through: the :class:`Publisher` (the interface the streamer drives a
capture through, :class:`~unilog.stream.capture.Capture`, is in :mod:`unilog.stream.capture`).

A capture reads committed staged records from one source and publishes them: table mode
(:class:`unilog.stream.capture_table.TableCapture`, committed staged rows claimed in id order), WAL mode
(:class:`unilog.stream.capture_wal.WalCapture`, a logical slot in commit order). The streamer creates one
:class:`Publisher` and hands it to each capture it makes; the publisher holds what must be the same whichever
capture runs, and outlives a switch between them:

* **One publisher per stream**: :meth:`Publisher.owns_all` takes the session-level advisory locks of the streams'
  buckets (:func:`unilog.store.stream_bucket`), all in one statement; a capture publishes a stream only while this
  streamer holds its bucket.
* **Dense, monotone positions**: :meth:`Publisher.next_seq` is the position cache, valid while the lock is held and
  the captures' commits succeed (a capture forgets it when a pass fails after assigning positions).
* One batch sent to Redis (:meth:`Publisher.send_all`, with the ``streamer.double_send`` fault), the producer
  identity and epoch, the partition counts, and the records counted published (totals and metrics).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import psycopg
import structlog

from .. import engine, metrics, routing, store
from ..errors import ConfigurationError
from ..faults import Faults
from . import sending

log = structlog.get_logger(__name__)

PARTITION_RECHECK = 10.0  # seconds between looks at an unpartitioned stream's settings


class Publisher:
    """One streamer's publishing services, shared by its captures. Not thread-safe, except :meth:`send_all` and
    :meth:`partitions_of`, which a capture may run in a helper thread while its own thread uses nothing else of the
    Redis client, nor of this publisher.

    ``redis`` returns the streamer's Redis client (connecting it if needed); ``default_stream`` is the stream of
    records staged without one; ``faults`` may be replaced between passes.
    """

    def __init__(
        self,
        redis: Callable[[], engine.RedisStreams],
        *,
        name: str,
        default_stream: str,
        faults: Faults,
        wait_replicas: int,
        wait_timeout_ms: int,
    ) -> None:
        self.name = name
        self.default_stream = default_stream
        self.faults = faults
        self.wait_replicas, self.wait_timeout_ms = wait_replicas, wait_timeout_ms
        self._redis = redis
        self.owned: set[str] = set()  # streams this streamer's session publishes (their bucket's lock held)
        self.buckets: set[int] = set()  # the stream buckets whose lock the session holds whole (unilog.store.locks)
        self.shared: set[int] = set()  # ... holds shared, with the own lock of each stream of them it publishes
        self.locked: set[str] = set()  # the streams whose own lock the session holds
        self.listed = False  # limited to listed streams: their buckets are held shared, each stream's own lock too
        self.standby = False  # found a stream held by another streamer: looks for its lock, not for commits
        self.published_total = 0
        self._identity: store.ProducerIdentity | None = None
        self._last_seq: dict[str, int] = {}  # valid while we hold the stream's lock and our commits succeed
        self._partition_counts: dict[str, tuple[int, float]] = {}

    def session_opened(self, conn: psycopg.Connection[Any]) -> None:
        """A new Postgres session: locks died with the old one; a restored database starts a new epoch."""
        self.release()
        self._last_seq.clear()
        self._identity, new_epoch = store.resolve_identity(conn)
        if new_epoch:
            log.warning(
                "database was restored or copied: new producer epoch",
                producer=self._identity.producer_id,
                epoch=self._identity.epoch,
            )

    def release(self) -> None:
        """Forget the streams whose lock the session held (a closed or new session holds none), and their positions:
        another streamer may publish them meanwhile, and positions remembered from before would be reused (Redis
        would then skip the new records as present: lost)."""
        metrics.locks_held(self.owned, False)
        self._last_seq.clear()
        self.owned.clear()
        self.buckets.clear()
        self.shared.clear()
        self.locked.clear()

    def let_go(self, conn: psycopg.Connection[Any]) -> None:
        """Release the locks of the buckets and streams this session holds, now (committed): it publishes none of
        them any more. For a WAL-mode streamer refused the slot, whose passes before (the rows staged before the
        slot) took buckets the streamer of the slot needs. Nothing of it is in flight: a pass saves every batch it
        sent before it returns."""
        if not self.buckets and not self.shared:
            return
        store.release_stream_locks(conn, self.buckets, self.shared, self.locked)
        conn.commit()
        log.info("stream buckets released", buckets=len(self.buckets | self.shared), streamer=self.name)
        self.release()

    def identity(self) -> store.ProducerIdentity:
        """This database's producer identity, as resolved when the Postgres session opened."""
        assert self._identity is not None, "connect first"
        return self._identity

    def stream_of(self, source: str) -> str:
        """The stream a staged row's ``stream`` column names (empty: the default stream)."""
        return source or self.default_stream

    def connect(self) -> engine.RedisStreams:
        """The Redis client, connected and checked now, in the calling thread."""
        return self._redis()

    def in_doubt(self, conn: psycopg.Connection[Any]) -> list[str]:
        """Streams where Redis holds positions of this producer that Postgres has not committed (a batch in flight:
        only the capture that sent it can re-send it under the same positions), or with a table-mode claim saved and
        not yet deleted (its batch may be in Redis). Ends ``conn``'s transaction."""
        identity = self.identity()
        positions = store.published_positions(conn)
        claimed = [self.stream_of(source) for source in store.any_pending_claims(conn)]
        conn.commit()
        return sorted(set(unsaved_batches(self._redis(), identity, positions)) | set(claimed))

    # -- stream locks and positions ----------------------------------------------------------------------------------

    def owns(self, conn: psycopg.Connection[Any], stream: str) -> bool:
        """Whether this streamer publishes ``stream`` (its bucket's lock taken now if free)."""
        return stream in self.owns_all(conn, [stream])

    def owns_all(self, conn: psycopg.Connection[Any], streams: Iterable[str]) -> set[str]:
        """Which of ``streams`` this streamer publishes: those in buckets it holds whole, the free buckets' locks
        taken now in one statement (one log line for all of them, never one per stream). A bucket that a streamer
        limited to listed streams holds shared is taken shared too, with the own lock of each stream of it published
        here: the listed streams stay the other's, the rest are published here. A streamer limited to listed streams
        (``listed``) holds every bucket of its shared. Commits ``conn``."""
        wanted = set(streams)
        new = wanted - self.owned
        if not new:
            return wanted
        bucket_of = {s: store.stream_bucket(s) for s in new}
        buckets = set(bucket_of.values()) - self.buckets - self.shared
        taken = set() if self.listed else store.try_bucket_locks(conn, buckets)
        shared = store.try_bucket_locks(conn, buckets - taken, shared=True)
        self.buckets |= taken
        self.shared |= shared
        whole = {s for s, bucket in bucket_of.items() if bucket in self.buckets}
        # a streamer of a version before buckets, or one limited to listed streams, may hold some of them
        got = whole - store.stream_locks_held_elsewhere(conn, whole)
        own = {s for s in new - whole if bucket_of[s] in self.shared and store.try_stream_lock(conn, s)}
        conn.commit()
        self.locked |= own
        got |= own
        self._check_layout(got)
        self.standby = got != new
        if taken or shared:
            held = len(self.buckets | self.shared)
            log.info("stream buckets acquired", buckets=len(taken), shared=len(shared), held=held, streamer=self.name)
        metrics.locks_held(got, True)
        self.owned |= got
        return wanted & self.owned

    def _check_layout(self, streams: set[str]) -> None:
        """Refuse streams with Redis keys in the layout before hash tags (one scan for them all)."""
        if not streams:
            return
        old = self._redis().legacy_keys_many(sorted(streams))
        if old:
            stream, keys = min(old.items())
            raise ConfigurationError(  # retention must see every registration: none may hide under an old name
                f"stream {stream!r} has Redis keys in the layout before hash tags ({', '.join(keys[:3])}): stop "
                f"its consumers and run `unilog stream relayout {stream}` (docs/guides/redis-cluster.md, Redis keys)"
            )

    def settle_dropped(self, conn: psycopg.Connection[Any], stream: str) -> None:
        """A saved claim of ``stream`` was dropped, its rows gone: whatever deleted them, Redis may hold the positions
        the claim was sent under (sent, then its delete waited on a lock and kept it), and Postgres may not. Those
        positions are saved now (in the caller's transaction), from this producer's high-water mark in Redis, so
        the stream's next records take the positions after them: reused, Redis would skip those records as present.
        """
        identity = self.identity()
        count = self.partitions(stream)
        targets = [stream] if count <= 1 else [routing.partition_stream(stream, i) for i in range(count)]
        saved = store.last_published_seqs(conn, targets, identity.epoch)
        marks = self._redis().high_waters(targets, identity.producer_id)
        ahead = {}
        for target in targets:
            mark = marks[target]
            if mark is not None and mark[0] == identity.epoch and mark[1] > saved[target]:
                ahead[target] = mark[1]
        if ahead:
            store.save_positions(conn, identity.epoch, ahead)
            self.forget_positions(ahead)
            log.warning("positions of a dropped claim saved from Redis", streams=ahead, streamer=self.name)

    def next_seq(self, conn: psycopg.Connection[Any], target: str, epoch: int) -> int:
        """The position the next record published on ``target`` gets."""
        if target not in self._last_seq:
            self._last_seq[target] = store.last_published_seq(conn, target, epoch)
        return self._last_seq[target] + 1

    def forget_positions(self, targets: Iterable[str] | None = None) -> None:
        """Positions past the last commit are read from Postgres again: those of ``targets`` (a commit that would
        advance them is about to be tried), or all (a pass failed after assigning some)."""
        if targets is None:
            self._last_seq.clear()
            return
        for target in targets:
            self._last_seq.pop(target, None)

    def remember_positions(self, last_seqs: dict[str, int]) -> None:
        """Positions just committed with their batch's delete."""
        self._last_seq.update(last_seqs)

    def partitions(self, stream: str) -> int:
        """The stream's partition count, from Redis (``unilog stream partition``): cached for good once set (it
        cannot change), and re-read every ``PARTITION_RECHECK`` seconds while the stream is unpartitioned."""
        count, checked = self._partition_counts.get(stream, (1, -PARTITION_RECHECK))
        if count > 1 or time.monotonic() - checked < PARTITION_RECHECK:
            return count
        count = self._redis().partitions(stream)
        self._partition_counts[stream] = (count, time.monotonic())
        return count

    def partitions_of(self, streams: Iterable[str]) -> dict[str, int]:
        """:meth:`partitions` of each of ``streams``, those due for a look read from Redis in one round trip (not one
        per stream: a batch may span thousands)."""
        streams, now = list(streams), time.monotonic()
        due = sorted(
            {
                s
                for s in streams
                if (known := self._partition_counts.get(s)) is None
                or (known[0] <= 1 and now - known[1] >= PARTITION_RECHECK)
            }
        )
        if due:
            for stream, count in self._redis().partitions_many(due).items():
                self._partition_counts[stream] = (count, now)
        return {s: self._partition_counts[s][0] for s in streams}

    # -- sending and counting ----------------------------------------------------------------------------------------

    def send_batches(
        self, batches: list[tuple[str, int, engine.Packed]], identity: store.ProducerIdentity, per_call: int | None
    ) -> int:
        """Append each batch, ``(target, first position, payload)``, deduplicated by position, in one pipelined round
        trip per Redis node (script calls of about ``per_call`` records), in the order given (a target's batches in
        position order); return the entries Redis appended. Raises :class:`~unilog.errors.PublishError` unless Redis
        confirmed every one (:func:`unilog.stream.sending.send_many`)."""
        results = sending.send_many(
            self._redis(), batches, identity, self.wait_replicas, self.wait_timeout_ms, per_call
        )
        if self.faults.armed("streamer.double_send"):
            for target, first, payload in batches:
                if self.faults.fires("streamer.double_send"):
                    self._send(target, identity, first, payload, dedupe=False)
        return sum(result.appended for result in results)

    def send_all(
        self,
        targets: dict[str, engine.Packed],
        identity: store.ProducerIdentity,
        first: dict[str, int],
        per_call: int | None = None,
    ) -> int:
        """Append each target's payload at positions from ``first[target]``; return the entries Redis appended.
        Over several targets, script calls of about ``per_call`` records (None: one), so that Redis serves its other
        clients between them. Raises :class:`~unilog.errors.PublishError` unless Redis confirmed each
        (:func:`unilog.stream.sending.send`)."""
        if len(targets) == 1:
            [(target, payload)] = targets.items()
            appended = self._send(target, identity, first[target], payload, dedupe=True).appended
        else:  # every target's batch in one pipelined round trip, not one per stream
            batches = [(target, first[target], payload) for target, payload in targets.items()]
            results = sending.send_many(
                self._redis(), batches, identity, self.wait_replicas, self.wait_timeout_ms, per_call
            )
            appended = sum(result.appended for result in results)
        if self.faults.armed("streamer.double_send"):
            for target, payload in targets.items():
                if self.faults.fires("streamer.double_send"):
                    self._send(target, identity, first[target], payload, dedupe=False)
        return appended

    def next_seqs(self, conn: psycopg.Connection[Any], targets: Iterable[str], epoch: int) -> dict[str, int]:
        """:meth:`next_seq` of each of ``targets``, those not cached read in one statement."""
        targets = list(targets)
        missing = [t for t in targets if t not in self._last_seq]
        if missing:
            self._last_seq.update(store.last_published_seqs(conn, missing, epoch))
        return {t: self._last_seq[t] + 1 for t in targets}

    def _send(
        self, stream: str, identity: store.ProducerIdentity, first_seq: int, payload: engine.Packed, *, dedupe: bool
    ) -> engine.PublishResult:
        return sending.send(
            self._redis(), stream, identity, first_seq, payload, dedupe, self.wait_replicas, self.wait_timeout_ms
        )

    def counted(self, stream: str, records: int, started: float, first_created_ms: int | None) -> None:
        """``records`` of ``stream`` were published and their rows deleted, by a batch begun at ``started``
        (``time.perf_counter()``): the streamer's total and the publish metrics."""
        self.published_total += records
        metrics.batch_published(stream, records, time.perf_counter() - started, first_created_ms)

    def counted_many(self, records: dict[str, int], started: float, first_created_ms: int | None) -> None:
        """A batch across streams (``records`` per stream) was published and its rows deleted: the streamer's total
        and the publish metrics, the batch observed once (:func:`unilog.metrics.spread_published`)."""
        self.published_total += sum(records.values())
        metrics.spread_published(records, time.perf_counter() - started, first_created_ms)


def settle_unsaved(
    api: engine.RedisStreams,
    conn: psycopg.Connection[Any],
    identity: store.ProducerIdentity,
    sources: dict[str, list[str]],
) -> bool:
    """Settle the batches in doubt from what Redis has: for each stream where Redis holds positions of ``identity``
    past what Postgres saved, find the staged rows those entries were published from (``sources``: each target
    stream's staging sources), delete them and save the positions, in one transaction committed here. Only when
    every such entry is matched by a staged row (same stream, data, action, object, created, key, type, trace):
    otherwise nothing is changed and False is returned (then only the capture that sent the batch can re-send it).
    A record is its content, so two identical rows are interchangeable. For a lost WAL slot, whose batch in flight
    no one can re-read: everything it held is a staged row by then (rows, or messages recovered as rows)."""
    positions = store.published_positions(conn)
    plan: dict[str, tuple[int, list[dict[str, str]]]] = {}
    marks = api.high_waters([stream for stream, _e, _s in positions], identity.producer_id)
    for stream, epoch, last_seq in positions:
        mark = marks[stream]
        if epoch == identity.epoch and mark is not None and mark > (epoch, last_seq):
            entries = api.unsaved_entries(stream, identity.producer_id, epoch, last_seq, mark[1])
            if len(entries) != mark[1] - last_seq:
                conn.rollback()
                return False
            plan[stream] = (mark[1], entries)
    ids = store.match_published(conn, {t: (sources.get(t, [t]), e) for t, (_m, e) in plan.items()})
    if ids is None:
        conn.rollback()
        return False
    store.delete_ids(conn, ids, identity.epoch, {t: m for t, (m, _e) in plan.items()})
    conn.commit()
    return True


def unsaved_batches(
    api: engine.RedisStreams, identity: store.ProducerIdentity, positions: list[tuple[str, int, int]]
) -> list[str]:
    """Streams where Redis holds positions of ``identity`` past what Postgres saved (``positions``: stream, epoch,
    last position, as :func:`unilog.store.published_positions` reads them): a batch sent and not yet saved."""
    doubtful = []
    marks = api.high_waters([stream for stream, _e, _s in positions], identity.producer_id)
    for stream, epoch, last_seq in positions:
        mark = marks[stream]
        if epoch == identity.epoch and mark is not None and mark > (epoch, last_seq):
            doubtful.append(stream)
    return doubtful
