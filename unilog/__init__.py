"""unilog: a transactional outbox / unified log for Postgres-backed Python apps, streamed into Redis Streams.

Producers stage records inside their own transaction with :func:`emit`; the :class:`Streamer` moves committed
records into Redis Streams; :class:`Consumer` runs a handler whose effects and checkpoint commit together, and
:class:`GroupConsumer` and :class:`PartitionedConsumer` share a stream between workers. All four long-running
processes implement :class:`Worker`. Every error unilog raises is a :class:`UnilogError` (injected crashes, a
:class:`BaseException`, excepted).
"""

from __future__ import annotations

__version__ = "0.1.0"

import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import TYPE_CHECKING, cast

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
    RecordContractViolation,
    SchemaMissing,
    ServerUnreachable,
    StreamGap,
    StreamRewound,
    UnilogError,
    UnknownRecordVersion,
    UnreadableRecord,
)

if TYPE_CHECKING:
    from importlib.abc import Loader

    from .consume.consumer import AsyncConsumer, AsyncMultiConsumer, Consumer, ConsumerConfig, MultiConsumer
    from .consume.group import AsyncGroupConsumer, GroupConfig, GroupConsumer
    from .consume.partitions import AsyncPartitionedConsumer, PartitionConfig, PartitionedConsumer
    from .consume.records import Batch, Handler, Record
    from .faults import Faults
    from .produce.encoding import RawJSON
    from .produce.producer import Producer, emit, emit_many
    from .produce.producer_async import emit_async, emit_many_async
    from .runtime import Worker
    from .stream.settings import StreamerConfig
    from .stream.streamer import Streamer

# Imported on first use: `import unilog.spark` in each of Spark's Python workers, or a web app that only emits, does
# not pay for the consumers, SQLAlchemy and the asyncio clients (1.4 s of a cold start here, against 0.3 s).
_LAZY = {
    "Consumer": "consume.consumer",
    "ConsumerConfig": "consume.consumer",
    "AsyncConsumer": "consume.consumer",
    "MultiConsumer": "consume.consumer",
    "AsyncMultiConsumer": "consume.consumer",
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
    "StreamerConfig": "stream.settings",
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


# Modules that moved into a room, importable by their old names: `import unilog.status` is the very module
# `unilog.ops.status` (the same object, imported when first asked for), so user code, pickles and `python -m` keep
# working with no shim file left at the top of unilog/. A name below an old package maps too (`unilog.dashboard.page`).
MOVED = {
    "unilog.acl": "unilog.ops.acl",
    "unilog.admin": "unilog.ops.admin",
    "unilog.archive": "unilog.spark.archive",
    "unilog.backfill": "unilog.produce.backfill",
    "unilog.dashboard": "unilog.ops.dashboard",
    "unilog.dlq": "unilog.ops.dlq",
    "unilog.exporter": "unilog.ops.exporter",
    "unilog.reconcile": "unilog.spark.reconcile",
    "unilog.schema": "unilog.ops.schema",
    "unilog.spark_columns": "unilog.spark.columns",
    "unilog.status": "unilog.ops.status",
}


class _MovedModules:
    """A meta path finder and loader for :data:`MOVED`: the loader hands back the module under its new name (no
    ``importlib.abc`` base classes: importing them costs a cold start 14 ms)."""

    @staticmethod
    def new_name(name: str) -> str | None:
        """The new name of a module that moved (or of a module below a package that moved), else None."""
        if not name.startswith("unilog."):
            return None
        parts = name.split(".")
        for end in range(len(parts), 1, -1):
            moved = MOVED.get(".".join(parts[:end]))
            if moved is not None:
                return ".".join([moved, *parts[end:]])
        return None

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        return ModuleSpec(name, cast("Loader", self)) if self.new_name(name) is not None else None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        import importlib

        module = importlib.import_module(self.new_name(spec.name) or "")
        spec.loader_state = module.__spec__  # the import system sets __spec__ to the alias's: exec_module undoes it
        return module

    def exec_module(self, module: ModuleType) -> None:
        spec = module.__spec__
        if spec is not None and spec.loader_state is not None:
            module.__spec__ = spec.loader_state


if not any(type(finder).__name__ == "_MovedModules" for finder in sys.meta_path):  # once, even if reloaded
    sys.meta_path.insert(0, _MovedModules())


# What the docs (docs/reference/api.md) tell users to use, and nothing else (tests/test_api_surface.py keeps the
# two in step).
__all__ = [
    "AsyncConsumer",
    "AsyncGroupConsumer",
    "AsyncMultiConsumer",
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
    "MultiConsumer",
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
    "RecordContractViolation",
    "SchemaMissing",
    "ServerUnreachable",
    "Settings",
    "StreamGap",
    "StreamRewound",
    "Streamer",
    "StreamerConfig",
    "UnilogError",
    "UnknownRecordVersion",
    "UnreadableRecord",
    "Worker",
    "__version__",
    "emit",
    "emit_async",
    "emit_many",
    "emit_many_async",
]
