"""The ``unilog`` data source over several streams: ``streams`` (a list) and/or ``streamPrefix`` (streams created
later included), read as :class:`unilog.MultiConsumer` reads them.

An offset is every stream's last id (``{"ids": {"orders": "1700000000000-3", "payments": "0-0"}}``, exclusive start,
inclusive end), so a micro-batch holds, per stream, a range of consecutive entries in stream order; its rows say
their ``stream``. With ``consumer`` and ``databaseUrl``, a query without a Spark checkpoint starts each stream after
the consumer's checkpoint row for it, ``<consumer>:<stream>`` (:func:`unilog.consume.lanes.checkpoint_name`), the
rows :class:`~unilog.spark.TransactionalSink` saves over several streams and a Python ``MultiConsumer`` of the same
name keeps: a consumer can move between the two.

A micro-batch asks each stream for its share of ``maxEntriesPerBatch`` (at least 10 entries: a busy stream among
many idle ones still moves), in one ``XREAD`` over all of them (a pipeline per node on a Redis Cluster). A stream
the prefix finds later is read from its beginning, and enters the offset once it has an entry.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any

import structlog

from .. import engine, store
from ..config import postgres_conninfo
from ..consume.lanes import checkpoint_name, per_stream_count
from ..wire import to_str
from .source import (
    MIN_RANGE,
    DataSourceReader,
    DataSourceStreamReader,
    EntryRange,
    InputPartition,
    SourceOptions,
    read_range,
    split_ranges,
    waited,
)

Offset = dict[str, dict[str, str]]

log = structlog.get_logger(__name__)


def _api(redis_url: str) -> engine.RedisStreams:
    return engine.RedisStreams(engine.connect(redis_url))


def stream_list(options: SourceOptions, known: Iterable[str] = ()) -> list[str]:
    """The streams the source reads now: those given, those ``known`` (an offset's: a stream once read is read on),
    and the prefix's, new ones up to ``maxStreams`` in all (in name order, with a warning for the rest)."""
    names = set(options.streams) | set(known)
    if options.stream_prefix is None:
        return sorted(names)
    api = _api(options.redis_url)
    try:
        found = api.stream_names(options.stream_prefix, options.max_streams + len(names))
    finally:
        api.close()
    new = [name for name in found if name not in names]
    room = max(0, options.max_streams - len(names))
    if len(new) > room:
        log.warning(
            "more streams than maxStreams; reading the first of them",
            prefix=options.stream_prefix,
            max_streams=options.max_streams,
            left_out=len(new) - room,
        )
    return sorted(names | set(new[:room]))


def checkpoint_ids(database_url: str, consumer: str, streams: list[str]) -> dict[str, str]:
    """The stream id consumer ``consumer`` has consumed up to on each of ``streams`` that has its checkpoint row."""
    rows = {checkpoint_name(consumer, stream): stream for stream in streams}
    with store.connect(postgres_conninfo(database_url), application_name=f"unilog-spark-{consumer}"[:63]) as conn:
        found = store.read_checkpoints(conn, sorted(rows))
    return {rows[name]: checkpoint.last_id for name, checkpoint in found.items()}


def hold_retention_many(redis_url: str, consumer: str, last_ids: dict[str, str]) -> None:
    """Hold retention on each stream at its id for ``consumer``'s row on it, in one round trip."""
    if not last_ids:
        return
    api = _api(redis_url)
    try:
        api.register_many({(s, checkpoint_name(consumer, s)): last_id for s, last_id in last_ids.items()})
    finally:
        api.close()


class Ranges(InputPartition):
    """Several streams' small ranges, read by one task: a task per stream of a few entries each cost more in its
    start, hand-over and connection than it read."""

    def __init__(self, ranges: list[EntryRange]) -> None:
        self.ranges = ranges


def pack(options: SourceOptions, after: dict[str, str], found: dict[str, list[str]]) -> list[InputPartition]:
    """The read tasks of a batch (each stream's ids after ``after``): a stream of :data:`MIN_RANGE` entries or more
    cut into ranges as one stream is, the smaller ones packed together into tasks of about ``entriesPerPartition``
    entries (each stream's entries stay in one range, read in order)."""
    tasks: list[InputPartition] = []
    small: list[EntryRange] = []
    size = 0
    for stream, ids in sorted(found.items()):
        if len(ids) >= MIN_RANGE:
            tasks += split_ranges(options, after[stream], ids, stream)
            continue
        small.append(EntryRange(options.redis_url, stream, after[stream], ids[-1]))
        size += len(ids)
        if size >= options.entries_per_partition:
            tasks.append(Ranges(small))
            small, size = [], 0
    if small:
        tasks.append(Ranges(small))
    return tasks


def read_ranges(partition: InputPartition) -> Iterator[Any]:
    """The rows of a task: one range, or several streams' small ranges one after the other."""
    if isinstance(partition, Ranges):
        for one in partition.ranges:
            yield from read_range(one)
    else:
        assert isinstance(partition, EntryRange)
        yield from read_range(partition)


def _key(start: Offset, end: Offset) -> str:
    return json.dumps([start["ids"], end["ids"]], sort_keys=True)


class UnilogStreamsReader(DataSourceStreamReader):
    """Micro-batches over several streams (see the module's docstring)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._planned: dict[str, list[InputPartition]] = {}

    def initialOffset(self) -> Offset:
        """Each stream after the consumer's checkpoint row for it, else ``startingId``; registers the rows for
        retention. The servers are waited for (:func:`~unilog.spark.source.waited`), as in every call below."""
        return waited(self._initial, "initial offset")

    def _initial(self) -> Offset:
        options = self.options
        streams = stream_list(options)
        start = dict.fromkeys(streams, options.starting_id)
        if options.database_url and options.consumer:
            start.update(checkpoint_ids(options.database_url, options.consumer, streams))
            hold_retention_many(options.redis_url, options.consumer, start)
        return {"ids": start}

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadMaxRows

        return ReadMaxRows(self.options.max_entries_per_batch)

    def latestOffset(self, start: Offset | None = None, limit: Any = None) -> Offset:
        """The end of the next batch: each stream's share of the read limit after ``start``."""
        known = dict((start or self.initialOffset())["ids"])
        cap = getattr(limit, "max_rows", None)  # None: read everything (Trigger.AvailableNow's target)
        if limit is None:
            cap = self.options.max_entries_per_batch
        after, found = waited(partial(self._next, known, cap), "latest offset")
        end = dict(known)
        for stream, ids in found.items():
            end[stream] = ids[-1]
        offset = {"ids": end}
        # partitions() for this batch needs no second scan
        self._planned = {_key({"ids": known}, offset): pack(self.options, after, found)}
        return offset

    def _next(self, known: dict[str, str], cap: int | None) -> tuple[dict[str, str], dict[str, list[str]]]:
        """Each stream's last id so far (the streams a prefix finds now included), and the ids of its share."""
        after = {stream: known.get(stream, "0-0") for stream in stream_list(self.options, known)}
        return after, self._ids(after, cap)

    def _ids(self, after: dict[str, str], cap: int | None) -> dict[str, list[str]]:
        """The ids of each stream's share of ``cap`` entries after ``after`` (one ``XREAD``); every id, paged per
        stream, without a cap."""
        if cap is None:
            every = engine.ids_many(self.options.redis_url, {s: (last, "+") for s, last in after.items()}, engine.PAGE)
            return {s: ids for s, ids in sorted(every.items()) if ids}
        api = _api(self.options.redis_url)
        try:
            found = api.read_many(after, per_stream_count(cap, len(after)), None)
        finally:
            api.close()
        return {s: [to_str(entry_id) for entry_id, _ in entries] for s, entries in sorted(found.items()) if entries}

    def partitions(self, start: Offset, end: Offset) -> list[InputPartition]:
        planned = self._planned.pop(_key(start, end), None)
        if planned is not None:
            return planned
        after = {stream: start["ids"].get(stream, "0-0") for stream in end["ids"]}  # a replayed batch (restart)
        ranges = {s: (after[s], until) for s, until in sorted(end["ids"].items()) if until != after[s]}
        found = waited(partial(engine.ids_many, self.options.redis_url, ranges, engine.PAGE), "partitions")
        return pack(self.options, after, found)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_ranges(partition)

    def commit(self, end: Offset) -> None:
        """Nothing to do: progress that matters is committed by the sink, in Postgres."""


class UnilogStreamsBatchReader(DataSourceReader):
    """A bounded read of entries (``startingId``, ``endingId``] of each stream."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        options = self.options
        streams = stream_list(options)
        until = options.ending_id or "+"
        found = engine.ids_many(options.redis_url, dict.fromkeys(streams, (options.starting_id, until)), engine.PAGE)
        after = dict.fromkeys(streams, options.starting_id)
        return pack(options, after, {s: ids for s, ids in found.items() if ids}) or [Ranges([])]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_ranges(partition)
