"""What the loop tells others, as hooks (dramatiq calls them middleware): logging, metrics, ``/healthz`` and
fault injection are not written into any worker.

The loop (:func:`unilog.runtime.serve`, both faces) calls every hook of ``worker.hooks`` in order: ``started``
once, ``before_pass`` and ``passed`` around each pass that succeeded, ``failed`` with the policy's
:class:`~unilog.runtime.policy.Verdict` for each that raised (before the loop acts on it), and ``stopped`` once,
however the loop ends. Hooks run in the worker's thread or event loop and must not block. Add one by subclassing
a worker with ``hooks = (*Worker.hooks, MyHook())``.
"""

from __future__ import annotations

from typing import Any

import structlog

from .. import engine, metrics
from ..health import HEALTH
from .policy import Verdict, health_name

log = structlog.get_logger("unilog.runtime")


class Hook:
    """A loop hook that does nothing: override what you need."""

    def started(self, worker: Any) -> None:
        """The loop starts (after ``connect``)."""

    def before_pass(self, worker: Any) -> None:
        """A pass is about to start; raising here counts as the pass failing."""

    def passed(self, worker: Any, result: Any) -> None:
        """A pass succeeded with ``result``."""

    def failed(self, worker: Any, exc: BaseException, verdict: Verdict, delay: float) -> None:
        """A pass raised ``exc``; the loop will do ``verdict.action`` (after ``delay`` seconds, unless it restarts
        or stops)."""

    def stopped(self, worker: Any) -> None:
        """The loop ended."""


class LogHook(Hook):
    """One log line per failure the loop survives (a stop is the caller's to report: it is raised)."""

    def failed(self, worker: Any, exc: BaseException, verdict: Verdict, delay: float) -> None:
        label = worker.label
        if verdict.action == "restart":
            log.warning("crashed (injected); restarting in-process", point=getattr(exc, "point", None), **label)
        elif verdict.cause == "replicas":
            log.error("too few replicas acknowledged a dead letter; retrying", error=str(exc), retry_in=delay, **label)
        elif verdict.cause == "recreated":
            log.warning("WAL capture slot lost at no cost and re-created; reconnecting", detail=str(exc), **label)
        elif verdict.action == "reconnect":
            advice = {"hint": hint} if (hint := engine.hint(exc)) else {}
            log.error("connection failed; retrying", error=str(exc), retry_in=delay, **advice, **label)
        elif verdict.action == "retry":
            log.error("handler failed; rolled back, retrying", error=str(exc), retry_in=delay, exc_info=exc, **label)


class MetricsHook(Hook):
    """The loop's Prometheus counters: retries by cause, errors by type, back-off seconds, in-process restarts."""

    def failed(self, worker: Any, exc: BaseException, verdict: Verdict, delay: float) -> None:
        kind = worker.kind
        if verdict.action == "restart":
            metrics.RESTARTS.labels(kind).inc()
            return
        if verdict.action == "stop" and not isinstance(exc, Exception):
            return  # an interrupt is no error
        metrics.ERRORS.labels(kind, type(exc).__name__).inc()
        if verdict.action != "stop":
            metrics.RETRIES.labels(kind, verdict.cause).inc()
            metrics.BACKOFF_SECONDS.labels(kind).inc(delay)


class HealthHook(Hook):
    """``/healthz`` and ``/readyz``: each pass turns the loop; a pass that could not reach a server makes it unready
    until one does."""

    def started(self, worker: Any) -> None:
        HEALTH.turned(health_name(worker))  # the loop exists from here: a first pass that hangs fails /healthz too

    def passed(self, worker: Any, result: Any) -> None:
        HEALTH.turned(health_name(worker))

    def failed(self, worker: Any, exc: BaseException, verdict: Verdict, delay: float) -> None:
        HEALTH.turned(health_name(worker), ready=verdict.action != "reconnect", reason=str(exc))

    def stopped(self, worker: Any) -> None:
        HEALTH.stopped(health_name(worker))


class FaultHook(Hook):
    """Fault injection between passes: ``loop.crash_before_pass`` crashes a worker built with ``faults`` before a
    pass starts (the crash every worker must survive by restarting from committed state)."""

    def before_pass(self, worker: Any) -> None:
        faults = getattr(worker, "faults", None)
        if faults is not None:
            faults.crash("loop.crash_before_pass")


DEFAULT_HOOKS: tuple[Hook, ...] = (FaultHook(), LogHook(), MetricsHook(), HealthHook())
