"""Carrying out a fault schedule against the fleet, its servers and their proxies, then healing."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import structlog

from ..embedded import EmbeddedPostgres, EmbeddedRedis, EmbeddedRedisCluster, ReplicatedPostgres
from ..proxy import FaultProxy, Mode
from ..supervisor import Fleet
from .pgha import FailoverFault
from .schedule import NETWORK_KINDS, FaultEvent

log = structlog.get_logger(__name__)


@dataclass
class Executed:
    """A scheduled fault as it happened: when (seconds after start), and ``done``, ``skipped`` or ``failed``."""

    event: FaultEvent
    at: float
    status: str
    detail: str = ""


class Injector:
    """Carries out a fault schedule against a fleet, its servers and their proxies; then heals everything."""

    def __init__(
        self,
        fleet: Fleet,
        postgres: EmbeddedPostgres | None,
        redis: EmbeddedRedis | None,
        proxies: Mapping[str, FaultProxy],
        *,
        cluster: EmbeddedRedisCluster | None = None,
        stream: str = "",
        pair: ReplicatedPostgres | None = None,
        capture: str = "table",
        redis_url: str = "",
    ) -> None:
        self.fleet = fleet
        self.cluster, self.stream = cluster, stream
        self.postgres = postgres
        self.failovers = None
        if pair is not None:
            self.failovers = FailoverFault(
                pair, capture, redis_url=redis_url, stream=stream, cluster=cluster is not None
            )
        self.redis = redis
        self.proxies = dict(proxies)
        self.executed: list[Executed] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._runner: threading.Thread | None = None
        self._t0 = time.monotonic()

    def start(self, schedule: Sequence[FaultEvent], t0: float) -> None:
        self._t0 = t0
        self._runner = threading.Thread(target=self._run, args=(list(schedule),), name="chaos-schedule", daemon=True)
        self._runner.start()

    def _run(self, schedule: list[FaultEvent]) -> None:
        for event in schedule:
            if self._stop.wait(max(0.0, self._t0 + event.at - time.monotonic())):
                return
            thread = threading.Thread(target=self._execute, args=(event,), name=f"chaos-{event.kind}", daemon=True)
            thread.start()
            with self._lock:
                self._threads.append(thread)

    def _execute(self, event: FaultEvent) -> None:
        at = round(time.monotonic() - self._t0, 2)
        try:
            status, detail = self._do(event)
        except Exception as exc:  # a fault that could not be injected is reported, never fatal
            status, detail = "failed", repr(exc)
        with self._lock:
            self.executed.append(Executed(event, at, status, detail))
        log.info("chaos fault", kind=event.kind, target=event.target, status=status, detail=detail)

    def _do(self, event: FaultEvent) -> tuple[str, str]:
        kind, target = event.kind, event.target
        if kind == "kill":
            return ("done", "") if self._signal(target, signal.SIGKILL) else ("skipped", "not running")
        if kind == "pause":
            pgid = self._signal(target, signal.SIGSTOP)
            if pgid is None:
                return "skipped", "not running"
            self._stop.wait(event.duration)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGCONT)
            return "done", ""
        if kind == "redis_restart" and self.redis is not None:
            self.redis.restart(kill=True)
            return "done", ""
        if kind == "postgres_restart" and self.postgres is not None:
            self.postgres.restart(mode="immediate")
            return "done", ""
        if kind == "master_kill" and self.cluster is not None:
            return self._kill_master(event)
        if kind == "pg_failover" and self.failovers is not None:
            return self.failovers.run(event, self._stop, self._t0)
        if kind == "redis_pause" and self.redis is not None:
            self.redis.pause()
            try:
                self._stop.wait(event.duration)
            finally:
                with contextlib.suppress(Exception):
                    self.redis.resume()
            return "done", ""
        proxy = self.proxies.get(target)
        if proxy is None:
            return "skipped", f"no {target} proxy or server here"
        if kind == "cut":
            proxy.cut()
            return "done", ""
        proxy.set_mode(Mode(kind))
        try:
            self._stop.wait(event.duration)
        finally:
            proxy.pass_through()
            proxy.cut()  # connections that lost bytes in the window are corrupt for good: reset them
        return "done", ""

    def _kill_master(self, event: FaultEvent) -> tuple[str, str]:
        """SIGKILL the master holding the stream (``stream``) or another (``other``); wait for its replica to be
        promoted; after ``event.duration`` seconds restart it and wait until it is back as a replica."""
        assert self.cluster is not None
        owner = self.cluster.master_of(self.stream)
        victim = owner
        if event.target == "other":
            victim = next(m for m in self.cluster.masters() if m.port != owner.port)
        replicas = self.cluster.replicas_of(victim)
        victim.kill()
        promoted = self.cluster.wait_failover(replicas, timeout=30)
        self._stop.wait(event.duration)
        victim.start()
        self.cluster.wait_replica_online(victim, timeout=30)
        return "done", f"master :{victim.port} killed, :{promoted.port} promoted, :{victim.port} back as its replica"

    def _signal(self, name: str, signum: int) -> int | None:
        """Signal process ``name``'s whole process group (gunicorn's workers too); return the group id, or None."""
        child = self.fleet.children.get(name)
        if child is None or child.popen.poll() is not None:
            return None
        try:
            os.killpg(child.popen.pid, signum)
        except ProcessLookupError:
            return None
        return child.popen.pid

    def heal(self, timeout: float = 90.0) -> None:
        """Stop injecting; end every window; proxies back to pass (and cut), servers up, every process continued."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        if self._runner is not None:
            self._runner.join(max(0.1, deadline - time.monotonic()))
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.1, deadline - time.monotonic()))
        for proxy in self.proxies.values():
            proxy.pass_through()
            proxy.cut()
        if self.redis is not None:
            if self.redis.pid is None:
                self.redis.start()
            with contextlib.suppress(Exception):
                self.redis.resume()
        if self.postgres is not None:
            self.postgres.start()
        if self.failovers is not None:
            try:
                self.failovers.heal()
            except Exception as exc:  # logged (runner.log); the run goes on with one node
                log.error("chaos heal: the old Postgres primary did not rejoin", error=repr(exc))
        if self.cluster is not None:
            for node in self.cluster.nodes:
                if node.pid is None:
                    node.start()
        for name in list(self.fleet.children):
            self._signal(name, signal.SIGCONT)

    def counts(self) -> dict[str, dict[str, int]]:
        """Faults by kind: ``done``, ``skipped``, ``failed`` (network kinds per proxy as ``kind:target``)."""
        result: dict[str, dict[str, int]] = {}
        with self._lock:
            for item in self.executed:
                key = item.event.kind if item.event.kind not in _NETWORK else f"{item.event.kind}:{item.event.target}"
                bucket = result.setdefault(key, {"done": 0, "skipped": 0, "failed": 0})
                bucket[item.status] += 1
        return dict(sorted(result.items()))


_NETWORK = {k[0] for k in NETWORK_KINDS}
