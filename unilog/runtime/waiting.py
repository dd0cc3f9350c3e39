"""Waiting for the servers outside a worker's loop: what a long-running process does before its loop starts (a
consumer placing a new group, a backfill reading its cursor) or beside it (the Spark sink's micro-batch).

:func:`wait_for_servers` runs a step until it succeeds, through the one loop (:func:`unilog.runtime.serve`), the one
policy (:func:`unilog.runtime.policy.decide`) and the one back-off, as a :class:`ServerWait` worker whose only
pass is the step: there is no second retry loop. A failure the loop would retry (a server unreachable, restarting,
ending the session, failing over; a dead letter too few replicas acknowledged) is one log line, ``/readyz`` unready
and a retry after the back-off; any other failure is raised at once, as the step raised it. A burst (``--once``)
does not call it: it stops at the first failure, with its exit code.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from threading import Event
from typing import Any, ClassVar, Generic, TypeVar

import structlog

from .. import engine
from ..health import HEALTH
from ._sync.loop import Worker, serve
from .hooks import Hook
from .policy import Verdict

log = structlog.get_logger("unilog.runtime")

T = TypeVar("T")


class WaitHook(Hook):
    """A :class:`ServerWait`'s only hook: one line per failure the loop waits out, and ``/readyz`` held back under
    the wait's name until the step succeeds or its failure is raised. A failure the loop stops at is raised here as
    it was (a driver's refusal keeps its type and traceback for a Spark job's own handlers, where the loop would
    raise its one-line error), and so is any failure past ``give_up_after``, whatever the policy's verdict."""

    def on_failure(self, worker: Any, exc: BaseException, verdict: Verdict, delay: float) -> None:
        if verdict.action == "stop" or worker.given_up():
            raise exc
        error = " ".join(str(exc).split()) or type(exc).__name__
        advice = {"hint": hint} if (hint := engine.hint(exc)) else {}
        log.error("waiting for the servers; retrying", step=worker.name, error=error, retry_in=delay,
                  **advice, **worker.label)  # fmt: skip
        HEALTH.unready(worker.name, error)

    def on_stop(self, worker: Any) -> None:
        HEALTH.reached(worker.name)


class ServerWait(Worker, Generic[T]):
    """A worker whose one pass is ``step()``; the loop stops it once the step succeeded (:attr:`result`). It holds
    no connection of its own (the step opens what it needs), so reconnecting drops nothing; past ``give_up_after``
    seconds of failures its hook raises the next one."""

    kind: ClassVar[str] = "server wait"
    default_hooks: ClassVar[tuple[Hook, ...]] = (WaitHook(),)
    restart_after_crash = False

    def __init__(
        self, step: Callable[[], T], name: str, label: dict[str, Any], max_backoff: float, give_up_after: float | None
    ) -> None:
        self.step, self.name, self._label, self.max_backoff = step, name, label, max_backoff
        self._give_up_at = None if give_up_after is None else time.monotonic() + give_up_after
        self.done, self.result = Event(), None

    def given_up(self) -> bool:
        """Whether ``give_up_after`` seconds have passed since the wait began."""
        return self._give_up_at is not None and time.monotonic() > self._give_up_at

    @property
    def label(self) -> dict[str, Any]:
        return self._label

    def connect(self) -> None:
        pass

    def run_once(self) -> None:
        self.result = self.step()  # type: ignore[assignment]
        self.done.set()

    def drain_pass(self) -> tuple[int, bool]:
        self.run_once()
        return 0, True

    def close(self) -> None:
        pass


def wait_for_servers(
    step: Callable[[], T],
    *,
    name: str,
    max_backoff: float = 10.0,
    give_up_after: float | None = None,
    **label: Any,
) -> T:
    """``step()``, retried after the loop's back-off (0.1 s doubling up to ``max_backoff``) while the policy would
    retry after its failure; each failure is one line (``waiting for the servers; retrying``, with ``name``,
    ``label`` and the error) and holds ``/readyz`` back under ``name`` until the step succeeds. ``give_up_after``
    seconds of failures: the last one is raised."""
    wait: ServerWait[T] = ServerWait(step, name, label, max_backoff, give_up_after)
    serve(wait, wait.done)
    return wait.result  # type: ignore[return-value]
