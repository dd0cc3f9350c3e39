"""Checkpoint consumers, both faces: where users and the rest of unilog import them from.

:class:`Consumer` (threaded) is generated from :class:`AsyncConsumer` (``async def handler(conn, records)`` on a
psycopg ``AsyncConnection``; ``asyncio.create_task(consumer.run(stop))`` beside a web app's own tasks, or
``unilog consume module:async_handler``), see :mod:`unilog.consume`; their settings and results live in
:mod:`unilog.consume.base`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._sync.checkpoint import Consumer
from ._sync.multi import MultiConsumer
from .base import POISON_POLICIES, ConsumerConfig, ConsumeResult
from .records import AsyncHandler, Batch, Handler, Record, load_handler, load_object
from .resets import positions_through, reset_checkpoint

if TYPE_CHECKING:
    from ._async.checkpoint import AsyncConsumer
    from ._async.multi import AsyncMultiConsumer


def __getattr__(name: str) -> Any:
    """The asyncio face on first use: a threaded process does not import the asyncio clients (0.2 s of start-up)."""
    if name in {"AsyncConsumer"}:
        return getattr(importlib.import_module("._async.checkpoint", __package__), name)
    if name in {"AsyncMultiConsumer"}:
        return getattr(importlib.import_module("._async.multi", __package__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [  # Batch, Handler, Record and the loaders are re-exported: they lived here first
    "POISON_POLICIES",
    "AsyncConsumer",
    "AsyncHandler",
    "AsyncMultiConsumer",
    "Batch",
    "ConsumeResult",
    "Consumer",
    "ConsumerConfig",
    "Handler",
    "MultiConsumer",
    "Record",
    "load_handler",
    "load_object",
    "positions_through",
    "reset_checkpoint",
]
