"""What every long-running unilog process shares: the worker contract, its two connections, its one loop and the
one failure policy.

One source, two faces: :mod:`unilog.runtime._async.loop` is written once, as asyncio code (:class:`AsyncWorker`,
:class:`AsyncLinks`, :func:`serve`), and ``tools/faces.py`` generates the threaded face from it
(:mod:`unilog.runtime._sync.loop`: :class:`Worker`, :class:`Links`, the same :func:`serve`). The policy
(:mod:`~unilog.runtime.policy`) and the loop's hooks (:mod:`~unilog.runtime.hooks`: logging, metrics, health,
fault injection) are plain code both faces call.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._sync.loop import Links, Worker, serve
from .hooks import DEFAULT_HOOKS, Hook, Hooks
from .policy import FATAL, TRANSIENT, Backoff, Verdict, account_batch, decide, fatal, health_name

if TYPE_CHECKING:
    from ._async.loop import AsyncLinks, AsyncWorker
    from ._async.loop import serve as serve_async

# The asyncio face is imported on first use: a threaded process (the streamer, a threaded consumer) does not pay for
# redis-py's and psycopg's asyncio clients (0.2 s of its start-up here).
_ASYNC = {"AsyncLinks": "AsyncLinks", "AsyncWorker": "AsyncWorker", "serve_async": "serve"}


def __getattr__(name: str) -> Any:
    if name in _ASYNC:
        return getattr(importlib.import_module("._async.loop", __name__), _ASYNC[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_HOOKS",
    "FATAL",
    "TRANSIENT",
    "AsyncLinks",
    "AsyncWorker",
    "Backoff",
    "Hook",
    "Hooks",
    "Links",
    "Verdict",
    "Worker",
    "account_batch",
    "decide",
    "fatal",
    "health_name",
    "serve",
    "serve_async",
]
