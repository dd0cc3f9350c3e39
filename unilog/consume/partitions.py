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

Choosing: a consumer group (:mod:`unilog.consume.group`) spreads records over workers one by one, with no order between
them, and recovers a dead worker's records after ``claim_idle_ms``; partitions keep per-key order, recover at once,
but parallelism is capped at P and a slow key slows its whole partition. Like Kafka partitions: pick partitions
when order per aggregate matters, groups when it does not.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import zlib
from typing import Any

import structlog

from .. import store
from ..config import Settings
from ..errors import ConfigurationError
from ..faults import NO_FAULTS, Faults
from ..routing import partition_of, partition_stream
from ..runtime import TRANSIENT, Links, Worker
from .consumer import Consumer, Handler
from .settings import PartitionConfig, default_worker_name

__all__ = ["PartitionConfig", "PartitionedConsumer", "partition_of", "partition_stream"]

log = structlog.get_logger(__name__)


class PartitionedConsumer(Worker):
    """One worker of a partitioned consumer. One thread drives it; run several processes for several workers."""

    def __init__(self, settings: Settings, config: PartitionConfig, handler: Handler, *, faults: Faults = NO_FAULTS):
        self.settings = settings
        self.config = config
        self.stream = config.stream or settings.stream
        self.worker = config.worker or default_worker_name()
        self.handler = handler
        self.faults = faults
        self.restart_after_crash = config.restart_after_crash
        self.max_backoff = config.max_backoff
        # an autocommit session that holds this worker's partition locks: they die with it
        self.links = Links(
            settings,
            app_name=f"unilog-part-{self.worker}",
            pg_timeout=None,
            redis_timeout=config.block_ms / 1000 + 10,
            autocommit=True,
            on_pg_connect=self._locks_lost,
        )
        self._count = 0
        self.owned: dict[int, Consumer] = {}
        self._last_rebalance = 0.0
        self.handled_total = 0

    kind = "partition worker"

    @property
    def label(self) -> dict[str, Any]:
        return {"consumer": self.config.name, "worker": self.worker}

    def describe(self) -> dict[str, Any]:
        return {"stream": self.stream, "partitions": self._count}

    def totals(self) -> dict[str, Any]:
        return {"handled": self.handled_total}

    def _locks_lost(self, _conn: object = None) -> None:
        """A new lock session: the old one's partition locks are gone, so are the partitions they guarded."""
        for consumer in self.owned.values():
            consumer.close()
        self.owned.clear()

    # -- ownership ---------------------------------------------------------------------------------------------------

    def connect(self) -> None:
        """Connect, read the partition count, and register this worker."""
        self.links.pg()
        self._count = self.links.redis().partitions(self.stream)
        if self._count <= 1:
            raise ConfigurationError(
                f"stream {self.stream!r} is not partitioned: run `unilog stream partition {self.stream} N` first"
            )
        self._heartbeat()

    def _heartbeat(self) -> int:
        """Refresh this worker's heartbeat; return the number of live workers."""
        return self.links.redis().heartbeat(self.stream, self.config.name, self.worker, self.config.heartbeat_ttl)

    def rebalance(self) -> None:
        """Take free partitions up to the fair share and give back any beyond it."""
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
        return store.try_partition_lock(self.links.pg(), self._lock_key(index))

    def _acquire(self, index: int) -> None:
        config = self.config.partition(index, partition_stream(self.stream, index))
        consumer = Consumer(self.settings, config, self.handler, faults=self.faults)
        consumer.metric_kind = "partition"
        consumer.connect()
        self.owned[index] = consumer
        log.info("partition acquired", consumer=self.config.name, partition=index, worker=self.worker)

    def _release(self, index: int) -> None:
        consumer = self.owned.pop(index)
        consumer.close()
        store.release_partition_lock(self.links.pg(), self._lock_key(index))
        log.info("partition released", consumer=self.config.name, partition=index, worker=self.worker)

    def close(self) -> None:
        """Give back every partition and close connections (ending the lock session releases every lock)."""
        for consumer in self.owned.values():
            consumer.close()
        self.owned.clear()
        redis = self.links.redis_open
        if redis is not None:
            with contextlib.suppress(*TRANSIENT):  # the heartbeat expires by itself if Redis is unreachable
                redis.leave(self.stream, self.config.name, self.worker)
        super().close()

    # -- work --------------------------------------------------------------------------------------------------------

    def before_pass(self) -> None:
        """Re-balance if due: take free partitions up to the fair share, give back any beyond it."""
        now = time.monotonic()
        if now - self._last_rebalance >= self.config.rebalance_interval:
            self._last_rebalance = now
            self.rebalance()

    def run_once(self) -> int:
        """One batch from every owned partition (:meth:`before_pass` or :meth:`rebalance` takes partitions)."""
        handled = sum(consumer.run_once(block_ms=-1).handled for consumer in list(self.owned.values()))
        self.handled_total += handled
        return handled

    def drain(self) -> int:
        """Take this worker's share of partitions and consume them until all are caught up; return records handled."""
        self.connect()
        self._last_rebalance = time.monotonic()
        self.rebalance()
        return sum(consumer.drain() for consumer in self.owned.values())

    def _wait_for_entries(self) -> None:
        """Block on all owned partitions at once (one XREAD) so an idle worker wakes within milliseconds."""
        if not self.owned:
            time.sleep(self.config.rebalance_interval / 4)
            return
        streams = {c.stream: c.load_checkpoint().last_id for c in self.owned.values()}
        self.links.redis().wait_for_entries(streams, min(self.config.block_ms, 250))

    def idle(self, result: int, stop_event: threading.Event) -> None:
        """Nothing handled: wait for entries on the owned partitions."""
        if not result:
            self._wait_for_entries()

    def restart(self) -> None:
        self.close()
        self._last_rebalance = 0.0

    recover = restart

    def on_handler_error(self, exc: Exception) -> bool:
        """A handler failure: the partition's batch was rolled back; retry from the checkpoints, keeping each
        partition consumer (it counts its batch's failures towards its poison policy)."""
        for consumer in self.owned.values():
            consumer.on_handler_error(exc)
        return True

    def stopped(self) -> None:
        self.close()
