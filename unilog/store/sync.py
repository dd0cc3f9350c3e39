"""The threaded face of the store, under the module name that code generated from the asyncio workers imports
(``from ...store import aio as store`` becomes ``from ...store import sync as store``; see :mod:`unilog.consume`).
The same functions as :mod:`unilog.store.aio`, not awaited."""

from __future__ import annotations

from . import (
    advance_watermarks,
    check_schema,
    claim_identities,
    deadline,
    ensure_checkpoint,
    group_watermarks,
    hold_letter,
    lock_checkpoint,
    save_checkpoint,
    take_held,
    try_prune_lock,
)

__all__ = [
    "advance_watermarks",
    "check_schema",
    "claim_identities",
    "deadline",
    "ensure_checkpoint",
    "group_watermarks",
    "hold_letter",
    "lock_checkpoint",
    "save_checkpoint",
    "take_held",
    "try_prune_lock",
]
