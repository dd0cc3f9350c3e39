"""What every long-running unilog process shares: the worker contract, its two connections, its one loop and the
one failure policy.

One source, two faces: :mod:`unilog.runtime._async.loop` is written once, as asyncio code (:class:`AsyncWorker`,
:class:`AsyncLinks`, :func:`serve`), and ``tools/faces.py`` generates the threaded face from it
(:mod:`unilog.runtime._sync.loop`: :class:`Worker`, :class:`Links`, the same :func:`serve`). The policy
(:mod:`~unilog.runtime.policy`) and the loop's hooks (:mod:`~unilog.runtime.hooks`: logging, metrics, health,
fault injection) are plain code both faces call.
"""

from __future__ import annotations

from ._async.loop import AsyncLinks, AsyncWorker
from ._async.loop import serve as serve_async
from ._sync.loop import Links, Worker, serve
from .hooks import DEFAULT_HOOKS, Hook
from .policy import FATAL, TRANSIENT, Backoff, Verdict, account_batch, decide, fatal, health_name

__all__ = [
    "DEFAULT_HOOKS",
    "FATAL",
    "TRANSIENT",
    "AsyncLinks",
    "AsyncWorker",
    "Backoff",
    "Hook",
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
