"""unilog: a transactional outbox / unified log for Postgres-backed Python apps, streamed into Redis Streams.

Producers stage records inside their own transaction with :func:`emit`; the :class:`Streamer` moves committed
records into Redis Streams; :class:`Consumer` runs a handler whose effects and checkpoint commit together, and
:class:`GroupConsumer` and :class:`PartitionedConsumer` share a stream between workers. All four long-running
processes implement :class:`Worker`. Every error unilog raises is a :class:`UnilogError` (injected crashes, a
:class:`BaseException`, excepted).
"""

from __future__ import annotations

__version__ = "0.1.0"

from typing import TYPE_CHECKING

from .config import Settings
from .errors import (
    ConcurrentConsumer,
    ConfigurationError,
    DataLoss,
    HandlerNotFound,
    HorizonHeld,
    IncompatibleTable,
    InjectedCrash,
    InvalidRecord,
    InvalidStreamName,
    MalformedEntry,
    MigrationFailed,
    NotInTransaction,
    PayloadNotSerializable,
    PayloadTooLarge,
    PoisonRecord,
    PolicyStop,
    PublishError,
    SchemaMissing,
    ServerUnreachable,
    StreamGap,
    StreamRewound,
    UnilogError,
)

if TYPE_CHECKING:
    from .consume.consumer import AsyncConsumer, Consumer, ConsumerConfig
    from .consume.group import AsyncGroupConsumer, GroupConfig, GroupConsumer
    from .consume.partitions import AsyncPartitionedConsumer, PartitionConfig, PartitionedConsumer
    from .consume.records import Batch, Handler, Record
    from .faults import Faults
    from .produce.encoding import RawJSON
    from .produce.producer import Producer, emit, emit_many
    from .produce.producer_async import emit_async, emit_many_async
    from .runtime import Worker
    from .stream.streamer import Streamer, StreamerConfig

# Imported on first use: `import unilog.spark` in each of Spark's Python workers, or a web app that only emits, does
# not pay for the consumers, SQLAlchemy and the asyncio clients (1.4 s of a cold start here, against 0.3 s).
_LAZY = {
    "Consumer": "consume.consumer",
    "ConsumerConfig": "consume.consumer",
    "AsyncConsumer": "consume.consumer",
    "Faults": "faults",
    "GroupConfig": "consume.group",
    "GroupConsumer": "consume.group",
    "AsyncGroupConsumer": "consume.group",
    "PartitionConfig": "consume.partitions",
    "PartitionedConsumer": "consume.partitions",
    "AsyncPartitionedConsumer": "consume.partitions",
    "Producer": "produce.producer",
    "RawJSON": "produce.encoding",
    "emit": "produce.producer",
    "emit_many": "produce.producer",
    "emit_async": "produce.producer_async",
    "emit_many_async": "produce.producer_async",
    "Batch": "consume.records",
    "Handler": "consume.records",
    "Record": "consume.records",
    "Worker": "runtime",
    "Streamer": "stream.streamer",
    "StreamerConfig": "stream.streamer",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'unilog' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


# What the docs (docs/reference/api.md) tell users to use, and nothing else (tests/test_api_surface.py keeps the
# two in step).
__all__ = [
    "AsyncConsumer",
    "AsyncGroupConsumer",
    "AsyncPartitionedConsumer",
    "Batch",
    "ConcurrentConsumer",
    "ConfigurationError",
    "Consumer",
    "ConsumerConfig",
    "DataLoss",
    "Faults",
    "GroupConfig",
    "GroupConsumer",
    "Handler",
    "HandlerNotFound",
    "HorizonHeld",
    "IncompatibleTable",
    "InjectedCrash",
    "InvalidRecord",
    "InvalidStreamName",
    "MalformedEntry",
    "MigrationFailed",
    "NotInTransaction",
    "PartitionConfig",
    "PartitionedConsumer",
    "PayloadNotSerializable",
    "PayloadTooLarge",
    "PoisonRecord",
    "PolicyStop",
    "Producer",
    "PublishError",
    "RawJSON",
    "Record",
    "SchemaMissing",
    "ServerUnreachable",
    "Settings",
    "StreamGap",
    "StreamRewound",
    "Streamer",
    "StreamerConfig",
    "UnilogError",
    "Worker",
    "__version__",
    "emit",
    "emit_async",
    "emit_many",
    "emit_many_async",
]
