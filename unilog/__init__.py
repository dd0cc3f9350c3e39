"""unilog: a transactional outbox / unified log for Postgres-backed Python apps, streamed into Redis Streams.

Producers stage records inside their own transaction with :func:`emit`; the :class:`Streamer` moves committed
records into Redis Streams; :class:`Consumer` runs a handler whose effects and checkpoint commit together, and
:class:`GroupConsumer` and :class:`PartitionedConsumer` share a stream between workers. All four long-running
processes implement :class:`Worker`. Every error unilog raises is a :class:`UnilogError` (injected crashes, a
:class:`BaseException`, excepted).
"""

from __future__ import annotations

__version__ = "0.1.0"

from .config import Settings
from .consumer import Consumer, ConsumerConfig
from .consumer_async import AsyncConsumer
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
from .faults import Faults
from .group import GroupConfig, GroupConsumer
from .group_async import AsyncGroupConsumer
from .partitions import PartitionConfig, PartitionedConsumer
from .producer import Producer, emit
from .producer_async import emit_async
from .records import Batch, Handler, Record
from .runtime import Worker
from .streamer import Streamer, StreamerConfig

# What the README tells users to use, and nothing else (tests/test_api_surface.py keeps the two in step).
__all__ = [
    "AsyncConsumer",
    "AsyncGroupConsumer",
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
]
