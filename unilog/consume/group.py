"""Group consumers, both faces: where users and the rest of unilog import them from.

:class:`GroupConsumer` (threaded) is generated from :class:`AsyncGroupConsumer` (see :mod:`unilog.consume` and
:mod:`unilog.consume._async.group` for the contract); their settings and the rule that picks the records a group
may not have applied yet live in :mod:`unilog.consume.base`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._sync.group import GroupConsumer
from .base import GroupConfig, GroupResult, candidates, default_worker_name

if TYPE_CHECKING:
    from ._async.group import AsyncGroupConsumer


def __getattr__(name: str) -> Any:
    """The asyncio face on first use: a threaded process does not import the asyncio clients (0.2 s of start-up)."""
    if name in {"AsyncGroupConsumer"}:
        return getattr(importlib.import_module("._async.group", __package__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AsyncGroupConsumer", "GroupConfig", "GroupConsumer", "GroupResult", "candidates", "default_worker_name"]
