"""The one failure policy of every worker loop, both faces: what a pass that raised leads to.

:func:`decide` is pure: it classifies the exception and returns a :class:`Verdict` (stop, restart, reconnect or
retry, and why), for a pass and for connecting at start alike; the loop (:func:`unilog.runtime.serve`) acts on it,
with one back-off (:class:`Backoff`), and the loop's hooks (:mod:`unilog.runtime.hooks`) log it, count it and report
it to ``/readyz``. No worker decides this for itself and no worker retries on its own: a worker only says, through
``is_handler_failure`` (a question: nothing changes), whether an exception was its handler's rolled-back failure;
what it does about one, ``after_handler_failure``, the loop calls when it carries out the verdict.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
import structlog

from .. import engine, metrics, store
from ..errors import (
    CaptureRecreated,
    ConfigurationError,
    DataLoss,
    InjectedCrash,
    NotReplicated,
    PolicyStop,
    ReadOnlyServer,
    ServerUnreachable,
    UnilogError,
)

log = structlog.get_logger("unilog.runtime")

# Failures of the infrastructure rather than of a record: retried after reconnecting, never held against a record.
# (A deadline's TimeoutError is an OSError: it is one of them, in both faces.)
# A write refused by a read-only server is one too: the server is a standby, and a failover promotes one.
TRANSIENT: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    psycopg.errors.ReadOnlySqlTransaction,
    engine.RedisError,
    OSError,
    ServerUnreachable,
)
# Failures of the set-up no retry can fix (a Redis replica, a refused privilege): the process stops with one line.
FATAL: tuple[type[Exception], ...] = (*engine.FATAL, *store.FATAL)

Action = Literal["stop", "restart", "reconnect", "retry"]


def fatal(exc: BaseException) -> UnilogError | None:
    """The one-line error for a server's refusal no retry can fix (a replica, a missing privilege), or None."""
    return engine.fatal(exc) or store.fatal(exc)


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure a long-running process waits out (what :func:`decide` reconnects after): a server
    unreachable, restarting, ending the session, loading its data, failing over or a standby; not a configuration,
    a server's refusal no retry can fix, or data loss. Asked of :func:`decide` itself, for a worker that has no
    handler and does not restart after a crash, so the two cannot disagree."""
    return decide(_OUTSIDE, exc).action == "reconnect"


class _Outside:
    """What :func:`decide` reads of a worker, for a failure outside any worker's pass."""

    retryable = TRANSIENT
    restart_after_crash = False

    def is_handler_failure(self, exc: Exception) -> bool:
        return False


_OUTSIDE = _Outside()


@dataclass(frozen=True)
class Verdict:
    """What the loop does after a failed pass (or a failed connect): ``action``, because of ``cause`` (a word for
    logs and metrics: ``crash``, ``connection``, ``standby``, ``replicas``, ``handler``, ``recreated``; for a stop,
    what stopped it), raising ``error`` on a stop."""

    action: Action
    cause: str
    error: BaseException


def decide(worker: Any, exc: BaseException, *, drain: bool = False, connecting: bool = False) -> Verdict:
    """The failure policy, for a pass of ``worker`` that raised ``exc`` (``connecting``: for its ``connect`` at
    start). It reads the worker (``restart_after_crash``, ``retryable``, ``is_handler_failure``) and changes nothing.

    * Stop (raise): data loss (:class:`~unilog.errors.DataLoss`), a configuration no retry can fix, a worker's
      policy to stop (:class:`~unilog.errors.PolicyStop`), a server's refusal no retry can fix (raised as its one
      line), anything that is not an ``Exception`` (``KeyboardInterrupt``, a cancelled task), and any other
      exception the worker does not call its handler's failure.
    * Restart in-process from committed state: an injected crash (:class:`~unilog.errors.InjectedCrash`), unless
      the worker was built with ``restart_after_crash=False``.
    * Reconnect, then retry after a back-off: a connection failure (``worker.retryable``).
    * Retry on the same connections after a back-off: a dead letter too few replicas acknowledged
      (:class:`~unilog.errors.NotReplicated`), and a handler's failure that was rolled back
      (``worker.is_handler_failure(exc)`` returns True; the loop then calls ``worker.after_handler_failure(exc)``).

    * Reconnect at once: a WAL capture slot lost at no cost and replaced (:class:`~unilog.errors.CaptureRecreated`;
      the new session reads the new slot), in burst mode too (it happens once per loss).

    ``drain`` (burst mode) retries only a handler's failure (its poison policy bounds the retries); anything else ends
    the drain, raised: a crash, a lost connection, a dead letter no replica acknowledged (a caller of burst mode wants
    to know now, not wait for a server to come back).

    ``connecting`` (the loop's first step, ``connect``): a long-running process (``run``) waits for its servers as
    it does while running: a server that cannot be reached, is restarting, ended the session or is failing over
    (a connection failure, ``worker.retryable``) is a reconnect after the back-off (cause ``connection``), a
    read-only standby one with cause ``standby`` (a failover promotes one), and an injected crash a restart; any
    other failure stops it (a configuration, a refusal, data loss). Burst mode (``drain``) stops at every failure
    of connecting, raised as it is: a caller of ``--once`` wants to know now (exit code 4 for an unreachable
    server).
    """
    verdict = _classify(worker, exc)
    if connecting:
        return _connecting(verdict, exc, drain)
    if drain and verdict.cause not in ("handler", "recreated") and verdict.action != "stop":
        return Verdict("stop", verdict.cause, exc)
    return verdict


