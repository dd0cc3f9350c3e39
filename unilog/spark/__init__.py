"""unilog on Spark: a PySpark data source for the log, and a transactional sink with the same guarantee.

**Source.** ``spark.readStream.format("unilog")`` (and ``spark.read.format("unilog")`` for a bounded range) reads a
stream through a PySpark 4 Python data source. Offsets are stream ids (``{"id": "1700000000000-3"}``, exclusive
start, inclusive end). Each micro-batch is split into partitions of ``entriesPerPartition`` entries (cut by count,
not by time: pipelined ``XADD``s put thousands of entries in one millisecond), read in parallel by the executors;
``maxEntriesPerBatch`` caps a batch. Columns: the same as a Python consumer sees (see :data:`SCHEMA`); ``type`` is a
typed record's ``name@version`` (null for an untyped one), and :func:`typed` reads a row as its record type's class.

With ``consumer`` and ``databaseUrl`` options, a query without a Spark checkpoint starts after that consumer's
checkpoint in Postgres: Spark's checkpoint folder is a cache, Postgres the truth.

**Sink.** :class:`TransactionalSink` is a ``foreachBatch`` function. For each micro-batch it opens one Postgres
transaction, locks the consumer's checkpoint row (two copies of one consumer cannot both apply), keeps only entries
above the checkpoint *by position* (never by Spark's batch id, which goes backwards when the checkpoint folder is
lost), drops double-sent copies, checks no positions are missing, runs the user's effect with the transaction,
saves the checkpoint and commits. A crash anywhere replays the batch with no double effect.

Options (Spark lower-cases option keys; they are read case-insensitively here): ``redisUrl``, ``stream``,
``databaseUrl``, ``consumer``, ``startingId`` (``beginning`` or an id, when no checkpoint), ``endingId`` (batch
reads), ``maxEntriesPerBatch`` (default 10000), ``entriesPerPartition`` (default 25000: a range's fixed cost is a
task, an Arrow hand-over and a Redis connection), ``minPartitions`` (default 1; set it to the executors' task slots,
``spark.sparkContext.defaultParallelism``: a batch is cut into a multiple of it, in ranges of equal size). Instead
of ``stream``, ``streams`` (comma-separated) and/or ``streamPrefix`` (with ``maxStreams``, default 1000) read several
streams, offsets being each stream's last id (:mod:`unilog.spark.streams`); the sink then keeps a checkpoint row per
stream.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any, TypeVar, cast

from ..errors import UnreadableRecord
from .columns import SCHEMA
from .datasource import UnilogDataSource, register
from .sink import Effect, TransactionalSink
from .source import (
    SOURCE_NAME,
    EntryRange,
    SourceOptions,
    UnilogBatchReader,
    UnilogStreamReader,
    checkpoint_id,
    read_range,
)

T = TypeVar("T")

__all__ = [
    "SCHEMA",
    "SOURCE_NAME",
    "Effect",
    "EntryRange",
    "SourceOptions",
    "TransactionalSink",
    "UnilogBatchReader",
    "UnilogDataSource",
    "UnilogStreamReader",
    "checkpoint_id",
    "options_json",
    "read_range",
    "register",
    "spark_session",
    "task_slots",
    "typed",
]

REDACT_PASSWORDS = r"(?<=://)[^/@\s:]*:[^/@\s]*(?=@)"  # user:password of scheme://user:password@host


def spark_session(app: str = "unilog", master: str | None = None, conf: Mapping[str, str] | None = None) -> Any:
    """A SparkSession with unilog's source registered and Spark's log noise silenced (WARN and above)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the data source planner reads only this
    builder = SparkSession.builder.appName(app)
    if master:
        builder = builder.master(master)
    # executors' Python workers must have unilog and its dependencies: default to this interpreter (local mode);
    # on a cluster, point spark.pyspark.python at an environment that has unilog installed
    defaults = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        # the source's options carry URLs: Spark redacts what this matches (a URL's password) in plans, the UI and
        # its event logs
        "spark.redaction.string.regex": REDACT_PASSWORDS,
    }
    for key, value in {**defaults, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark


def task_slots(spark: Any) -> int:
    """The session's default parallelism, for the source's ``minPartitions`` (1 where the session has no
    SparkContext to ask, as under Spark Connect)."""
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # pyspark raises its own not-supported error types on Connect sessions
        return 1


def typed(cls: type[T], row: Any) -> T:
    """A row of the source (anything with ``type`` and ``data``: a ``Row``, a pandas row, a dict) read as ``cls``,
    a class declared with :func:`unilog.contracts.record_type`, as a Python consumer reads it
    (:meth:`unilog.Record.typed`): validated, ``Decimal`` exact, older versions through the upcasters; a row of
    another type or an unknown newer version raises :class:`~unilog.errors.UnreadableRecord` (an untyped row is read
    as ``cls``'s version when it has ``cls``'s object and action, as a consumer reads it). Runs where it is
    called: in a ``foreachBatch`` effect on the driver, or in ``mapInPandas``/``mapPartitions`` on the executors."""
    contract = cls.__dict__.get("__unilog_contract__") if isinstance(cls, type) else None
    if contract is None:
        raise TypeError(f"{cls!r} is not a record type: declare it with unilog.contracts.record_type")
    get = row.get if isinstance(row, Mapping) else lambda name: getattr(row, name, None)
    tag, data = get("type"), get("data")
    if not tag:  # an untyped row: of the type's object and action only, read as its version (as Record.typed)
        if (get("object"), get("action")) != (contract.object, contract.action):
            raise UnreadableRecord(f"it is an untyped {get('object')}/{get('action')} record, not {contract.name}")
        return cast(T, contract.decode("null" if data is None else data))
    name, _, version = tag.rpartition("@")
    if name != contract.name or not version.isdigit():
        raise UnreadableRecord(f"it is {tag}, not {contract.name}")
    return cast(T, contract.decode("null" if data is None else data, int(version)))


def options_json(**options: str) -> str:
    """Options as JSON (for logs)."""
    return json.dumps(options, sort_keys=True)
