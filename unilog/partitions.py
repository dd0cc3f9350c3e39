"""Partitioned consumers: records with the same key handled in order, by one worker at a time, keys in parallel.

A stream split into P partitions (``unilog stream partition STREAM P``) is published by the streamer as P streams
``STREAM.p0 .. STREAM.p{P-1}``; a record goes to partition ``crc32(key) % P`` (records without a key are spread by
their staged id), with dense positions per partition. A partitioned consumer NAME is P checkpoint consumers,
``NAME.p0 ..``, each reading one partition in order with its checkpoint in the transaction of its effects.

Workers divide the partitions among themselves: each holds a Postgres advisory lock per partition it owns
(released when its session dies, so a killed worker's partitions are free at once), heartbeats in Redis, and
re-balances every ``rebalance_interval``: it takes free partitions up to its fair share, ``ceil(P / live workers)``,
and gives back what it holds beyond it. Because a partition is applied from its committed checkpoint by whoever
owns it, and the checkpoint row is locked while a batch applies, a key's records are applied in stream order,
exactly once, across ownership changes.

Choosing: a consumer group (:mod:`unilog.group`) spreads records over workers one by one, with no order between
them, and recovers a dead worker's records after ``claim_idle_ms``; partitions keep per-key order, recover at once,
but parallelism is capped at P and a slow key slows its whole partition. Like Kafka partitions: pick partitions
when order per aggregate matters, groups when it does not.
"""

from __future__ import annotations

import math
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog

from . import engine, store
from .config import Settings
from .consumer import Consumer, ConsumerConfig, Handler
from .errors import ConfigurationError
from .faults import NO_FAULTS, Faults
from .group import default_worker_name
from .runtime import run_loop

log = structlog.get_logger(__name__)


def partition_of(key: str, count: int) -> int:
    """The partition of ``key`` among ``count``: stable across processes and versions (crc32, not ``hash``)."""
    return zlib.crc32(key.encode()) % count


def partition_stream(stream: str, index: int) -> str:
    """The name of partition ``index`` of ``stream``."""
    return f"{stream}.p{index}"


@dataclass(frozen=True)
class PartitionConfig:
    """A partitioned consumer's identity and pacing; ``name`` prefixes its per-partition checkpoints."""

    name: str
    stream: str | None = None
    worker: str = ""
    batch_size: int = 500
    block_ms: int = 500
    rebalance_interval: float = 1.0
    heartbeat_ttl: float = 5.0
    max_backoff: float = 10.0
    restart_after_crash: bool = True


