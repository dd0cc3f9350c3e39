"""The ``unilog`` data source for PySpark 4: micro-batches (and bounded reads) of a Redis stream, offsets being
stream ids, each batch cut into ranges of entries read in parallel by the executors (see :mod:`unilog.spark`)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from .. import engine, store
from ..config import postgres_conninfo
from ..errors import ConfigurationError
from .columns import record_batch

SOURCE_NAME = "unilog"
_STREAM_ID = re.compile(r"\d+(-\d+)?")  # an entry id, or a millisecond time alone

T = TypeVar("T")

# Seconds a call of the source on its servers waits out their transient failure (a restart, a failover, a server not
# up yet: unilog.runtime.policy.transient), one line per retry, as the sink waits per micro-batch; one lasting longer
# fails the micro-batch, and with it the query (its process exits; a supervisor starts it again)
RETRY_FOR = 300.0


def waited(step: Callable[[], T], call: str) -> T:
    """``step()``, a call of the source on Redis or Postgres (``call`` names it in the lines), retried while the
    servers fail transiently, for up to :data:`RETRY_FOR` seconds: a query rides out a restart instead of failing
    (issue 47). A planned batch is read again whole (its ranges by id, so nothing is read twice into it)."""
    from ..runtime.waiting import wait_for_servers  # the runtime only where a query runs

    return wait_for_servers(step, name="spark source", give_up_after=RETRY_FOR, call=call)


try:  # pyspark is optional: everything else in unilog works without it
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceReader,
        DataSourceStreamReader,
        InputPartition,
    )
except ImportError:  # pragma: no cover - exercised only where pyspark is missing
    DataSource = DataSourceReader = DataSourceStreamReader = InputPartition = object  # type: ignore[assignment,misc]


def _option(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    """An option by name, whatever case Spark left it in."""
    for key in (name, name.lower()):
        if key in options:
            return options[key]
    lowered = {k.lower(): v for k, v in options.items()}
    return lowered.get(name.lower(), default)


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, validated. One stream (``stream``), or several: ``streams`` (a comma-separated list)
    and/or ``streamPrefix`` (every stream whose name starts with it, looked for again at every micro-batch, at most
    ``maxStreams``), as :class:`unilog.ConsumerConfig` takes them."""

    redis_url: str
    stream: str
    database_url: str | None
    consumer: str | None
    starting_id: str
    ending_id: str | None
    max_entries_per_batch: int
    entries_per_partition: int
    min_partitions: int = 1
    streams: tuple[str, ...] = ()
    stream_prefix: str | None = None
    max_streams: int = 1000

    @property
    def many(self) -> bool:
        """Whether the source reads several streams (``streams`` or ``streamPrefix``)."""
        return bool(self.streams) or self.stream_prefix is not None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        redis_url = _option(options, "redisUrl") or os.environ.get("REDIS_URL")
        streams = tuple(s.strip() for s in (_option(options, "streams") or "").split(",") if s.strip())
        prefix = _option(options, "streamPrefix") or None
        if _option(options, "stream") and (streams or prefix):
            raise ConfigurationError("the unilog source takes the option stream, or streams and/or streamPrefix")
        stream = "" if streams or prefix else _option(options, "stream") or os.environ.get("UNILOG_STREAM")
        if not redis_url or stream is None or not (stream or streams or prefix):
            raise ConfigurationError("the unilog source needs the options redisUrl and stream (or streams)")
        starting = _option(options, "startingId", "beginning") or "beginning"
        ending = _option(options, "endingId")
        for name, value in (("startingId", starting), ("endingId", ending)):
            if value is not None and value != "beginning" and not _STREAM_ID.fullmatch(value):
                # refused here, once: Redis would refuse each read, and the source waits out only its servers
                raise ConfigurationError(
                    f"the unilog source's option {name} must be a stream id such as 1700000000000-3"
                    f"{' or beginning' if name == 'startingId' else ''}, not {value!r}"
                )
        return cls(
            redis_url=redis_url,
            stream=stream,
            streams=streams,
            stream_prefix=prefix,
            max_streams=max(1, int(_option(options, "maxStreams", "1000") or 1000)),
            database_url=_option(options, "databaseUrl"),
            consumer=_option(options, "consumer"),
            starting_id="0-0" if starting == "beginning" else starting,
            ending_id=ending,
            max_entries_per_batch=int(_option(options, "maxEntriesPerBatch", "10000") or 10000),
            entries_per_partition=max(1, int(_option(options, "entriesPerPartition", "25000") or 25000)),
            min_partitions=max(1, int(_option(options, "minPartitions", "1") or 1)),
        )


class EntryRange(InputPartition):
    """Entries of ``stream`` with ids in (``after``, ``until``]: one read task."""

    def __init__(self, redis_url: str, stream: str, after: str, until: str) -> None:
        self.redis_url, self.stream, self.after, self.until = redis_url, stream, after, until


def ids_after(redis_url: str, stream: str, after: str, limit: int | None, until: str = "+") -> list[str]:
    """Ids of up to ``limit`` entries after ``after`` (and at most ``until``), in order. Read from Redis's raw reply
    (no dict per entry): the planner reads a whole batch just to cut it, so this is on every micro-batch's path."""
    ids: list[str] = []
    page = engine.PAGE if limit is None else max(1, min(engine.PAGE, limit))
    for chunk in engine.raw_pages(redis_url, stream, after, until, page):
        ids += [entry_id.decode() if isinstance(entry_id, bytes) else entry_id for entry_id, _ in chunk]
        if limit is not None and len(ids) >= limit:
            return ids[:limit]
    return ids


