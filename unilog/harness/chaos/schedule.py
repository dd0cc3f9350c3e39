"""The fault schedule: drawn up front from the run's seed, so the same seed gives the same faults."""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class FaultRates:
    """How many faults of each kind per minute (0 disables a kind)."""

    kill: float = 15.0
    pause: float = 5.0
    redis_restart: float = 0.8
    postgres_restart: float = 0.7
    redis_pause: float = 0.4
    network: float = 6.0  # proxy faults (reset, cut, blackhole, drop_replies) over both proxies
    master_kill: float = 2.0  # on a Redis Cluster: a master SIGKILLed, its replica promoted, the old one rejoining
    # with a Postgres primary + standby (ChaosConfig.postgres_ha): the primary SIGKILLed, the standby promoted, the
    # old primary rewound and rejoining as standby (``unilog chaos --pg-ha`` sets 1.5)
    pg_failover: float = 0.0


@dataclass(frozen=True)
class FaultEvent:
    """One scheduled fault: ``at`` seconds after the fleet is up, ``kind``, ``target`` (a process, ``postgres`` or
    ``redis``; for network kinds the proxy in front of that server) and, for windows, how long it lasts."""

    at: float
    kind: str
    target: str
    duration: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        window = f" for {self.duration:.1f}s" if self.duration else ""
        return f"t={self.at:7.2f}s {self.kind} {self.target}{window}"


NETWORK_KINDS = (
    ("reset", 3, 0.2, 2.0),
    ("cut", 2, 0.0, 0.0),
    ("blackhole", 3, 1.0, 8.0),
    ("drop_replies", 2, 0.5, 3.0),
)


def build_schedule(
    seed: int,
    duration: float,
    processes: Sequence[str],
    rates: FaultRates = FaultRates(),
    *,
    servers: Collection[str] = ("postgres", "redis"),
    proxies: Collection[str] = ("postgres", "redis"),
    warmup: float = 3.0,
    tail: float = 2.0,
) -> list[FaultEvent]:
    """The run's faults, drawn from ``random.Random(seed)``; the same arguments always give the same schedule.

    ``servers``: the servers the runner may restart or pause (none when you gave your own URLs; ``redis_cluster``
    for an embedded Redis Cluster, whose masters are killed instead); ``proxies``: the
    servers with a fault proxy in front. Faults happen in ``[warmup, duration - tail]``. A kind with a non-zero rate
    gets ``rate * minutes`` events, at least one in a run of 30 s or more. Windows on one proxy never overlap, and
    server restarts of one server are at least 5 s apart.
    """
    rng = random.Random(seed)
    start, end = warmup, max(warmup, duration - tail)
    targets = sorted(processes)

    def count(rate: float) -> int:
        if rate <= 0 or end <= start:
            return 0
        return max(1 if duration >= 30 else 0, round(rate * duration / 60))

    def times(n: int) -> list[float]:
        return sorted(round(rng.uniform(start, end), 2) for _ in range(n))

    events: list[FaultEvent] = []
    for at in times(count(rates.kill) if targets else 0):
        events.append(FaultEvent(at, "kill", rng.choice(targets)))
    for at in times(count(rates.pause) if targets else 0):
        events.append(FaultEvent(at, "pause", rng.choice(targets), round(rng.uniform(0.5, 4.0), 2)))
    for server, rate in (("redis", rates.redis_restart), ("postgres", rates.postgres_restart)):
        last = -1e9
        for at in times(count(rate) if server in servers else 0):
            at = max(at, last + 5.0)
            if at <= end:
                events.append(FaultEvent(round(at, 2), f"{server}_restart", server))
                last = at
    for at in times(count(rates.redis_pause) if "redis" in servers else 0):
        events.append(FaultEvent(at, "redis_pause", "redis", round(rng.uniform(0.5, 3.0), 2)))
    sides = sorted(proxies)
    free_at = dict.fromkeys(sides, -1e9)
    for at in times(count(rates.network) if sides else 0):
        side = rng.choice(sides)
        kind, _w, low, high = rng.choices(NETWORK_KINDS, weights=[k[1] for k in NETWORK_KINDS])[0]
        length = round(rng.uniform(low, high), 2) if high else 0.0
        at = max(at, free_at[side] + 0.5)
        if at > end:
            continue
        events.append(FaultEvent(round(at, 2), kind, side, length))
        free_at[side] = at + length
    events += _master_kills(rng, count(rates.master_kill) if "redis_cluster" in servers else 0, start, end)
    events += _pg_failovers(rng, count(rates.pg_failover) if "postgres_ha" in servers else 0, start, end)
    events.sort(key=lambda e: (e.at, e.kind, e.target))
    return events


def _master_kills(rng: random.Random, n: int, start: float, end: float) -> list[FaultEvent]:
    """Kills of the master that holds the stream (two in three) or of another one, each down for ``duration``
    seconds before it restarts (and rejoins as a replica), at least 10 s apart so a failover completes first."""
    events, last = [], -1e9
    for at in sorted(round(rng.uniform(start, end), 2) for _ in range(n)):
        at = max(at, last + 10.0)
        target = rng.choice(("stream", "stream", "other"))
        down = round(rng.uniform(1.0, 4.0), 2)
        if at <= end:
            events.append(FaultEvent(round(at, 2), "master_kill", target, down))
            last = at
    return events


PG_FAILOVER_WARMUP = 10.0  # the first failover waits for traffic (in WAL mode the slot's copy needs some to be ready)
PG_FAILOVER_GAP = 20.0  # failover, rejoin (pg_rewind), and in WAL mode the new standby's copy ready again


def _pg_failovers(rng: random.Random, n: int, start: float, end: float) -> list[FaultEvent]:
    """Failovers of the Postgres primary (target ``postgres``), each followed by the old primary's rejoin
    ``duration`` seconds after the promotion; at least :data:`PG_FAILOVER_GAP` seconds apart, none before
    :data:`PG_FAILOVER_WARMUP` (when the run is long enough)."""
    events, last = [], -1e9
    start = min(max(start, PG_FAILOVER_WARMUP), end)
    for at in sorted(round(rng.uniform(start, end), 2) for _ in range(n)):
        at = max(at, last + PG_FAILOVER_GAP)
        rejoin_after = round(rng.uniform(2.0, 5.0), 2)
        if at <= end:
            events.append(FaultEvent(round(at, 2), "pg_failover", "postgres", rejoin_after))
            last = at
    return events
