"""Fault injection built into the library, so chaos runs exercise the real code paths.

A :class:`Faults` object is consulted at named points in the streamer and the consumers. Each point fires with a
configured probability drawn from a seeded RNG (reproducible runs), or on a script of forced outcomes (tests that
inject a failure at one exact step). Every fault that fires is logged and counted.

Points:

``loop.crash_before_pass``
    Any worker: crash before a pass starts.
``loop.crash_after_connect``
    Any worker: crash once ``connect`` returned, before the first pass (settled as a failure to connect).
``streamer.double_send``
    Re-send the whole batch to Redis right after it was sent (the reference design's 10 %).
``streamer.crash_after_claim``
    Table mode: crash after a batch's claim committed and before anything of it was sent to Redis.
``streamer.crash_after_publish``
    Crash after Redis confirmed the batch and before the delete of the staged records commits.
``streamer.crash_recreating_slot``
    WAL capture: crash after a lost slot's replacement was created and before its ``from_xid`` was recorded.
``consumer.crash_mid_batch``
    Crash while the handler iterates the batch, after some records were handled.
``consumer.crash_before_commit``
    Crash after the handler ran and before the state-and-checkpoint transaction commits (the reference's 10 %).
``consumer.crash_after_dead_letter``
    A checkpoint consumer crashes after it dead-lettered a poison record and before its checkpoint passed it.
``backfill.crash_before_commit``
    A backfill crashes after it staged a page's records and before the page (records and cursor) commits.
``group.crash_before_ack``
    A group worker crashes after its transaction committed and before it acknowledged the entries in Redis.

Crashes raise :class:`~unilog.errors.InjectedCrash`, a ``BaseException``, so no ``except Exception`` swallows them.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from .errors import ConfigurationError, InjectedCrash
from .metrics import FAULTS_INJECTED

log = structlog.get_logger(__name__)

POINTS = (
    "loop.crash_before_pass",  # any worker, between passes (unilog.runtime.hooks.FaultHook)
    "loop.crash_after_connect",  # any worker, connected, before its first pass (unilog.runtime.hooks.FaultHook)
    "streamer.double_send",
    "streamer.crash_after_claim",  # table mode: the claim saved, nothing sent
    "streamer.crash_after_publish",
    "streamer.crash_before_confirm",  # WAL capture: rows deleted, the slot not yet told
    "streamer.crash_recreating_slot",  # WAL capture: a lost slot's replacement made, its from_xid not yet recorded
    "consumer.crash_mid_batch",
    "consumer.crash_before_commit",
    "consumer.crash_after_dead_letter",
    "group.crash_before_ack",
    "backfill.crash_before_commit",
)


@dataclass(frozen=True)
class FaultConfig:
    """Which faults fire how often. ``rates`` maps a point to a probability in [0, 1]."""

    rates: Mapping[str, float] = field(default_factory=dict)
    seed: int | None = None

    def __post_init__(self) -> None:
        for point, rate in self.rates.items():
            if point not in POINTS:
                raise ConfigurationError(f"unknown fault point {point!r}; known points: {', '.join(POINTS)}")
            if not 0.0 <= rate <= 1.0:
                raise ConfigurationError(f"fault rate for {point} must be between 0 and 1, got {rate}")

    @classmethod
    def parse(cls, spec: str | None, seed: int | None = None) -> FaultConfig:
        """Parse ``"streamer.double_send=0.1,consumer.crash_before_commit=0.1"`` (empty or None: no faults)."""
        rates: dict[str, float] = {}
        for item in (spec or "").split(","):
            if not item.strip():
                continue
            point, sep, value = item.partition("=")
            try:
                rates[point.strip()] = float(value) if sep else 1.0
            except ValueError:
                raise ConfigurationError(f"fault rate in {item!r} is not a number") from None
        return cls(rates=rates, seed=seed)


class Faults:
    """Decides, at each named point, whether a fault fires; thread-safe; counts what fired.

    ``script`` forces outcomes for tests: ``{"consumer.crash_before_commit": [False, True]}`` lets the first visit
    pass and crashes on the second; once a point's script is used up, its rate applies.
    """

    def __init__(
        self,
        config: FaultConfig | None = None,
        *,
        script: Mapping[str, Iterable[bool]] | None = None,
        on_fault: Callable[[str], Any] | None = None,
    ) -> None:
        self.config = config or FaultConfig()
        self._rng = random.Random(self.config.seed)
        self._script = {point: list(outcomes) for point, outcomes in (script or {}).items()}
        self._lock = threading.Lock()
        self._on_fault = on_fault
        self.counts: Counter[str] = Counter()

    @classmethod
    def scripted(cls, **script: Iterable[bool]) -> Faults:
        """Faults that fire exactly as scripted.

        Keyword names use ``__`` for the dot: ``Faults.scripted(consumer__crash_before_commit=[True])``.
        """
        return cls(script={k.replace("__", "."): v for k, v in script.items()})

    def armed(self, point: str) -> bool:
        """Whether the fault at ``point`` may fire at all (scripted, or a rate above 0): a point visited once per
        stream of a batch is asked once per batch, not ten thousand times. Asking :meth:`fires` only while this holds
        changes no outcome: an unarmed point never fires and draws no random number."""
        with self._lock:
            return bool(self._script.get(point)) or self.config.rates.get(point, 0.0) > 0.0

    def fires(self, point: str) -> bool:
        """Whether the fault at ``point`` fires now; logs and counts it if so."""
        with self._lock:
            outcomes = self._script.get(point)
            if outcomes:
                fired = outcomes.pop(0)
            else:
                rate = self.config.rates.get(point, 0.0)
                fired = rate > 0.0 and self._rng.random() < rate
            if fired:
                self.counts[point] += 1
        if fired:
            FAULTS_INJECTED.labels(point).inc()
            log.warning("fault injected", point=point, count=self.counts[point])
            if self._on_fault is not None:
                self._on_fault(point)
        return fired

    def crash(self, point: str) -> None:
        """Raise :class:`InjectedCrash` if the fault at ``point`` fires."""
        if self.fires(point):
            raise InjectedCrash(point)

    def pick(self, n: int) -> int:
        """A reproducible index in ``range(n)`` (where in a batch a mid-batch crash happens)."""
        with self._lock:
            return self._rng.randrange(n) if n > 0 else 0


NO_FAULTS = Faults()