MIN_RANGE = 1000  # entries: below this a range costs more in its task, hand-over and connection than it reads


def split_ranges(options: SourceOptions, after: str, ids: list[str], stream: str | None = None) -> list[EntryRange]:
    """Cut the entries (``after``, ids[-1]] into equal ranges of at most ``entries_per_partition`` entries, as many
    as a multiple of ``min_partitions`` (for batches of ``min_partitions * MIN_RANGE`` entries or more): with one
    range per task slot and slots of equal work, no slot idles through the batch's last wave (5 ranges on 2 cores
    took 3 waves, the last on one core)."""
    if not ids:
        return []
    count = -(-len(ids) // options.entries_per_partition)
    if len(ids) >= options.min_partitions * MIN_RANGE:  # a small batch is one task's work: no task per slot
        count = -(-count // options.min_partitions) * options.min_partitions
    ranges, start = [], after
    for k in range(1, count + 1):
        end = ids[len(ids) * k // count - 1]
        ranges.append(EntryRange(options.redis_url, stream or options.stream, start, end))
        start = end
    return ranges


READ_PAGE = 5000  # entries an executor reads per XRANGE, and per Arrow record batch


def read_range(partition: EntryRange) -> Iterator[Any]:
    """The rows of one range, read on an executor, as Arrow record batches (one per ``XRANGE`` page), built column
    by column from Redis's raw reply: Spark takes them as they are (rows as tuples are converted one by one). Each
    page is :func:`waited` for: a Redis restarting mid-range is read on from the page it failed at."""
    cursor = partition.after
    while True:
        chunk: list[Any] = waited(partial(_page, partition, cursor), "read")
        if chunk:
            with engine.no_gc():
                batch = record_batch(partition.stream, chunk)
            yield batch
        if len(chunk) < READ_PAGE:
            return
        cursor = engine.to_str(chunk[-1][0])


def _page(partition: EntryRange, cursor: str) -> list[Any]:
    """The range's page of entries after ``cursor`` (on a client of its own: a failed one is not reused)."""
    return next(engine.raw_pages(partition.redis_url, partition.stream, cursor, partition.until, READ_PAGE), [])


def hold_retention(redis_url: str, stream: str, consumer: str, last_id: str) -> None:
    """Hold retention at ``last_id`` for ``consumer`` (see :meth:`unilog.engine.RedisStreams.register`)."""
    api = engine.RedisStreams(engine.connect(redis_url))
    try:
        api.register(stream, consumer, last_id)
    finally:
        api.close()


def checkpoint_id(database_url: str, consumer: str) -> str | None:
    """The stream id consumer ``consumer`` has consumed up to, per its checkpoint in Postgres (None if none)."""
    with store.connect(postgres_conninfo(database_url), application_name=f"unilog-spark-{consumer}"[:63]) as conn:
        checkpoint = store.read_checkpoint(conn, consumer)
    return checkpoint.last_id if checkpoint else None


class UnilogStreamReader(DataSourceStreamReader):
    """Micro-batches over a Redis stream; offsets are stream ids."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._planned: dict[tuple[str, str], list[str]] = {}

    def initialOffset(self) -> dict[str, str]:
        """After the consumer's checkpoint in Postgres, else ``startingId``; registers the consumer for retention.
        The servers are waited for (:func:`waited`), as in every call below."""
        return waited(self._initial, "initial offset")

    def _initial(self) -> dict[str, str]:
        start = self.options.starting_id
        if self.options.database_url and self.options.consumer:
            stored = checkpoint_id(self.options.database_url, self.options.consumer)
            start = stored if stored is not None else start
            hold_retention(self.options.redis_url, self.options.stream, self.options.consumer, start)
        return {"id": start}

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadMaxRows

        return ReadMaxRows(self.options.max_entries_per_batch)

    def latestOffset(self, start: dict[str, str] | None = None, limit: Any = None) -> dict[str, str]:
        """The end of the next batch: at most the read limit's entries after ``start``.

        Spark may call this before :meth:`initialOffset` on a fresh start (and, before Spark 4.2, without
        arguments); both fall back to the initial offset as the start.
        """
        after = (start or self.initialOffset())["id"]
        cap = getattr(limit, "max_rows", None)
        if limit is None:
            cap = self.options.max_entries_per_batch
        ids = waited(partial(ids_after, self.options.redis_url, self.options.stream, after, cap), "latest offset")
        if not ids:
            return {"id": after}
        self._planned = {(after, ids[-1]): ids}  # partitions() for this batch needs no second scan
        return {"id": ids[-1]}

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> list[EntryRange]:
        key = (start["id"], end["id"])
        ids = self._planned.pop(key, None)
        if ids is None:  # a replayed batch (restart): list its ids again
            replay = partial(ids_after, self.options.redis_url, self.options.stream, start["id"], None, end["id"])
            ids = waited(replay, "partitions")
        return split_ranges(self.options, start["id"], ids)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, EntryRange)
        return read_range(partition)

    def commit(self, end: dict[str, str]) -> None:
        """Nothing to do: progress that matters is committed by the sink, in Postgres."""


class UnilogBatchReader(DataSourceReader):
    """A bounded read of entries (``startingId``, ``endingId``]."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[EntryRange]:
        options = self.options
        ids = ids_after(options.redis_url, options.stream, options.starting_id, None, options.ending_id or "+")
        return split_ranges(self.options, self.options.starting_id, ids) or [
            EntryRange(self.options.redis_url, self.options.stream, "0-0", "0-0")
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, EntryRange)
        if partition.until == "0-0":
            return iter(())
        return read_range(partition)
