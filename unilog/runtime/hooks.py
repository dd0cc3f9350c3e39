"""What the loop tells others, as hooks (dramatiq calls them middleware): logging, metrics, ``/healthz`` and
fault injection are not written into any worker.

The loop (:func:`unilog.runtime.serve`, both faces, ``run`` and ``drain`` alike) calls every hook of
``worker.hooks`` in order: ``on_start`` once, before it connects; ``on_connected`` once the worker connected;
``on_pass_start`` and ``on_pass_end`` around each pass that succeeded; ``on_failure`` with the policy's
:class:`~unilog.runtime.policy.Verdict` for each failure, of connecting or of a pass (before the loop acts on it);
and ``on_stop`` once, however the loop ends. Hooks run in the worker's thread or event loop and must not block.

Every hook method starts with ``on_`` and no worker method does: the worker's own steps (``connect``,
``prepare_pass``, ``run_once``, ``drain_pass``, ``idle``, ``restart``, ``recover``, ``finish``) are what the loop
asks the worker to do; hooks only hear of it. A worker's hooks are its own (:class:`Hooks`): they start as its
class's ``default_hooks`` (:data:`DEFAULT_HOOKS`) and ``worker.hooks.add(hook, before=..., after=...)`` adds one to
that worker alone, in the place given.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import structlog

from .. import engine, metrics
from ..health import HEALTH
from .policy import Verdict, health_name

log = structlog.get_logger("unilog.runtime")

# the hook methods' earlier names: a hook that still defines one is refused (the loop would never call it)
RENAMED = {
    "started": "on_start",
    "before_pass": "on_pass_start",
    "passed": "on_pass_end",
    "failed": "on_failure",
    "stopped": "on_stop",
}


class Hook:
    """A loop hook that does nothing: override what you need."""

    def on_start(self, worker: Any) -> None:
        """The loop starts, before the worker connects."""

    def on_connected(self, worker: Any) -> None:
        """The worker connected (``connect`` returned); raising here counts as connecting failing."""

    def on_pass_start(self, worker: Any) -> None:
        """A pass is about to start; raising here counts as the pass failing."""

    def on_pass_end(self, worker: Any, result: Any) -> None:
        """A pass succeeded with ``result``."""

    def on_failure(self, worker: Any, exc: BaseException, verdict: Verdict, delay: float) -> None:
        """Connecting or a pass raised ``exc``; the loop will do ``verdict.action`` (after ``delay`` seconds, unless
        it restarts or stops)."""

    def on_stop(self, worker: Any) -> None:
        """The loop ended."""


Anchor = Hook | type[Hook]  # a hook, or the first hook of a class


class Hooks:
    """One worker's hooks, in the order the loop calls them. A worker's start as its class's ``default_hooks``;
    adding or removing one changes that worker alone."""

    def __init__(self, hooks: Iterable[Hook] = ()) -> None:
        self._hooks: list[Hook] = []
        for hook in hooks:
            self.add(hook)

    def add(self, hook: Hook, *, before: Anchor | None = None, after: Anchor | None = None) -> Hook:
        """Add ``hook``: last, or just before (just after) ``before`` (``after``), a hook or the first hook of a
        class (``before=HealthHook``); return it. A hook is added once, and at one place."""
        if not isinstance(hook, Hook):
            raise TypeError(f"{hook!r} is not a unilog.runtime.Hook")
        if old := sorted(name for name in RENAMED if hasattr(hook, name)):
            renamed = ", ".join(f"{name} is now {RENAMED[name]}" for name in old)
            raise TypeError(f"{type(hook).__name__} defines hook methods by their earlier names ({renamed})")
        if before is not None and after is not None:
            raise ValueError("give before or after, not both")
        if any(h is hook for h in self._hooks):
            raise ValueError(f"{hook!r} is already one of this worker's hooks")
        if before is not None:
            index = self._index(before)
        elif after is not None:
            index = self._index(after) + 1
        else:
            index = len(self._hooks)
        self._hooks.insert(index, hook)
        return hook

    def remove(self, hook: Anchor) -> Hook:
        """Remove ``hook`` (or the first hook of that class) from this worker's hooks; return it."""
        return self._hooks.pop(self._index(hook))

    def _index(self, anchor: Anchor) -> int:
        for index, hook in enumerate(self._hooks):
            if hook is anchor or (isinstance(anchor, type) and isinstance(hook, anchor)):
                return index
        raise ValueError(f"{anchor!r} is not one of this worker's hooks")

    def __iter__(self) -> Iterator[Hook]:
        return iter(tuple(self._hooks))  # a hook added while the loop calls them is called from the next event on

    def __len__(self) -> int:
        return len(self._hooks)

    def __contains__(self, hook: object) -> bool:
        return any(h is hook for h in self._hooks)

    def __repr__(self) -> str:
        return f"Hooks({', '.join(type(h).__name__ for h in self._hooks)})"


class LogHook(Hook):
    """The start and stop lines (``streamer started``, ``streamer stopped``), and one line per failure the loop
    survives (a stop is the caller's to report: it is raised)."""

    def on_connected(self, worker: Any) -> None:
        log.info(f"{worker.kind} started", **worker.label, **worker.describe())

    def on_stop(self, worker: Any) -> None:
        log.info(f"{worker.kind} stopped", **worker.label, **worker.totals())

    def on_failure(self, worker: Any, exc: BaseException, verdict: Verdict, delay: float) -> None:
        label = worker.label
        if verdict.cause == "standby":
            log.warning("waiting for a primary", error=str(exc), retry_in=delay, **label)
        elif verdict.action == "restart":
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

    def on_failure(self, worker: Any, exc: BaseException, verdict: Verdict, delay: float) -> None:
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
    """``/healthz`` and ``/readyz``: the connect and each pass turn the loop; a pass that could not reach a server
    (or a connect that reached a standby) makes it unready until one does."""

    def on_connected(self, worker: Any) -> None:
        HEALTH.turned(health_name(worker))  # the loop exists from here: a first pass that hangs fails /healthz too

    def on_pass_end(self, worker: Any, result: Any) -> None:
        HEALTH.turned(health_name(worker))

    def on_failure(self, worker: Any, exc: BaseException, verdict: Verdict, delay: float) -> None:
        HEALTH.turned(health_name(worker), ready=verdict.action != "reconnect", reason=str(exc))

    def on_stop(self, worker: Any) -> None:
        HEALTH.stopped(health_name(worker))


class FaultHook(Hook):
    """Fault injection in the loop, for a worker built with ``faults``: ``loop.crash_after_connect`` crashes it once
    it connected, before its first pass (settled as a failure to connect); ``loop.crash_before_pass`` before a pass
    starts. Every worker must survive both by restarting from committed state."""

    def on_connected(self, worker: Any) -> None:
        faults = getattr(worker, "faults", None)
        if faults is not None:
            faults.crash("loop.crash_after_connect")

    def on_pass_start(self, worker: Any) -> None:
        faults = getattr(worker, "faults", None)
        if faults is not None:
            faults.crash("loop.crash_before_pass")


DEFAULT_HOOKS: tuple[Hook, ...] = (FaultHook(), LogHook(), MetricsHook(), HealthHook())
