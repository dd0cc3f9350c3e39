"""Group consumers, both faces: where users and the rest of unilog import them from.

:class:`GroupConsumer` (threaded) is generated from :class:`AsyncGroupConsumer` (see :mod:`unilog.consume` and
:mod:`unilog.consume._async.group` for the contract); their settings and the rule that picks the records a group
may not have applied yet live in :mod:`unilog.consume.base`.
"""

from __future__ import annotations

from ._async.group import AsyncGroupConsumer
from ._sync.group import GroupConsumer
from .base import GroupConfig, GroupResult, candidates, default_worker_name

__all__ = ["AsyncGroupConsumer", "GroupConfig", "GroupConsumer", "GroupResult", "candidates", "default_worker_name"]
