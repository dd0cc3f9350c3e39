"""Checkpoint consumers (threaded face): where users and the rest of unilog import them from.

:class:`Consumer` is generated from the asyncio source with :class:`~unilog.AsyncConsumer` (see
:mod:`unilog.consume`); its settings and results live in :mod:`unilog.consume.base`.
"""

from __future__ import annotations

from ._sync.checkpoint import Consumer
from .base import POISON_POLICIES, ConsumerConfig, ConsumeResult, describe, is_handler_failure
from .records import Batch, Handler, Record, load_handler, load_object
from .resets import positions_through, reset_checkpoint

_is_handler_failure = is_handler_failure  # the names the group workers import
_describe = describe

__all__ = [  # Batch, Handler, Record and the loaders are re-exported: they lived here first
    "POISON_POLICIES",
    "Batch",
    "ConsumeResult",
    "Consumer",
    "ConsumerConfig",
    "Handler",
    "Record",
    "load_handler",
    "load_object",
    "positions_through",
    "reset_checkpoint",
]
