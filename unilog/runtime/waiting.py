"""Waiting for the servers outside a worker's loop: what a long-running process does before its loop starts (a
consumer placing a new group, a backfill reading its cursor) or beside it (the Spark sink's micro-batch).

:func:`wait_for_servers` runs a step until it succeeds: a failure the policy calls transient
(:func:`unilog.runtime.policy.transient`: a server unreachable, restarting, ending the session, failing over) is
one log line, ``/readyz`` unready and a retry after the loop's back-off; any other failure is raised at once. A
burst (``--once``) does not call it: it stops at the first failure, with its exit code.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

from .. import engine
from ..health import HEALTH
from .policy import Backoff, transient

log = structlog.get_logger("unilog.runtime")

T = TypeVar("T")


def wait_for_servers(
    step: Callable[[], T],
    *,
    name: str,
    max_backoff: float = 10.0,
    give_up_after: float | None = None,
    **label: Any,
) -> T:
    """``step()``, retried after the back-off (0.1 s doubling up to ``max_backoff``) while it fails transiently;
    each failure is one line (``waiting for the servers; retrying``, with ``name``, ``label`` and the error) and
    holds ``/readyz`` back under ``name`` until the step succeeds. ``give_up_after`` seconds of failures: the last
    one is raised."""
    backoff, started = Backoff(max_backoff), time.monotonic()
    while True:
        try:
            result = step()
        except Exception as exc:
            if not transient(exc) or (give_up_after is not None and time.monotonic() - started > give_up_after):
                HEALTH.reached(name)
                raise
            error = " ".join(str(exc).split()) or type(exc).__name__
            advice = {"hint": hint} if (hint := engine.hint(exc)) else {}
            log.error("waiting for the servers; retrying", step=name, error=error, retry_in=backoff.delay,
                      **advice, **label)  # fmt: skip
            HEALTH.unready(name, error)
            time.sleep(backoff.delay)
            backoff.grow()
            continue
        HEALTH.reached(name)
        return result
