"""Group consumers (threaded face): where users and the rest of unilog import them from.

:class:`GroupConsumer` is generated from the asyncio source with :class:`~unilog.AsyncGroupConsumer` (see
:mod:`unilog.consume` and :mod:`unilog.consume._async.group` for the contract); its settings and the rule that picks
the records a group may not have applied yet live in :mod:`unilog.consume.base`.
"""

from __future__ import annotations

from ._sync.group import GroupConsumer
from .base import GroupConfig, GroupResult, candidates, default_worker_name

__all__ = ["GroupConfig", "GroupConsumer", "GroupResult", "candidates", "default_worker_name"]
