"""The partition worker: one worker of a partitioned consumer, taking its share of the partitions and consuming each
with a checkpoint consumer of its own (see :mod:`unilog.consume.partitions` for what partitions guarantee).

One source, two faces: this module is written once, as asyncio code under ``_async/``, and generated for threads
under ``_sync/`` (see :mod:`unilog.consume`).
"""

from __future__ import annotations

import contextlib
import math
import time
import zlib
from typing import Any

import structlog

from ..._acompat import AEvent, asleep
from ...config import Settings
from ...engine.aio import AsyncRedisStreams
from ...errors import ConfigurationError
from ...faults import NO_FAULTS, Faults
from ...routing import partition_stream
from ...runtime._async.loop import AsyncLinks, AsyncWorker
from ...runtime.policy import TRANSIENT
from ...store import aio as store
from ..base import is_handler_failure
from ..records import AsyncHandler
from ..settings import PartitionConfig, default_worker_name
from ..typed import typed_handler
from .checkpoint import AsyncConsumer

log = structlog.get_logger("unilog.consume.partitions")


class AsyncPartitionedConsumer(AsyncWorker):
    """One worker of a partitioned consumer. One thread (or task) drives it; run several for several workers."""

    kind = "partition worker"

    def __init__(
        self, settings: Settings, config: PartitionConfig, handler: AsyncHandler, *, faults: Faults = NO_FAULTS
    ) -> None:
        self.settings = settings
        self.config = config
        self.stream = config.stream or settings.stream
        self.worker = config.worker or default_worker_name()
        self.handler = typed_handler(handler)  # a handler annotated with record types is handed instances
        self.faults = faults
        self.restart_after_crash = config.restart_after_crash
        self.max_backoff = config.max_backoff
        # an autocommit session that holds this worker's partition locks: they die with it
        self.links = AsyncLinks(
            settings,
            app_name=f"unilog-part-{self.worker}",
            pg_timeout=None,
            redis_timeout=config.block_ms / 1000 + 10,
            autocommit=True,
            on_pg_connect=self._locks_lost,
        )
        self._count = 0
        self.owned: dict[int, AsyncConsumer] = {}
        self._lost: list[AsyncConsumer] = []  # consumers whose partition lock died with a session: closed next
        self._last_rebalance = 0.0
        self.handled_total = 0

    @property
    def label(self) -> dict[str, Any]:
        return {"consumer": self.config.name, "worker": self.worker}

    def describe(self) -> dict[str, Any]:
        return {"stream": self.stream, "partitions": self._count}

    def totals(self) -> dict[str, Any]:
        return {"handled": self.handled_total}

    def _locks_lost(self, _conn: object = None) -> None:
        """A new lock session: the old one's partition locks are gone, so are the partitions they guarded (their
        consumers are closed before the next pass)."""
        self._lost.extend(self.owned.values())
        self.owned.clear()

    async def _close_lost(self) -> None:
        lost, self._lost = self._lost, []
        for consumer in lost:
            await consumer.close()

    # -- ownership ---------------------------------------------------------------------------------------------------

    async def connect(self) -> None:
        """Connect, read the partition count, and register this worker."""
        await self.links.pg()
        await self._close_lost()
        self._count = await (await self.links.redis()).partitions(self.stream)
        if self._count <= 1:
            raise ConfigurationError(
                f"stream {self.stream!r} is not partitioned: run `unilog stream partition {self.stream} N` first"
            )
        await self._heartbeat()

    async def _heartbeat(self) -> int:
        """Refresh this worker's heartbeat; return the number of live workers."""
        api = await self.links.redis()
        return await api.heartbeat(self.stream, self.config.name, self.worker, self.config.heartbeat_ttl)

    async def rebalance(self) -> None:
        """Take free partitions up to the fair share and give back any beyond it."""
        live = max(1, await self._heartbeat())
        fair = math.ceil(self._count / live)
        for index in sorted(self.owned, reverse=True)[: max(0, len(self.owned) - fair)]:
            await self._release(index)
        start = zlib.crc32(self.worker.encode()) % self._count  # spread first picks over workers
        for step in range(self._count):
            if len(self.owned) >= fair:
                break
            index = (start + step) % self._count
            if index not in self.owned and await self._try_lock(index):
                await self._acquire(index)

    def _lock_key(self, index: int) -> str:
        return f"unilog.partition:{self.stream}:{self.config.name}:{index}"

    async def _try_lock(self, index: int) -> bool:
        conn = await self.links.pg()
        await self._close_lost()
        return await store.try_partition_lock(conn, self._lock_key(index))

    async def _acquire(self, index: int) -> None:
        config = self.config.partition(index, partition_stream(self.stream, index))
        consumer = AsyncConsumer(self.settings, config, self.handler, faults=self.faults)
        consumer.metric_kind = "partition"
        await consumer.connect()
        self.owned[index] = consumer
        log.info("partition acquired", consumer=self.config.name, partition=index, worker=self.worker)

    async def _release(self, index: int) -> None:
        consumer = self.owned.pop(index)
        await consumer.close()
        await store.release_partition_lock(await self.links.pg(), self._lock_key(index))
        log.info("partition released", consumer=self.config.name, partition=index, worker=self.worker)

    async def close(self) -> None:
        """Give back every partition and close connections (ending the lock session releases every lock)."""
        self._locks_lost()
        await self._close_lost()
        redis_api = self.links.redis_open
        if redis_api is not None:
            with contextlib.suppress(*TRANSIENT):  # the heartbeat expires by itself if Redis is unreachable
                await redis_api.leave(self.stream, self.config.name, self.worker)
        await self.links.close()

    # -- work --------------------------------------------------------------------------------------------------------

    async def prepare_pass(self, drain: bool) -> None:
        """Re-balance if due, and before every pass of burst mode (a drain takes this worker's share now): take free
        partitions up to the fair share, give back any beyond it."""
        now = time.monotonic()
        if drain or now - self._last_rebalance >= self.config.rebalance_interval:
            self._last_rebalance = now
            await self.rebalance()

    async def run_once(self) -> int:
        """One batch from every owned partition (:meth:`prepare_pass` or :meth:`rebalance` takes partitions)."""
        handled = 0
        for consumer in list(self.owned.values()):
            handled += (await consumer.run_once(block_ms=-1)).handled
        self.handled_total += handled
        return handled

    async def drain_pass(self) -> tuple[int, bool]:
        """Burst mode in one pass: consume each partition of this worker's share (taken by :meth:`prepare_pass`)
        until it is caught up."""
        handled = 0
        for consumer in list(self.owned.values()):
            handled += await consumer.drain()
        return handled, True

    async def _wait_for_entries(self, api: AsyncRedisStreams) -> None:
        """Block on all owned partitions at once (one XREAD) so an idle worker wakes within milliseconds."""
        streams = {c.stream: (await c.load_checkpoint()).last_id for c in self.owned.values()}
        await api.wait_for_entries(streams, min(self.config.block_ms, 250))

    async def idle(self, result: int, stop_event: AEvent) -> None:
        """Nothing handled: wait for entries on the owned partitions."""
        if result:
            return
        if not self.owned:
            await asleep(self.config.rebalance_interval / 4)
            return
        await self._wait_for_entries(await self.links.redis())

    async def restart(self) -> None:
        await self.close()
        self._last_rebalance = 0.0

    async def recover(self) -> None:
        await self.restart()

    def is_handler_failure(self, exc: Exception) -> bool:
        """A partition consumer's handler failure (its batch was rolled back), as a checkpoint consumer judges it:
        any other exception is the infrastructure's or a stop, as for every worker."""
        return is_handler_failure(exc)

    def after_handler_failure(self, exc: Exception) -> None:
        """Retry from the checkpoints, keeping each partition consumer (it counts its batch's failures towards its
        poison policy)."""
        for consumer in self.owned.values():
            consumer.after_handler_failure(exc)