class PartitionedConsumer:
    """One worker of a partitioned consumer. One thread drives it; run several processes for several workers."""

    def __init__(self, settings: Settings, config: PartitionConfig, handler: Handler, *, faults: Faults = NO_FAULTS):
        self.settings = settings
        self.config = config
        self.stream = config.stream or settings.stream
        self.worker = config.worker or default_worker_name()
        self.handler = handler
        self.faults = faults
        self._locks: psycopg.Connection[Any] | None = None
        self._redis: engine.RedisStreams | None = None
        self._count = 0
        self.owned: dict[int, Consumer] = {}
        self._last_rebalance = 0.0
        self.handled_total = 0

    # -- ownership ---------------------------------------------------------------------------------------------------

    def connect(self) -> None:
        """Connect, read the partition count, and register this worker."""
        if self._redis is None:
            client = engine.connect(self.settings.redis_url, socket_timeout=self.config.block_ms / 1000 + 10)
            engine.ping(client, self.settings.redis_url)
            self._redis = engine.RedisStreams(client)
        if self._locks is None or self._locks.closed:
            self.owned.clear()
            self._locks = store.connect(
                self.settings.conninfo, autocommit=True, application_name=f"unilog-part-{self.worker}"[:63]
            )
        self._count = self._redis.partitions(self.stream)
        if self._count <= 1:
            raise ConfigurationError(
                f"stream {self.stream!r} is not partitioned: run `unilog stream partition {self.stream} N` first"
            )
        self._heartbeat()

    def _heartbeat(self) -> int:
        """Refresh this worker's heartbeat; return the number of live workers."""
        assert self._redis is not None
        key = f"unilog:workers:{self.stream}:{self.config.name}"
        now = time.time()
        client = self._redis.client
        pipe = client.pipeline(transaction=False)
        pipe.zadd(key, {self.worker: now})
        pipe.zremrangebyscore(key, "-inf", now - self.config.heartbeat_ttl)
        pipe.zcard(key)
        return int(pipe.execute()[2])

    def rebalance(self) -> None:
        """Take free partitions up to the fair share and give back any beyond it."""
        assert self._locks is not None
        live = max(1, self._heartbeat())
        fair = math.ceil(self._count / live)
        for index in sorted(self.owned, reverse=True)[: max(0, len(self.owned) - fair)]:
            self._release(index)
        start = zlib.crc32(self.worker.encode()) % self._count  # spread first picks over workers
        for step in range(self._count):
            if len(self.owned) >= fair:
                break
            index = (start + step) % self._count
            if index not in self.owned and self._try_lock(index):
                self._acquire(index)

    def _lock_key(self, index: int) -> str:
        return f"unilog.partition:{self.stream}:{self.config.name}:{index}"

    def _try_lock(self, index: int) -> bool:
        assert self._locks is not None
        row = self._locks.execute(
            "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (self._lock_key(index),)
        ).fetchone()
        return bool(row and row[0])

    def _acquire(self, index: int) -> None:
        config = ConsumerConfig(
            name=f"{self.config.name}.p{index}",
            stream=partition_stream(self.stream, index),
            batch_size=self.config.batch_size,
            block_ms=self.config.block_ms,
            restart_after_crash=self.config.restart_after_crash,
        )
        consumer = Consumer(self.settings, config, self.handler, faults=self.faults)
        consumer.connect()
        self.owned[index] = consumer
        log.info("partition acquired", consumer=self.config.name, partition=index, worker=self.worker)

    def _release(self, index: int) -> None:
        consumer = self.owned.pop(index)
        consumer.close()
        assert self._locks is not None
        self._locks.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (self._lock_key(index),))
        log.info("partition released", consumer=self.config.name, partition=index, worker=self.worker)

    def close(self) -> None:
        """Give back every partition and close connections."""
        for consumer in self.owned.values():
            consumer.close()
        self.owned.clear()
        if self._locks is not None and not self._locks.closed:
            self._locks.close()  # ends the session: every partition lock is released
        self._locks = None
        if self._redis is not None:
            self._redis.client.zrem(f"unilog:workers:{self.stream}:{self.config.name}", self.worker)
            self._redis.close()
            self._redis = None

    def __enter__(self) -> PartitionedConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- work --------------------------------------------------------------------------------------------------------

    def run_once(self) -> int:
        """Re-balance if due, then one batch from every owned partition; wait briefly if all were idle."""
        if self._locks is None or self._redis is None:
            self.connect()
        now = time.monotonic()
        if now - self._last_rebalance >= self.config.rebalance_interval:
            self._last_rebalance = now
            self.rebalance()
        handled = sum(consumer.run_once(block_ms=-1).handled for consumer in list(self.owned.values()))
        self.handled_total += handled
        if not handled:
            self._wait_for_entries()
        return handled

    def drain(self) -> int:
        """Take this worker's share of partitions and consume them until all are caught up; return records handled."""
        self.connect()
        self._last_rebalance = time.monotonic()
        self.rebalance()
        return sum(consumer.drain() for consumer in self.owned.values())

    def _wait_for_entries(self) -> None:
        """Block on all owned partitions at once (one XREAD) so an idle worker wakes within milliseconds."""
        assert self._redis is not None
        if not self.owned:
            time.sleep(self.config.rebalance_interval / 4)
            return
        streams = {c.stream: c.checkpoint.last_id for c in self.owned.values()}
        self._redis.client.xread(streams, count=1, block=min(self.config.block_ms, 250))  # type: ignore[arg-type]

    def run(self, stop_event: threading.Event) -> None:
        """Work until ``stop_event`` is set, finishing the batch in progress first."""
        self.connect()
        label = {"consumer": self.config.name, "worker": self.worker}
        log.info("partition worker started", partitions=self._count, **label)
        run_loop(
            self.run_once,
            stop_event,
            label=label,
            restart_after_crash=self.config.restart_after_crash,
            restart=self._restart,
            on_error=lambda _exc: self._restart(),  # a handler failure: roll back, rebalance, retry from checkpoints
            max_backoff=self.config.max_backoff,
        )
        self.close()
        log.info("partition worker stopped", handled=self.handled_total, **label)

    def _restart(self) -> None:
        self.close()
        self._last_rebalance = 0.0
