"""unilog: a transactional outbox / unified log for Postgres-backed Python apps, streamed into Redis Streams.

Producers stage records inside their own transaction with :func:`emit`; the :class:`Streamer` moves committed
records into Redis Streams; :class:`Consumer` runs a handler whose effects and checkpoint commit together.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .config import Settings
from .consumer import Batch, Consumer, ConsumerConfig, Record
from .errors import (
    ConfigurationError,
    InjectedCrash,
    InvalidRecord,
    InvalidStreamName,
    NotInTransaction,
    PayloadNotSerializable,
    PayloadTooLarge,
    SchemaMissing,
    ServerUnreachable,
    UnilogError,
)
from .faults import FaultConfig, Faults
from .producer import Producer, emit
from .streamer import Streamer, StreamerConfig

__all__ = [
    "Batch",
    "ConfigurationError",
    "Consumer",
    "ConsumerConfig",
    "FaultConfig",
    "Faults",
    "InjectedCrash",
    "InvalidRecord",
    "InvalidStreamName",
    "NotInTransaction",
    "PayloadNotSerializable",
    "PayloadTooLarge",
    "Producer",
    "Record",
    "SchemaMissing",
    "ServerUnreachable",
    "Settings",
    "Streamer",
    "StreamerConfig",
    "UnilogError",
    "__version__",
    "emit",
]