def _connecting(verdict: Verdict, exc: BaseException, drain: bool) -> Verdict:
    if drain or verdict.action not in ("restart", "reconnect"):
        return Verdict("stop", verdict.cause if verdict.action == "stop" else "connect", exc)
    if isinstance(exc, ReadOnlyServer):
        return Verdict("reconnect", "standby", exc)
    return verdict


def _classify(worker: Any, exc: BaseException) -> Verdict:
    if not isinstance(exc, Exception) and not isinstance(exc, InjectedCrash):
        return Verdict("stop", "interrupted", exc)
    if isinstance(exc, DataLoss | ConfigurationError | PolicyStop):
        return Verdict("stop", type(exc).__name__, exc)
    if isinstance(exc, FATAL):
        return Verdict("stop", "refused", fatal(exc) or exc)
    if isinstance(exc, InjectedCrash):
        return Verdict("restart" if worker.restart_after_crash else "stop", "crash", exc)
    if isinstance(exc, CaptureRecreated):  # a lost slot replaced at no cost: a new session reads the new slot
        return Verdict("reconnect", "recreated", exc)
    if isinstance(exc, NotReplicated):  # rolled back before the checkpoint passed the record; connections are fine
        return Verdict("retry", "replicas", exc)
    if isinstance(exc, worker.retryable):
        return Verdict("reconnect", "connection", exc)
    if isinstance(exc, Exception) and worker.is_handler_failure(exc):
        return Verdict("retry", "handler", exc)
    return Verdict("stop", "error", exc)


# redis-py's parser keeps a bound method of itself (a reference cycle) beside a 64 kB read buffer, so a Redis client
# dropped after a failure is freed only by a full garbage collection, which may come an hour later. A process that
# restarts in-process or reconnects often (thousands of times an hour under injected crashes or a flaky network) made
# them faster than full collections freed them, and the buffers freed in bulk spread the heap: RSS crept 0.4-0.6 MB
# an hour in a two-hour soak (bench/RESULTS.md, issue 47). So the links collect before they make the next client,
# taking at most 1 % of the process's time: the wait after a collection is a hundred times its length, a second at
# least (an app's worker thread beside a large heap pays a long collection rarely).
SWEEP_SHARE, SWEEP_EVERY = 0.01, 1.0
_sweep: dict[str, Any] = {"next": 0.0, "pending": False}


def note_dropped_client() -> None:
    """Say a Redis client was dropped (closed after a failure or a restart, or after failing to connect): the next
    :func:`sweep_dropped_clients` collects it. Process-wide: a worker that drops whole links (a partition worker
    handing a partition over) leaves its garbage to whichever links make a client next."""
    _sweep["pending"] = True


def sweep_dropped_clients() -> bool:
    """If a client was dropped (:func:`note_dropped_client`), run a full garbage collection unless one ran too
    recently (see above); whether it ran. Call it when the failure that dropped the client has been handled (its
    traceback no longer holds the client), before the next client is made."""
    started = time.monotonic()
    if not _sweep["pending"] or started < _sweep["next"]:
        return False
    _sweep["pending"] = False
    gc.collect()
    took = time.monotonic() - started
    _sweep["next"] = started + max(SWEEP_EVERY, took / SWEEP_SHARE)
    return True


class Backoff:
    """Exponential back-off between failed passes: 0.1 s, doubling up to ``maximum``; reset by a success."""

    def __init__(self, maximum: float) -> None:
        self.maximum = maximum
        self.delay = 0.1

    def grow(self) -> None:
        self.delay = min(self.delay * 2, self.maximum)

    def reset(self) -> None:
        self.delay = 0.1


def health_name(worker: Any) -> str:
    """How ``/healthz`` and ``/readyz`` name a worker's loop: its kind and label (``streamer streamer=a``)."""
    return " ".join([worker.kind, *(f"{k}={v}" for k, v in worker.label.items())])


def account_batch(
    owner: Any, kind: str, name: str, entries: list[engine.Entry], handled: int, started: float, **fields: Any
) -> int:
    """Count a committed batch of ``owner``, a consumer (``kind``: checkpoint, group, partition): its totals, the
    metrics and the ``batch consumed`` log line (with ``fields``); return the entries skipped."""
    skipped = len(entries) - handled
    owner.handled_total += handled
    owner.skipped_total += skipped
    seconds = time.perf_counter() - started
    metrics.batch_consumed(
        kind, owner.stream, name, handled=handled, skipped=skipped, seconds=seconds, first_id=entries[0][0]
    )
    log.info("batch consumed", records=handled, skipped=skipped, ms=round(seconds * 1000, 2), **fields)
    return skipped
