"""``unilog chaos``: the whole system under a seeded schedule of faults, then a Jepsen-style verdict.

The runner starts Postgres and Redis (embedded, or the servers you give it), one :class:`~unilog.proxy.FaultProxy` in
front of each, and the fleet as separate processes under :class:`~unilog.fleet.Fleet` (restarted when they exit):

* producers: the Rocket Rides API (gunicorn) driven by the simulator, and two direct library producers
  (``python -m unilog.chaos produce``) that keep several transactions open at once on several connections, commit
  them out of order, roll a share of them back, and now and then stage a *poison* record;
* two streamers (one publishes, one stands by);
* two checkpoint consumers (``consumer0``, ``consumer1``) and a consumer group ``group0`` of two workers, each
  running the handler under test (the demo's distance consumer, or yours) wrapped by :func:`tracked`, which records
  every record it applies in ``chaos_applied`` in the handler's own transaction (no unique constraint: a record
  applied twice shows up twice). The group's wrapper fails on poison records, so they must end up dead-lettered.

Every producer writes its history as JSON lines (:class:`HistoryWriter`): an ``attempt`` before the transaction
commits and its ``outcome`` after (``committed``, ``rolled_back``, or ``unknown`` when the commit itself failed or
the process died first). The direct producers also write each record's chaos id (``cid``) into
``chaos_produced`` in the same transaction, so the database says which unknown outcomes did commit; API rides are
identified as ``ride-<id>`` and the ``rides`` table is canonical for them.

The fault schedule is drawn up front from ``random.Random(seed)`` (:func:`build_schedule`): SIGKILL of any fleet
process, SIGSTOP/SIGCONT pauses, Redis restarts (SIGKILL, AOF with ``appendfsync always``), Redis pauses, Postgres
immediate restarts, and connection resets, cuts, blackholes and dropped replies on either proxy. The library's own
faults (double-sends, crashes between steps) run inside the processes at fixed rates with seeds derived from the
run's. The same seed and options give the same schedule.

At the end the runner heals everything (proxies pass, every process continued, servers up), stops the producers,
waits until the system is quiet (nothing staged, every consumer at the end of the stream, nothing pending) and
checks (:func:`check`, on data read by :func:`collect`): nothing committed is lost by any consumer, nothing rolled
back or never attempted is applied, nothing is applied twice, dead letters hold only poison records, and every
consumer's state equals the canonical one. Unknown outcomes may be applied once or not at all.

:func:`check` is a pure function over plain data, so you can run it on your own fleet's history;
:func:`run_chaos` takes your consumer handler (``ChaosConfig(handler="myapp.consumers:handle")``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import psycopg
import structlog

from . import engine, store
from .consumer import Handler, Record, load_handler
from .embedded import EmbeddedPostgres, EmbeddedRedis, free_port
from .errors import ConfigurationError, UnilogError
from .fleet import Fleet, ProcessSpec
from .proxy import FaultProxy, Mode

log = structlog.get_logger(__name__)

STREAM = "rocket-rides-log"  # services.rides.STREAM: the API stages its rides there
API = "api"
SIMULATOR = "simulator"
PRODUCERS = ("producer0", "producer1")
STREAMERS = ("streamer", "streamer2")
CHECKPOINT_CONSUMERS = ("consumer0", "consumer1")
GROUP = "group0"
GROUP_WORKERS = ("group0-a", "group0-b")
SPARK = "spark0"  # the demo's distance consumer on Spark, when pyspark and Java are installed
DEFAULT_HANDLER = "services.consumer:handle"
POISON_OBJECT, POISON_ACTION = "chaos", "poison"
API_CID_PREFIX = "ride-"
OUTCOMES = ("committed", "rolled_back", "unknown")

# rates from the issue; each process's fault seed is derived from the run's seed (and its incarnation)
STREAMER_FAULTS = "streamer.double_send=0.05,streamer.crash_after_publish=0.02"
CONSUMER_FAULTS = "consumer.crash_before_commit=0.05,consumer.crash_mid_batch=0.02"
GROUP_FAULTS = "consumer.crash_before_commit=0.05,consumer.crash_mid_batch=0.02,group.crash_before_ack=0.02"

CHAOS_DDL = (
    """
    CREATE TABLE IF NOT EXISTS chaos_applied (
        consumer   TEXT NOT NULL,
        cid        TEXT NOT NULL,
        entry_id   TEXT,
        applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS chaos_produced (
        cid     TEXT PRIMARY KEY,
        ride_id BIGINT,
        poison  BOOLEAN NOT NULL DEFAULT false
    )
    """,
)

CANONICAL_CIDS_SQL = """
    SELECT coalesce(p.cid, 'ride-' || r.id) FROM rides r LEFT JOIN chaos_produced p ON p.ride_id = r.id
    UNION ALL
    SELECT cid FROM chaos_produced WHERE ride_id IS NULL
"""


# -- history -----------------------------------------------------------------------------------------------------------


class HistoryWriter:
    """One producer process's history, as append-only JSON lines.

    Each event is a single ``write(2)`` on a file opened with ``O_APPEND``, so a SIGKILLed process leaves only whole
    lines, and several incarnations of one producer can share the file. Attempt numbers continue across
    incarnations (the file is scanned at open), so chaos ids stay unique.

    Events: ``{"op": "attempt", "aid", "n", "source", "cids", "poison", "cid_prefix", "t"}`` before the transaction
    commits, ``{"op": "outcome", "aid", "outcome", "cids"?, "t"}`` after. ``cid_prefix`` marks an attempt whose ids
    are not known up front (an API call: the ride id comes back in the response).
    """

    def __init__(self, path: Path | str, source: str) -> None:
        self.path = Path(path)
        self.source = source
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._next = _next_attempt_number(self.path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def allocate(self) -> int:
        """A fresh attempt number (unique for this source across incarnations)."""
        with self._lock:
            n, self._next = self._next, self._next + 1
            return n

    def attempt(
        self,
        n: int | None = None,
        cids: Sequence[str] = (),
        *,
        poison: Sequence[str] = (),
        cid_prefix: str | None = None,
        **extra: Any,
    ) -> str:
        """Record an attempt (before its commit) and return its attempt id."""
        n = self.allocate() if n is None else n
        aid = f"{self.source}:{n}"
        event: dict[str, Any] = {"op": "attempt", "aid": aid, "n": n, "source": self.source, "cids": list(cids)}
        if poison:
            event["poison"] = list(poison)
        if cid_prefix is not None:
            event["cid_prefix"] = cid_prefix
        self._write({**event, **extra})
        return aid

    def outcome(self, aid: str, outcome: str, cids: Sequence[str] | None = None, **extra: Any) -> None:
        """Record an attempt's outcome: ``committed``, ``rolled_back`` or ``unknown``."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, not {outcome!r}")
        event: dict[str, Any] = {"op": "outcome", "aid": aid, "source": self.source, "outcome": outcome}
        if cids:
            event["cids"] = list(cids)
        self._write({**event, **extra})

    def _write(self, event: dict[str, Any]) -> None:
        event["t"] = round(time.time(), 3)
        os.write(self._fd, (json.dumps(event, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def _next_attempt_number(path: Path) -> int:
    highest = 0
    with contextlib.suppress(FileNotFoundError), path.open("rb") as lines:
        for line in lines:
            try:
                highest = max(highest, int(json.loads(line).get("n", 0)))
            except (ValueError, TypeError, AttributeError):
                continue  # not ours, or torn
    return highest + 1


def read_history(paths: Iterable[Path | str]) -> list[dict[str, Any]]:
    """Every event of the given JSON-lines files (a directory: all its ``*.jsonl``), in file order."""
    events: list[dict[str, Any]] = []
    for item in paths:
        path = Path(item)
        files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
        for file in files:
            with file.open("rb") as lines:
                for line in lines:
                    with contextlib.suppress(ValueError):
                        event = json.loads(line)
                        if isinstance(event, dict):
                            events.append(event)
    return events


@dataclass
class HistorySummary:
    """What a history says: each chaos id's outcome (committed beats unknown beats rolled back when a cid was
    attempted more than once), the poison ids, attempts whose ids are unknown (by the prefix their ids would have),
    ids committed by more than one attempt, and attempt outcomes per source."""

    attempts: int
    outcome: dict[str, str]
    poison: set[str]
    anonymous_unknown: Counter[str]
    duplicate_commits: dict[str, int]
    by_source: dict[str, Counter[str]]

    def ids(self, outcome: str) -> set[str]:
        return {cid for cid, o in self.outcome.items() if o == outcome}


_RANK = {"rolled_back": 0, "unknown": 1, "committed": 2}


def summarize_history(events: Iterable[Mapping[str, Any]]) -> HistorySummary:
    """Fold history events into :class:`HistorySummary`.

    Two forms are accepted and may be mixed. The writer's: ``attempt`` / ``outcome`` events paired by ``aid``. The
    simple one, for your own producers: ``{"cid": "x", "outcome": "committed"}`` lines (``"outcome": "attempt"``
    before the commit is optional; lines without ``aid`` pair up by ``cid``). An attempt with no outcome line is
    ``unknown``.
    """
    attempts: dict[str, dict[str, Any]] = {}
    for i, event in enumerate(events):
        op = event.get("op")
        if op == "start":
            continue
        cids = [str(c) for c in (event.get("cids") or [])]
        if event.get("cid") is not None:
            cids.append(str(event["cid"]))
        aid = event.get("aid") or (f"cid:{cids[0]}" if len(cids) == 1 else f"line:{i}")
        entry = attempts.setdefault(
            aid, {"cids": set(), "poison": set(), "outcome": None, "source": "", "prefix": None}
        )
        entry["cids"].update(cids)
        poison = event.get("poison")
        if poison is True:
            entry["poison"].update(cids)
        elif isinstance(poison, list):
            entry["poison"].update(str(c) for c in poison)
        entry["source"] = event.get("source") or entry["source"]
        entry["prefix"] = event.get("cid_prefix") or entry["prefix"]
        outcome = event.get("outcome")
        if op == "attempt" or outcome == "attempt":
            continue
        if outcome not in OUTCOMES:
            raise ValueError(f"history event {i} has no valid outcome (one of {OUTCOMES}): {dict(event)!r}")
        entry["outcome"] = outcome
    result: dict[str, str] = {}
    commits: Counter[str] = Counter()
    poison_ids: set[str] = set()
    anonymous: Counter[str] = Counter()
    by_source: dict[str, Counter[str]] = {}
    for entry in attempts.values():
        outcome = entry["outcome"] or "unknown"
        by_source.setdefault(entry["source"], Counter())[outcome] += 1
        poison_ids |= entry["poison"]
        if not entry["cids"]:
            if outcome == "unknown":
                anonymous[entry["prefix"] or ""] += 1
            continue
        for cid in entry["cids"]:
            if outcome == "committed":
                commits[cid] += 1
            if cid not in result or _RANK[outcome] > _RANK[result[cid]]:
                result[cid] = outcome
    return HistorySummary(
        attempts=len(attempts),
        outcome=result,
        poison=poison_ids,
        anonymous_unknown=anonymous,
        duplicate_commits={cid: n for cid, n in commits.items() if n > 1},
        by_source=by_source,
    )


# -- the checker -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    """One thing the checker found wrong: its kind, a sentence, the consumer (if any) and the exact records."""

    kind: str
    message: str
    consumer: str | None = None
    cids: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "consumer": self.consumer, "cids": list(self.cids)}


@dataclass
class Verdict:
    """The checker's result: ``ok`` iff there are no violations; ``counts`` say what was checked."""

    violations: list[Violation] = field(default_factory=list)
    counts: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def kinds(self) -> Counter[str]:
        return Counter(v.kind for v in self.violations)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "violations": [v.to_dict() for v in self.violations], "counts": self.counts}


VIOLATION_KINDS = {
    "lost": "committed but never applied",
    "applied_twice": "applied more than once",
    "unexpected": "applied but rolled back, never attempted, or not committed",
    "not_durable": "acknowledged as committed but missing from the canonical table",
    "rolled_back_committed": "recorded as rolled back but present in the canonical table",
    "never_attempted": "in the canonical table but never attempted",
    "duplicate_cid": "committed by more than one attempt (the history reuses an id)",
    "dead_letter_unexpected": "dead-lettered but not an injected poison record",
    "poison_not_dead_lettered": "a committed poison record a group neither applied nor dead-lettered",
    "state_mismatch": "consumer state differs from the canonical state",
    "staged_not_empty": "records left in staged_log_records",
    "pending_entries": "entries still pending in a consumer group",
    "not_caught_up": "consumer not at the end of the stream",
}


def check(
    history: Iterable[Mapping[str, Any]] | HistorySummary,
    applied_by_consumer: Mapping[str, Iterable[str]],
    *,
    poison_ids: Collection[str] = (),
    dead_letter_ids: Mapping[str, Iterable[str]] | Iterable[str] = (),
    groups: Collection[str] = (),
    canonical: Collection[str] | None = None,
    states: Mapping[str, Any] | None = None,
    canonical_state: Any = None,
    staged_count: int = 0,
    pending: Mapping[str, int] | int = 0,
    lag: Mapping[str, int] | None = None,
) -> Verdict:
    """Judge a run: pure, so it works on any fleet's data.

    ``history``: the producers' events (see :func:`summarize_history`). ``applied_by_consumer``: per consumer, the
    chaos id of every application, duplicates included (a consumer that applied nothing must still be a key).
    ``poison_ids``: records meant to fail in consumer groups (also read from the history); ``groups``: the consumers
    that dead-letter them instead of applying them; ``dead_letter_ids``: cids found in the dead letters, per group
    (a plain list: all groups together). ``canonical``: the cids your source of truth says committed (None: judge
    by the history alone, where unknown outcomes may appear once or not at all; given, an unknown outcome must be
    applied exactly when it is canonical). ``states``/``canonical_state``: each consumer's derived state, which must
    equal the canonical one. ``staged_count``, ``pending`` (per group or total) and ``lag`` (per consumer) must be 0.
    """
    h = history if isinstance(history, HistorySummary) else summarize_history(history)
    committed, rolled_back, unknown = h.ids("committed"), h.ids("rolled_back"), h.ids("unknown")
    poison = set(poison_ids) | h.poison
    violations: list[Violation] = []
    counts: dict[str, Any] = {
        "attempts": h.attempts,
        "records": len(h.outcome),
        "committed": len(committed),
        "rolled_back": len(rolled_back),
        "unknown": len(unknown),
        "unknown_anonymous": sum(h.anonymous_unknown.values()),
        "poison": len(poison),
        "by_source": {s: dict(c) for s, c in sorted(h.by_source.items())},
    }
    for cid, n in sorted(h.duplicate_commits.items()):
        violations.append(Violation("duplicate_cid", f"{cid} was committed by {n} attempts", cids=(cid,)))

    if canonical is not None:
        canon = set(canonical)
        strangers = canon - h.outcome.keys()
        absorbed, never = _absorb(strangers, h.anonymous_unknown)
        _add(violations, "not_durable", sorted(committed - canon), "acknowledged commits missing from the database")
        _add(violations, "rolled_back_committed", sorted(rolled_back & canon), "rolled back, yet in the database")
        _add(violations, "never_attempted", sorted(never), "in the database, but no producer attempted them")
        expected, allowed = canon, canon
        counts.update(
            canonical=len(canon),
            unknown_committed=len(unknown & canon) + len(absorbed),
            unknown_not_committed=len(unknown - canon) + sum(h.anonymous_unknown.values()) - len(absorbed),
        )
    else:
        expected, allowed = committed, committed | unknown

    group_names = set(groups)
    if isinstance(dead_letter_ids, Mapping):
        letters = {g: Counter(str(c) for c in ids) for g, ids in dead_letter_ids.items()}
        group_names |= set(letters)
    else:
        letters = {"": Counter(str(c) for c in dead_letter_ids)}

    applied_counts: dict[str, dict[str, int]] = {}
    for consumer in sorted(applied_by_consumer):
        seen = Counter(str(c) for c in applied_by_consumer[consumer])
        is_group = consumer in group_names
        exp = expected - poison if is_group else expected
        ok = allowed - poison if is_group else allowed
        applied_counts[consumer] = {"records": len(seen), "applications": sum(seen.values())}
        _add(violations, "lost", sorted(exp - seen.keys()), "committed but never applied", consumer)
        twice = sorted(c for c, n in seen.items() if n > 1)
        _add(violations, "applied_twice", twice, "applied more than once", consumer, detail=seen)
        stray = seen.keys() - ok
        for reason, cids in _classify(stray, h, poison, is_group, canonical is not None).items():
            _add(violations, "unexpected", sorted(cids), f"applied but {reason}", consumer)
    counts["applied"] = applied_counts

    good_poison = poison & allowed
    dead_total = 0
    for group, found in sorted(letters.items()):
        dead_total += sum(found.values())
        label = group or None
        _add(violations, "dead_letter_unexpected", sorted(found.keys() - good_poison), "dead-lettered", label)
    for group in sorted(group_names):
        found = letters.get(group, letters.get("", Counter()))
        missing = (poison & expected) - found.keys()
        _add(violations, "poison_not_dead_lettered", sorted(missing), "poison records not in the dead letters", group)
    counts["dead_letters"] = dead_total
    counts["poison_committed"] = len(poison & expected)
    counts["dead_letter_copies"] = sum(n - 1 for found in letters.values() for n in found.values() if n > 1)

    if states is not None:
        for consumer, state in sorted(states.items()):
            if state != canonical_state:
                violations.append(
                    Violation(
                        "state_mismatch",
                        f"{consumer}'s state {_show(state)} differs from the canonical {_show(canonical_state)}",
                        consumer,
                    )
                )
    if staged_count:
        violations.append(Violation("staged_not_empty", f"{staged_count} records still in staged_log_records"))
    pending_map = pending if isinstance(pending, Mapping) else {"": pending}
    for group, n in sorted(pending_map.items()):
        if n:
            who = f"{group}: " if group else ""
            violations.append(Violation("pending_entries", f"{who}{n} entries still pending", group or None))
    for consumer, n in sorted((lag or {}).items()):
        if n:
            message = f"{consumer}: {n} entries behind the end of the stream"
            violations.append(Violation("not_caught_up", message, consumer))
    return Verdict(violations, counts)


def _absorb(strangers: set[str], anonymous: Counter[str]) -> tuple[set[str], set[str]]:
    """Attribute canonical ids no attempt named to attempts of unknown outcome whose ids were unknown (an API call
    that timed out), matching by prefix, one id per attempt; return (attributed, left over)."""
    budget = Counter(anonymous)
    absorbed, never = set(), set()
    for cid in sorted(strangers):
        prefix = next((p for p in sorted(budget, key=len, reverse=True) if budget[p] and cid.startswith(p)), None)
        if prefix is None:
            never.add(cid)
        else:
            budget[prefix] -= 1
            absorbed.add(cid)
    return absorbed, never


def _classify(
    stray: Iterable[str], h: HistorySummary, poison: set[str], is_group: bool, with_canonical: bool
) -> dict[str, list[str]]:
    reasons: dict[str, list[str]] = {}
    for cid in stray:
        outcome = h.outcome.get(cid)
        if is_group and cid in poison:
            reason = "a poison record (the group's handler always fails on it)"
        elif outcome == "rolled_back":
            reason = "its transaction rolled back"
        elif outcome is None:
            reason = "never attempted" + (" and not in the database" if with_canonical else "")
        elif outcome == "unknown":
            reason = "its outcome was unknown and it is not in the database"
        else:
            reason = "it is missing from the database"
        reasons.setdefault(reason, []).append(cid)
    return reasons


def _add(
    violations: list[Violation],
    kind: str,
    cids: Sequence[str],
    what: str,
    consumer: str | None = None,
    *,
    detail: Mapping[str, int] | None = None,
) -> None:
    if not cids:
        return
    shown = ", ".join(f"{c} (x{detail[c]})" if detail else c for c in cids[:10])
    more = f" and {len(cids) - 10} more" if len(cids) > 10 else ""
    who = f"{consumer}: " if consumer else ""
    violations.append(Violation(kind, f"{who}{len(cids)} records {what}: {shown}{more}", consumer, tuple(cids)))


def _show(state: Any) -> str:
    if hasattr(state, "as_dict"):
        return json.dumps(state.as_dict(), sort_keys=True)
    return repr(state)


# -- the consumer wrapper ----------------------------------------------------------------------------------------------


class PoisonRecord(Exception):
    """Raised by a group's tracked handler for a poison record: it must end up in the dead letters."""


def record_cid(record: Record) -> str:
    """A record's chaos id: ``data["cid"]``, else ``ride-<id>`` for a ride, else its position."""
    pos = record.position
    return cid_of(record.object, record.data, record.producer, pos, record.id)


def cid_of(obj: str | None, data: Any, producer: str, position: tuple[int, int] | None, entry_id: str) -> str:
    """The chaos id of a record given its parts (for consumers that do not see :class:`Record` objects, Spark)."""
    if isinstance(data, dict):
        if data.get("cid") is not None:
            return str(data["cid"])
        if obj == "ride" and data.get("id") is not None:
            return f"{API_CID_PREFIX}{data['id']}"
    return f"{producer}:{position[0]}:{position[1]}" if position else entry_id


def is_poison(record: Record) -> bool:
    data = record.data
    return record.object == POISON_OBJECT and isinstance(data, dict) and bool(data.get("poison"))


class _WithoutPoison(Sequence[Record]):
    """The batch minus its poison records. Iterating it iterates the original batch, so an injected mid-batch crash
    still happens inside the handler."""

    def __init__(self, batch: Sequence[Record], keep: Sequence[int]) -> None:
        self._batch = batch
        self._keep = set(keep)
        self._records = [batch[i] for i in keep]
        self.consumer = getattr(batch, "consumer", "")

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, index: Any) -> Any:
        return self._records[index]

    def __iter__(self) -> Iterator[Record]:
        for i, record in enumerate(self._batch):
            if i in self._keep:
                yield record


TRACK_SQL = (
    "INSERT INTO chaos_applied (consumer, cid, entry_id) SELECT %s, c, e FROM unnest(%s::text[], %s::text[]) AS t(c, e)"
)


def tracked(handler: Handler, *, fail_poison: bool = False, consumer: str | None = None) -> Handler:
    """Wrap ``handler`` so that, in the transaction unilog gives it, every record of the batch is first recorded in
    ``chaos_applied`` under the consumer's name, then the handler runs on the batch without poison records.

    Recording before the handler runs means a handler that commits on its own (its state and unilog's checkpoint
    then commit separately) leaves its tracking rows committed too, so a replay shows up as a record applied twice.
    With ``fail_poison`` (consumer groups) a batch holding a poison record raises :class:`PoisonRecord`: the group
    retries the others one by one and dead-letters the poison.
    """

    def wrapped(conn: psycopg.Connection[Any], records: Sequence[Record]) -> Any:
        name = consumer or getattr(records, "consumer", "") or "consumer"
        items = [records[i] for i in range(len(records))]  # indexing: a mid-batch crash is left to the handler
        poison = [i for i, r in enumerate(items) if is_poison(r)]
        if poison and fail_poison:
            raise PoisonRecord("poison records " + ", ".join(record_cid(items[i]) for i in poison))
        if items:
            conn.execute(TRACK_SQL, (name, [record_cid(r) for r in items], [r.id for r in items]))
        if not poison:
            return handler(conn, records)
        keep = [i for i in range(len(items)) if i not in set(poison)]
        return handler(conn, _WithoutPoison(records, keep)) if keep else None

    wrapped.__name__ = f"tracked_{getattr(handler, '__name__', 'handler')}"
    return wrapped


# -- the fault schedule ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultRates:
    """How many faults of each kind per minute (0 disables a kind)."""

    kill: float = 15.0
    pause: float = 5.0
    redis_restart: float = 0.8
    postgres_restart: float = 0.7
    redis_pause: float = 0.4
    network: float = 6.0  # proxy faults (reset, cut, blackhole, drop_replies) over both proxies


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

    ``servers``: the servers the runner may restart or pause (none when you gave your own URLs); ``proxies``: the
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
    events.sort(key=lambda e: (e.at, e.kind, e.target))
    return events


# -- observing and collecting ------------------------------------------------------------------------------------------


@dataclass
class Progress:
    """How far the system is from quiet: staged records, lag per consumer, pending entries per group."""

    staged: int
    stream_length: int
    lag: dict[str, int]
    pending: dict[str, int]
    dead_letters: int
    rides: int = 0

    @property
    def quiet(self) -> bool:
        return self.staged == 0 and not any(self.lag.values()) and not any(self.pending.values())


def progress(
    database_url: str,
    redis_url: str,
    *,
    stream: str = STREAM,
    consumers: Sequence[str] = CHECKPOINT_CONSUMERS,
    groups: Sequence[str] = (GROUP,),
) -> Progress:
    """Read :class:`Progress` directly from the servers."""
    with psycopg.connect(database_url, autocommit=True, connect_timeout=5) as conn:
        staged, _age = store.staged_backlog(conn)
        checkpoints = {cp.name: cp for cp in store.list_checkpoints(conn)}
        row = conn.execute("SELECT count(*) FROM rides").fetchone() if _has_table(conn, "rides") else None
    api = engine.RedisStreams(engine.connect(redis_url, socket_timeout=5))
    try:
        length = api.info(stream).length
        lag = {}
        for name in consumers:
            cp = checkpoints.get(name)
            lag[name] = api.entries_after(stream, cp.last_id) if cp else length
        pending = {}
        infos = {str(g["name"]): g for g in api.groups(stream)}
        for group in groups:
            info = infos.get(group)
            lag[group] = api.entries_after(stream, str(info["last-delivered-id"])) if info else length
            pending[group] = int(info["pending"]) if info else 0
        dead = int(api.client.xlen(engine.dlq_key(stream)))
    finally:
        api.close()
    return Progress(staged, length, lag, pending, dead, int(row[0]) if row else 0)


def _has_table(conn: psycopg.Connection[Any], name: str) -> bool:
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()
    return bool(row and row[0])


@dataclass
class Observation:
    """Everything :func:`check` needs, as read from a fleet's servers and history by :func:`collect`."""

    history: list[dict[str, Any]]
    applied: dict[str, list[str]]
    canonical: set[str]
    poison: set[str]
    dead_letters: dict[str, list[str]]
    groups: list[str]
    staged_count: int
    pending: dict[str, int]
    lag: dict[str, int]
    states: dict[str, Any] | None = None
    canonical_state: Any = None

    def check(self) -> Verdict:
        return check(
            self.history,
            self.applied,
            poison_ids=self.poison,
            dead_letter_ids=self.dead_letters,
            groups=self.groups,
            canonical=self.canonical,
            states=self.states,
            canonical_state=self.canonical_state,
            staged_count=self.staged_count,
            pending=self.pending,
            lag=self.lag,
        )


def collect(
    database_url: str,
    redis_url: str,
    history: Iterable[Path | str] | Sequence[dict[str, Any]],
    *,
    stream: str = STREAM,
    consumers: Sequence[str] = CHECKPOINT_CONSUMERS,
    groups: Sequence[str] = (GROUP,),
    compare_states: bool = True,
) -> Observation:
    """Read a chaos run's data: the history (JSON-lines files or a directory of them, or events), ``chaos_applied``,
    the canonical ids (``rides`` and ``chaos_produced``), the dead letters of ``stream``, what is still staged,
    pending and unread, and, with ``compare_states``, the distance consumers' states and the canonical totals."""
    items = list(history)
    events = (
        [e for e in items if isinstance(e, dict)]
        if items and isinstance(items[0], dict)
        else read_history([Path(p) for p in items if not isinstance(p, dict)])
    )
    now = progress(database_url, redis_url, stream=stream, consumers=consumers, groups=groups)
    names = [*consumers, *groups]
    with psycopg.connect(database_url, autocommit=True, connect_timeout=5) as conn:
        applied: dict[str, list[str]] = {name: [] for name in names}
        with conn.cursor() as cur:
            for consumer, cid in cur.execute("SELECT consumer, cid FROM chaos_applied ORDER BY applied_at"):
                applied.setdefault(consumer, []).append(cid)
        canonical = {r[0] for r in conn.execute(CANONICAL_CIDS_SQL)}
        poison = {r[0] for r in conn.execute("SELECT cid FROM chaos_produced WHERE poison")}
        states = canonical_state = None
        if compare_states:
            from services.rides import canonical_totals, consumer_totals

            totals = consumer_totals(conn)
            states = {name: totals.get(name) for name in names}
            canonical_state = canonical_totals(conn)
    api = engine.RedisStreams(engine.connect(redis_url, socket_timeout=5))
    try:
        letters: dict[str, list[str]] = {group: [] for group in groups}
        raw: Any = api.client.xrange(engine.dlq_key(stream))
        for entry_id, fields in raw:
            group = engine.to_str(fields.get(b"dlq_group", b""))
            letters.setdefault(group, []).append(record_cid(Record(stream, entry_id, fields)))
    finally:
        api.close()
    return Observation(
        history=events,
        applied=applied,
        canonical=canonical,
        poison=poison,
        dead_letters=letters,
        groups=list(groups),
        staged_count=now.staged,
        pending=now.pending,
        lag=now.lag,
        states=states,
        canonical_state=canonical_state,
    )


# -- the runner --------------------------------------------------------------------------------------------------------


@dataclass
class ChaosConfig:
    """A chaos run. Defaults are the ``unilog chaos`` command's.

    ``handler``: the consumer handler under test (``module:function``; default the demo's distance consumer).
    ``compare_states``: compare the distance consumers' states with the ``rides`` table (default: only with the
    default handler). ``database_url``/``redis_url``: throw-away servers to use instead of embedded ones (they must
    be empty of the demo's data; server restarts and pauses are then skipped). ``pythonpath``: extra import paths
    for the fleet (where your handler lives). ``extra_processes``/``extra_consumers``: more fleet processes and the
    names they record in ``chaos_applied`` (checked like checkpoint consumers). ``spark``: run the demo's Spark
    distance consumer too (``spark0``; default: when pyspark and Java are installed); it runs the demo's Spark
    effect whatever ``handler`` is.
    """

    duration: float = 60.0
    seed: int = 1
    database_url: str | None = None
    redis_url: str | None = None
    handler: str = DEFAULT_HANDLER
    compare_states: bool | None = None
    rate: float = 20.0
    producer_rate: float = 6.0
    rollback: float = 0.15
    poison: float = 0.01
    faults: FaultRates = field(default_factory=FaultRates)
    library_faults: bool = True
    streamer_faults: str = STREAMER_FAULTS
    consumer_faults: str = CONSUMER_FAULTS
    group_faults: str = GROUP_FAULTS
    quiesce_timeout: float = 180.0
    log_dir: Path | None = None
    keep_logs: bool | None = None  # None: keep them if log_dir was given or the verdict fails; False: on failure
    report_path: Path | None = None
    pythonpath: Sequence[str] = ()
    extra_processes: Sequence[ProcessSpec] = ()
    extra_consumers: Sequence[str] = ()
    status_interval: float = 10.0
    spark: bool | None = None  # None: when pyspark and Java are installed

    def use_spark(self) -> bool:
        from .demo import spark_available

        return spark_available() if self.spark is None else self.spark

    def consumers(self) -> list[str]:
        """The checkpoint consumers (the Spark one included) whose applications are checked."""
        return [*CHECKPOINT_CONSUMERS, *([SPARK] if self.use_spark() else []), *self.extra_consumers]


@dataclass
class ChaosResult:
    verdict: Verdict
    report: dict[str, Any]
    report_path: Path | None


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
    ) -> None:
        self.fleet = fleet
        self.postgres = postgres
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


def fleet_specs(
    config: ChaosConfig, *, api_port: int, history_dir: Path, state_dir: Path, python: str = sys.executable
) -> list[ProcessSpec]:
    """The chaos fleet: API, simulator, two direct producers, two streamers, two checkpoint consumers and the group's
    two workers (half of the streamers and consumers exit on an injected crash, the others restart in-process), the
    Spark consumer (``config.use_spark()``) and ``config.extra_processes``."""
    seed = config.seed
    lib = config.library_faults

    def seeded(name: str, index: int) -> list[str]:
        return ["--seed-base", str(seed * 100 + index), "--incarnations", str(state_dir / f"{name}.incarnations")]

    specs = [
        ProcessSpec(
            API,
            [
                python,
                "-m",
                "gunicorn",
                "--bind",
                f"127.0.0.1:{api_port}",
                "--workers",
                "2",
                "--threads",
                "4",
                "--graceful-timeout",
                "5",
                "services.api:app",
            ],
        ),
    ]
    for i, name in enumerate(STREAMERS):
        argv = [python, "-m", "unilog.chaos", "streamer", *seeded(name, i), "--name", name, "--poll-interval", "0.5"]
        specs.append(
            ProcessSpec(
                name,
                argv + (["--exit-on-crash"] if i else []),
                {"UNILOG_FAULTS": config.streamer_faults if lib else ""},
            )
        )
    consume = [python, "-m", "unilog.chaos", "consume", "--handler", config.handler]
    common = ["--stream", STREAM, "--log-json", "--block-ms", "250"]
    for i, name in enumerate(CHECKPOINT_CONSUMERS):
        argv = [*consume, *seeded(name, 10 + i), "--name", name, *common]
        specs.append(
            ProcessSpec(
                name,
                argv + (["--exit-on-crash"] if i else []),
                {"UNILOG_FAULTS": config.consumer_faults if lib else ""},
            )
        )
    for i, name in enumerate(GROUP_WORKERS):
        argv = [
            *consume,
            "--fail-poison",
            *seeded(name, 20 + i),
            "--group",
            GROUP,
            "--worker",
            name,
            *common,
            "--claim-idle-ms",
            "2000",
            "--max-deliveries",
            "3",
        ]
        specs.append(
            ProcessSpec(
                name, argv + (["--exit-on-crash"] if i else []), {"UNILOG_FAULTS": config.group_faults if lib else ""}
            )
        )
    if config.use_spark():
        argv = [python, "-m", "unilog.chaos", "spark", SPARK, "--checkpoint", str(state_dir / f"{SPARK}-checkpoint")]
        specs.append(ProcessSpec(SPARK, argv))
    specs.extend(config.extra_processes)
    for i, name in enumerate(PRODUCERS):
        specs.append(
            ProcessSpec(
                name,
                [
                    python,
                    "-m",
                    "unilog.chaos",
                    "produce",
                    "--name",
                    name,
                    "--history",
                    str(history_dir / f"{name}.jsonl"),
                    "--seed",
                    str(seed * 100 + 30 + i),
                    "--rate",
                    str(config.producer_rate),
                    "--rollback",
                    str(config.rollback),
                    "--poison",
                    str(config.poison),
                ],
            )
        )
    specs.append(
        ProcessSpec(
            SIMULATOR,
            [
                python,
                "-m",
                "services.simulator",
                "--api",
                f"http://127.0.0.1:{api_port}",
                "--rate",
                str(config.rate),
                "--seed",
                str(seed),
                "--history",
                str(history_dir / f"{SIMULATOR}.jsonl"),
            ],
        )
    )
    return specs


def run_chaos(config: ChaosConfig, *, out: TextIO | None = None, stop: threading.Event | None = None) -> ChaosResult:
    """Run the fleet under the seeded fault schedule, heal, quiesce, check; print a summary; write the report."""
    from .demo import project_root

    out = out or sys.stdout
    stop = stop or threading.Event()
    root = project_root()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    for path in (os.getcwd(), *config.pythonpath):
        if path not in sys.path:
            sys.path.insert(0, path)
    from services.migrate import prepare
    from services.rides import STREAM as SERVICES_STREAM

    assert SERVICES_STREAM == STREAM, "services.rides.STREAM changed"
    load_handler(config.handler)  # fail now, not in every consumer process
    compare_states = config.handler == DEFAULT_HANDLER if config.compare_states is None else config.compare_states
    log_dir = Path(config.log_dir) if config.log_dir else Path(tempfile.mkdtemp(prefix=f"unilog-chaos-{config.seed}-"))
    history_dir, state_dir = log_dir / "history", log_dir / "state"
    for directory in (history_dir, state_dir):
        directory.mkdir(parents=True, exist_ok=True)
    consumers = config.consumers()
    report: dict[str, Any] = {
        "seed": config.seed,
        "duration": config.duration,
        "handler": config.handler,
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
    }
    notes: list[str] = []

    with contextlib.ExitStack() as stack:
        pg = rd = None
        if config.database_url:
            pg_url = config.database_url
            notes.append("Postgres given by URL: its restarts are skipped")
        else:
            pg = stack.enter_context(EmbeddedPostgres())
            pg_url = pg.url
        if config.redis_url:
            redis_url = config.redis_url
            notes.append("Redis given by URL: its restarts and pauses are skipped")
        else:
            rd = stack.enter_context(EmbeddedRedis(appendonly=True, appendfsync="always"))
            redis_url = rd.url
        report["servers"] = {
            "postgres": f"embedded {pg.version}" if pg else "given",
            "redis": f"embedded {rd.version} (appendonly yes, appendfsync always)" if rd else "given",
        }
        prepare(pg_url)
        _prepare_chaos(pg_url, redis_url, consumers)
        _declare(redis_url, consumers)
        proxies: dict[str, FaultProxy] = {}
        fleet_urls = {}
        for side, url in (("postgres", pg_url), ("redis", redis_url)):
            proxy = _proxy_for(url)
            if proxy is None:
                notes.append(f"{side} is not on a loopback TCP address: no fault proxy, its network faults skipped")
                fleet_urls[side] = url
                continue
            proxies[side] = stack.enter_context(proxy)
            fleet_urls[side] = proxy.url_for(url)
        api_port = free_port()
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("UNILOG_", "DATABASE_URL", "REDIS_URL"))},
            "DATABASE_URL": fleet_urls["postgres"],
            "REDIS_URL": fleet_urls["redis"],
            "UNILOG_STREAM": STREAM,
            "PYTHONPATH": os.pathsep.join(dict.fromkeys([str(root), os.getcwd(), *config.pythonpath])),
        }
        fleet = Fleet(log_dir, cwd=root, base_env=env)
        specs = fleet_specs(config, api_port=api_port, history_dir=history_dir, state_dir=state_dir)
        servers = [s for s, server in (("postgres", pg), ("redis", rd)) if server is not None]
        schedule = build_schedule(
            config.seed, config.duration, [s.name for s in specs], config.faults, servers=servers, proxies=list(proxies)
        )
        report.update(notes=notes, schedule=[e.to_dict() for e in schedule], log_dir=str(log_dir))
        _print_header(config, report, specs, schedule, out)
        injector = Injector(fleet, pg, rd, proxies)
        quiesced, quiesce_seconds, codes = False, 0.0, {}
        try:
            by_name = {s.name: s for s in specs}
            fleet.start(by_name[API])
            _wait_for_api(api_port, fleet)
            for spec in specs:
                if spec.name != API:
                    fleet.start(spec)
            fleet.watch()
            t0 = time.monotonic()
            injector.start(schedule, t0)
            _chaos_phase(config, pg_url, redis_url, consumers, fleet, injector, stop, t0, out)
            print(f"[{time.monotonic() - t0:6.1f}s] healing: proxies pass, processes continued, servers up", file=out)
            injector.heal()
            for name in (SIMULATOR, *PRODUCERS, API):
                fleet.stop(name)
            print(f"[{time.monotonic() - t0:6.1f}s] producers stopped; waiting for the system to quiesce", file=out)
            began = time.monotonic()
            quiesced = _quiesce(pg_url, redis_url, consumers, config.quiesce_timeout, out, t0)
            quiesce_seconds = round(time.monotonic() - began, 1)
        finally:
            injector.heal()
            codes = fleet.stop_all(order=[SIMULATOR, *PRODUCERS, API, *STREAMERS, *consumers, *GROUP_WORKERS])
        observation = collect(
            pg_url, redis_url, [history_dir], consumers=consumers, groups=[GROUP], compare_states=compare_states
        )
        verdict = observation.check()
        report.update(
            faults={"injected": injector.counts(), "library": dict(sorted(fleet.faults().items()))},
            executed=[
                {**e.event.to_dict(), "at_actual": e.at, "status": e.status, "detail": e.detail}
                for e in sorted(injector.executed, key=lambda e: e.at)
            ],
            recoveries=_recoveries(fleet, log_dir),
            quiesced=quiesced,
            quiesce_seconds=quiesce_seconds,
            exit_codes=codes,
            consumers=_consumer_report(observation, verdict),
            verdict=verdict.to_dict(),
        )
    report_path = config.report_path or Path(f"chaos-report-{config.seed}.json")
    report_path.write_text(json.dumps(report, indent=2, default=str))
    print(format_summary(report, report_path), file=out, flush=True)
    keep = not verdict.ok or config.keep_logs is True or (config.keep_logs is None and config.log_dir is not None)
    if not keep:
        import shutil

        shutil.rmtree(log_dir, ignore_errors=True)
        print(f"logs removed (the run passed; give a log folder to keep them): {log_dir}", file=out, flush=True)
    return ChaosResult(verdict, report, report_path)


def _prepare_chaos(pg_url: str, redis_url: str, consumers: Sequence[str]) -> None:
    """Create the chaos tables; refuse servers that already hold the demo's data (they must be throw-away)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for ddl in CHAOS_DDL:
            conn.execute(ddl)
        found = {}
        for table in ("rides", "consumer_states", "chaos_applied", "chaos_produced", "staged_log_records"):
            row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
            if row and row[0]:
                found[table] = int(row[0])
        row = conn.execute(
            "SELECT count(*) FROM unilog_checkpoints WHERE name = ANY(%s)", (list(consumers),)
        ).fetchone()
        if row and row[0]:
            found["unilog_checkpoints"] = int(row[0])
    client = engine.connect(redis_url, socket_timeout=5)
    try:
        if client.exists(STREAM, engine.dlq_key(STREAM)):
            found[f"redis {STREAM}"] = 1
    finally:
        client.close()
    if found:
        raise ConfigurationError(
            "unilog chaos needs throw-away servers without the demo's data, found: "
            + ", ".join(f"{k} ({v})" for k, v in found.items())
        )


def _declare(redis_url: str, consumers: Sequence[str]) -> None:
    """Register every checkpoint consumer at the stream's start and create the group before any traffic, as a
    deployment declares its consumers: one that starts late (the Spark consumer's JVM takes seconds) must find its
    history still there."""
    api = engine.RedisStreams(engine.connect(redis_url, socket_timeout=5))
    try:
        for name in consumers:
            api.register(STREAM, name, "0-0")
        api.ensure_group(STREAM, GROUP)
    finally:
        api.close()


def _proxy_for(url: str) -> FaultProxy | None:
    parts = urlsplit(url)
    if parts.scheme.partition("+")[0] not in ("postgres", "postgresql", "redis"):
        return None
    port = parts.port or (6379 if parts.scheme.startswith("redis") else 5432)
    try:
        return FaultProxy(parts.hostname or "", port)
    except ValueError:
        return None


def _wait_for_api(port: int, fleet: Fleet, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise UnilogError(f"the API did not come up; see {fleet.log_dir / 'api.log'}")


def _chaos_phase(
    config: ChaosConfig,
    pg_url: str,
    redis_url: str,
    consumers: Sequence[str],
    fleet: Fleet,
    injector: Injector,
    stop: threading.Event,
    t0: float,
    out: TextIO,
) -> None:
    next_status = t0 + config.status_interval
    while not stop.wait(min(1.0, max(0.0, t0 + config.duration - time.monotonic()))):
        now = time.monotonic()
        if now - t0 >= config.duration:
            return
        if now >= next_status:
            next_status += config.status_interval
            print(_status_line(now - t0, pg_url, redis_url, consumers, fleet, injector), file=out, flush=True)


def _status_line(
    elapsed: float, pg_url: str, redis_url: str, consumers: Sequence[str], fleet: Fleet, injector: Injector
) -> str:
    try:
        p = progress(pg_url, redis_url, consumers=consumers)
        lags = " ".join(f"{n}={lag}" for n, lag in p.lag.items())
        state = (
            f"rides={p.rides} staged={p.staged} stream={p.stream_length} lag {lags} pending={sum(p.pending.values())}"
        )
    except Exception as exc:
        state = f"(servers unavailable: {type(exc).__name__})"
    done = Counter(e.event.kind for e in injector.executed if e.status == "done")
    faults = " ".join(f"{k}={v}" for k, v in sorted(done.items())) or "none yet"
    restarts = sum(v for k, v in fleet.events.items() if k.startswith("restart:"))
    return f"[{elapsed:6.1f}s] {state} | faults {faults} | process restarts {restarts}"


def _quiesce(pg_url: str, redis_url: str, consumers: Sequence[str], timeout: float, out: TextIO, t0: float) -> bool:
    """Wait until nothing is staged, every consumer is at the end and nothing is pending, three polls in a row."""
    deadline = time.monotonic() + timeout
    quiet_polls, last_print = 0, time.monotonic()
    while True:
        try:
            now = progress(pg_url, redis_url, consumers=consumers)
            quiet_polls = quiet_polls + 1 if now.quiet else 0
            summary = f"staged={now.staged} lag={now.lag} pending={now.pending} dead letters={now.dead_letters}"
        except Exception as exc:
            quiet_polls, summary = 0, f"servers unavailable: {exc!r}"
        if quiet_polls >= 3:
            return True
        if time.monotonic() > deadline:
            print(f"[{time.monotonic() - t0:6.1f}s] did not quiesce within {timeout:.0f}s: {summary}", file=out)
            return False
        if time.monotonic() - last_print >= 10:
            last_print = time.monotonic()
            print(f"[{time.monotonic() - t0:6.1f}s] quiescing: {summary}", file=out, flush=True)
        time.sleep(0.5)


LOG_EVENTS = {
    "crashed (injected); restarting in-process": "in_process_restarts",
    "streamer crashed (injected); restarting": "in_process_restarts",
    "connection failed; retrying": "reconnects",
    "streamer pass failed; retrying": "reconnects",
    "listen connection lost; polling": "reconnects",
    "stream lock acquired": "stream_lock_acquisitions",
    "claimed idle entries": "group_claims",
    "record dead-lettered": "dead_lettered",
    "postgres call exceeded its deadline; breaking the connection": "deadline_breaks",
    "checkpoint moved underneath; re-reading": "checkpoint_moved",
    "pending entries were deleted from the stream before anyone applied them": "pending_trimmed",
    "stream is missing confirmed positions: Redis lost data": "redis_lost_data",
}


def _recoveries(fleet: Fleet, log_dir: Path) -> dict[str, Any]:
    """Process restarts (from the supervisor) and recoveries the processes logged themselves."""
    events: Counter[str] = Counter()
    exits: Counter[str] = Counter()
    for path in sorted(log_dir.glob("*.log")):
        with path.open("rb") as lines:
            for raw in lines:
                if raw.startswith(b"{"):
                    with contextlib.suppress(ValueError):
                        name = LOG_EVENTS.get(json.loads(raw).get("event", ""))
                        if name:
                            events[name] += 1
                elif raw.startswith(b"unilog: "):
                    exits[_exit_reason(raw.decode(errors="replace").strip())] += 1
    restarts = {k.removeprefix("restart:"): v for k, v in sorted(fleet.events.items()) if k.startswith("restart:")}
    return {
        "process_restarts": sum(restarts.values()),
        "process_restarts_by_name": restarts,
        **dict(sorted(events.items())),
        "exits": dict(sorted(exits.items())),
    }


def _exit_reason(text: str) -> str:
    """A process's last words on stderr, grouped."""
    for needle, reason in (
        ("injected crash", "injected crash (exit 7)"),
        ("cannot connect to Postgres", "Postgres unreachable at start-up (exit 4)"),
        ("cannot connect to Redis", "Redis unreachable at start-up (exit 4)"),
        ("StreamGap", "data loss detected (exit 8)"),
        ("StreamRewound", "data loss detected (exit 8)"),
        ("spark consumer", "Spark query failed (exit 1)"),
    ):
        if needle in text:
            return reason
    return text[:100]


def _consumer_report(observation: Observation, verdict: Verdict) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, applied in verdict.counts.get("applied", {}).items():
        row = dict(applied)
        if observation.states is not None:
            state: Any = observation.states.get(name)
            row["state"] = state.as_dict() if hasattr(state, "as_dict") else state
            row["state_equals_canonical"] = state == observation.canonical_state
        row["dead_letters"] = len(observation.dead_letters.get(name, []))
        result[name] = row
    if observation.canonical_state is not None and hasattr(observation.canonical_state, "as_dict"):
        result["canonical"] = observation.canonical_state.as_dict()
    return result


def _print_header(
    config: ChaosConfig,
    report: dict[str, Any],
    specs: Sequence[ProcessSpec],
    schedule: Sequence[FaultEvent],
    out: TextIO,
) -> None:
    servers = report["servers"]
    print(
        f"unilog chaos: seed {config.seed}, {config.duration:.0f} s of faults; Postgres {servers['postgres']}, "
        f"Redis {servers['redis']}",
        file=out,
    )
    print(f"  fleet: {', '.join(s.name for s in specs)}; handler {config.handler}", file=out)
    kinds = Counter(e.kind for e in schedule)
    print(
        f"  schedule: {len(schedule)} faults (" + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + ")",
        file=out,
    )
    if config.library_faults:
        print(
            f"  library faults: streamers {config.streamer_faults}; consumers {config.consumer_faults}; "
            f"group {config.group_faults}",
            file=out,
        )
    for note in report.get("notes", []):
        print(f"  note: {note}", file=out)
    print(f"  logs: {report['log_dir']}", file=out, flush=True)


def format_summary(report: Mapping[str, Any], report_path: Path | None = None) -> str:
    """The human summary of a chaos report: records, faults by kind, recoveries, consumers, verdict."""
    verdict = report["verdict"]
    counts = verdict["counts"]
    lines = ["", "records:"]
    lines.append(
        f"  {counts['attempts']} attempts (transactions and API calls): "
        + ", ".join(f"{source} {dict(by)}" for source, by in counts.get("by_source", {}).items())
    )
    lines.append(
        f"  {counts['records']} records with an id: {counts['committed']} committed, {counts['rolled_back']} rolled "
        f"back, {counts['unknown']} unknown; {counts['unknown_anonymous']} API calls of unknown outcome; "
        f"{counts.get('unknown_committed', '?')} unknown outcomes turned out committed; "
        f"{counts.get('canonical', '?')} records in the database ({counts['poison']} poison)"
    )
    faults = report.get("faults", {})
    lines.append("faults injected:")
    for kind, c in faults.get("injected", {}).items():
        extra = ", ".join(f"{k} {v}" for k, v in c.items() if k != "done" and v)
        lines.append(f"  {kind:<22} {c['done']:>5}" + (f"  ({extra})" if extra else ""))
    library = faults.get("library", {})
    lines.append("  library: " + (", ".join(f"{k}={v}" for k, v in library.items()) or "none"))
    rec = report.get("recoveries", {})
    by_name = ", ".join(f"{k} {v}" for k, v in rec.get("process_restarts_by_name", {}).items())
    lines.append(f"recoveries: {rec.get('process_restarts', 0)} process restarts ({by_name})")
    others = {k: v for k, v in rec.items() if k not in ("process_restarts", "process_restarts_by_name", "exits")}
    if others:
        lines.append("  " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in others.items()))
    if rec.get("exits"):
        lines.append("  exits: " + "; ".join(f"{k} x{v}" for k, v in rec["exits"].items()))
    lines.append("  (exits are restarted by the supervisor; the process restarts above include them)")
    lines.append(
        f"quiesce: {'quiet' if report.get('quiesced') else 'NOT quiet'} after {report.get('quiesce_seconds', 0)} s"
    )
    lines.append("consumers:")
    for name, row in report.get("consumers", {}).items():
        if name == "canonical":
            lines.append(f"  {'canonical':<10} {json.dumps(row)}")
            continue
        state = ""
        if "state" in row:
            state = f"; state {'=' if row['state_equals_canonical'] else '!='} canonical"
        lines.append(f"  {name:<10} applied {row['records']} records in {row['applications']} applications{state}")
    ok = verdict["ok"]
    kinds = Counter(v["kind"] for v in verdict["violations"])
    lost = sum(len(v["cids"]) for v in verdict["violations"] if v["kind"] == "lost")
    twice = sum(len(v["cids"]) for v in verdict["violations"] if v["kind"] == "applied_twice")
    unexpected = sum(len(v["cids"]) for v in verdict["violations"] if v["kind"] == "unexpected")
    lines.append(
        f"verdict: {'PASS' if ok else 'FAIL'} — lost {lost}, unexpected {unexpected}, applied twice {twice}, "
        f"dead letters {counts['dead_letters']} (committed poison records {counts.get('poison_committed', '?')}), "
        + (
            "staged 0, pending 0, every consumer at the end, states equal canonical"
            if ok
            else "violations: " + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items()))
        )
    )
    for violation in verdict["violations"]:
        lines.append(f"  {violation['kind'].upper()}: {violation['message']}")
    if report_path is not None:
        lines.append(f"report: {report_path}")
    return "\n".join(lines)


def print_schedule(schedule: Sequence[FaultEvent], out: TextIO | None = None) -> None:
    for event in schedule:
        print(event, file=out or sys.stdout)


# -- process entry points: python -m unilog.chaos produce | streamer | consume -----------------------------------------


STATEMENT_DEADLINE = 5.0


@dataclass
class _Open:
    aid: str
    cids: list[str]
    commit: bool
    due: float


class ChaosProducer:
    """A direct library producer: ``connections`` connections, each holding at most one open transaction.

    Transactions start at ``rate`` per second on a free connection, stage 1 to ``max_records`` rides (each also a
    row in ``rides`` and in ``chaos_produced``, and now and then a poison record instead), stay open a random time
    (``max_hold``, and now and then four times longer), then commit (or, with probability ``rollback``, roll back):
    they commit in another order than they began. Every attempt and outcome goes to the history.
    """

    def __init__(
        self,
        conninfo: str,
        history: HistoryWriter,
        *,
        name: str,
        seed: int,
        rate: float = 6.0,
        connections: int = 4,
        max_hold: float = 1.5,
        rollback: float = 0.15,
        poison: float = 0.01,
        max_records: int = 3,
        stream: str = STREAM,
    ) -> None:
        self.conninfo = conninfo
        self.history = history
        self.name = name
        self.rng = random.Random(f"{seed}:{history.allocate()}")  # a new sequence per incarnation
        self.rate = rate
        self.max_hold = max_hold
        self.rollback = rollback
        self.poison = poison
        self.max_records = max_records
        self.stream = stream
        self._conns: list[psycopg.Connection[Any] | None] = [None] * connections
        self._open: list[_Open | None] = [None] * connections
        self._retry_at = [0.0] * connections
        self.counts: Counter[str] = Counter()

    def run(self, stop: threading.Event) -> None:
        next_start = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            for i, tx in enumerate(self._open):
                if tx is not None and now >= tx.due:
                    self._finish(i)
            if now >= next_start:
                free = [i for i, tx in enumerate(self._open) if tx is None and self._retry_at[i] <= now]
                if free:
                    self._begin(self.rng.choice(free))
                next_start = max(next_start + self.rng.expovariate(self.rate), now - 1.0)
            wake = min([tx.due for tx in self._open if tx is not None] + [next_start, now + 0.05])
            stop.wait(max(0.0, wake - time.monotonic()))
        for i, tx in enumerate(self._open):
            if tx is not None:
                self._finish(i)
        for conn in self._conns:
            if conn is not None:
                conn.close()
        log.info("chaos producer stopped", producer=self.name, **self.counts)

    def _connection(self, i: int) -> psycopg.Connection[Any]:
        conn = self._conns[i]
        if conn is None or conn.closed or conn.broken:
            conn = store.connect(self.conninfo, application_name=f"chaos-{self.name}-{i}", timeout=3)
            self._conns[i] = conn
        return conn

    def _drop(self, i: int) -> None:
        conn, self._conns[i] = self._conns[i], None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _begin(self, i: int) -> None:
        from .producer import emit

        rng = self.rng
        n = self.history.allocate()
        size = 1 + rng.randrange(self.max_records)
        cids = [f"{self.name}-{n}" if size == 1 else f"{self.name}-{n}.{k}" for k in range(size)]
        poison = [cid for cid in cids if rng.random() < self.poison]
        distances = [round(rng.uniform(0.1, 1000.0), 3) for _ in cids]
        commit = rng.random() >= self.rollback
        hold = rng.uniform(0, self.max_hold) if rng.random() > 0.05 else rng.uniform(self.max_hold, 4 * self.max_hold)
        aid = self.history.attempt(n, cids, poison=poison)
        try:
            conn = self._connection(i)
            with store.deadline(conn, STATEMENT_DEADLINE):
                for cid, distance in zip(cids, distances, strict=True):
                    if cid in poison:
                        emit(
                            conn,
                            action=POISON_ACTION,
                            object=POISON_OBJECT,
                            data={"cid": cid, "poison": True},
                            stream=self.stream,
                            key=cid,
                        )
                        conn.execute("INSERT INTO chaos_produced (cid, poison) VALUES (%s, true)", (cid,))
                        continue
                    value = Decimal(repr(distance)).quantize(Decimal("0.001"))
                    row = conn.execute("INSERT INTO rides (distance) VALUES (%s) RETURNING id", (value,)).fetchone()
                    assert row is not None
                    emit(
                        conn,
                        action="create",
                        object="ride",
                        data={"id": row[0], "distance": distance, "cid": cid},
                        stream=self.stream,
                        key=f"ride-{row[0]}",
                    )
                    conn.execute("INSERT INTO chaos_produced (cid, ride_id) VALUES (%s, %s)", (cid, row[0]))
        except Exception as exc:  # nothing was committed: COMMIT was never sent
            self._drop(i)
            self.history.outcome(aid, "rolled_back", error=type(exc).__name__)
            self.counts["failed_before_commit"] += 1
            self._retry_at[i] = time.monotonic() + 0.5
            return
        self._open[i] = _Open(aid, cids, commit, time.monotonic() + hold)

    def _finish(self, i: int) -> None:
        tx, self._open[i] = self._open[i], None
        assert tx is not None
        conn = self._conns[i]
        outcome = "rolled_back"
        if conn is None or conn.closed or conn.broken:
            pass  # the session died before COMMIT: the transaction cannot have committed
        elif not tx.commit:
            try:
                with store.deadline(conn, STATEMENT_DEADLINE):
                    conn.rollback()
            except Exception:
                self._drop(i)
        elif conn.info.transaction_status != psycopg.pq.TransactionStatus.INTRANS:
            self._drop(i)  # failed inside the transaction: COMMIT would only roll it back
        else:
            try:
                with store.deadline(conn, STATEMENT_DEADLINE):
                    conn.commit()
                outcome = "committed"
            except Exception:
                outcome = "unknown"  # COMMIT was sent; whether it happened is not known
                self._drop(i)
        self.history.outcome(tx.aid, outcome)
        self.counts[outcome] += 1


def _next_incarnation(path: Path) -> int:
    try:
        n = int(path.read_text().strip() or 0)
    except (FileNotFoundError, ValueError):
        n = 0
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(n + 1))
    tmp.replace(path)
    return n


def _seed_faults(seed_base: int | None, incarnations: str | None) -> None:
    """A fault seed per incarnation: a process restarted after a crash must not replay the same crash."""
    if seed_base is None:
        return
    n = _next_incarnation(Path(incarnations)) if incarnations else 0
    os.environ["UNILOG_FAULT_SEED"] = str(seed_base * 1000 + n)


def _stop_event() -> threading.Event:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


def produce_main(argv: Sequence[str] | None = None) -> int:
    """``python -m unilog.chaos produce``: a :class:`ChaosProducer` on ``$DATABASE_URL`` until SIGTERM."""
    from .config import postgres_conninfo
    from .log import configure_logging

    parser = argparse.ArgumentParser(prog="python -m unilog.chaos produce")
    parser.add_argument("--name", required=True)
    parser.add_argument("--history", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rate", type=float, default=6.0, help="transactions per second")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--max-hold", type=float, default=1.5)
    parser.add_argument("--rollback", type=float, default=0.15)
    parser.add_argument("--poison", type=float, default=0.01)
    parser.add_argument("--max-records", type=int, default=3)
    parser.add_argument("--stream", default=STREAM)
    args = parser.parse_args(argv)
    configure_logging(json=True)
    stop = _stop_event()
    history = HistoryWriter(args.history, args.name)
    producer = ChaosProducer(
        postgres_conninfo(os.environ.get("DATABASE_URL", "")),
        history,
        name=args.name,
        seed=args.seed,
        rate=args.rate,
        connections=args.connections,
        max_hold=args.max_hold,
        rollback=args.rollback,
        poison=args.poison,
        max_records=args.max_records,
        stream=args.stream,
    )
    log.info("chaos producer started", producer=args.name, rate=args.rate)
    producer.run(stop)
    history.close()
    return 0


def _wrapper_args(prog: str, argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog=prog, allow_abbrev=False, add_help=False)
    parser.add_argument("--seed-base", type=int)
    parser.add_argument("--incarnations")
    parser.add_argument("--handler", default=DEFAULT_HANDLER)
    parser.add_argument("--fail-poison", action="store_true")
    args, rest = parser.parse_known_args(argv)
    _seed_faults(args.seed_base, args.incarnations)
    return args, rest


def streamer_main(argv: Sequence[str] | None = None) -> int:
    """``python -m unilog.chaos streamer [--seed-base N --incarnations FILE] STREAMER-OPTIONS``."""
    from .cli import main

    _args, rest = _wrapper_args("python -m unilog.chaos streamer", argv)
    return main(["--log-json", "streamer", *rest])


def consume_main(argv: Sequence[str] | None = None) -> int:
    """``python -m unilog.chaos consume --handler REF [--fail-poison] CONSUME-OPTIONS``: ``unilog consume`` with the
    handler wrapped by :func:`tracked`."""
    from . import cli

    args, rest = _wrapper_args("python -m unilog.chaos consume", argv)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        handler = load_handler(args.handler)
    except UnilogError as exc:
        print(f"unilog: error: {exc}", file=sys.stderr)
        return cli.ExitCode.HANDLER
    return cli.consume_main(tracked(handler, fail_poison=args.fail_poison), rest, prog="python -m unilog.chaos consume")


def tracked_spark_effect(name: str, effect: Any) -> Any:
    """A Spark sink effect (``effect(conn, df)``) that first records the batch's records in ``chaos_applied``, in the
    sink's transaction, like :func:`tracked` does for Python handlers."""

    def run(conn: psycopg.Connection[Any], fresh: Any) -> Any:
        rows = fresh.select("id", "producer", "epoch", "seq", "object", "data").collect()
        cids, ids = [], []
        for row in rows:
            data = json.loads(row["data"]) if row["data"] else None
            position = (int(row["epoch"]), int(row["seq"])) if row["seq"] is not None else None
            cids.append(cid_of(row["object"], data, row["producer"] or "", position, row["id"]))
            ids.append(row["id"])
        if cids:
            conn.execute(TRACK_SQL, (name, cids, ids))
        return effect(conn, fresh)

    return run


def spark_main(argv: Sequence[str] | None = None) -> int:
    """``python -m unilog.chaos spark NAME --checkpoint DIR``: the demo's Spark distance consumer with its effect
    wrapped by :func:`tracked_spark_effect` (and, like the demo's, registered for retention by its sink)."""
    from .cli import ExitCode
    from .log import configure_logging
    from .spark import TransactionalSink, spark_session

    parser = argparse.ArgumentParser(prog="python -m unilog.chaos spark")
    parser.add_argument("name")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--checkpoint", required=True)
    args = parser.parse_args(argv)
    configure_logging(json=True)
    from services.spark_consumer import state_effect

    database_url, redis_url = os.environ["DATABASE_URL"], os.environ["REDIS_URL"]
    effect = tracked_spark_effect(args.name, state_effect(args.name))
    spark = spark_session(f"unilog-chaos-{args.name}", args.master, {"spark.sql.shuffle.partitions": "1"})
    stream = (
        spark.readStream.format("unilog")
        .option("redisUrl", redis_url)
        .option("stream", STREAM)
        .option("databaseUrl", database_url)
        .option("consumer", args.name)
        .option("maxEntriesPerBatch", "20000")
        .load()
    )
    sink = TransactionalSink(database_url, args.name, STREAM, effect, redis_url=redis_url)
    query = (
        stream.writeStream.foreachBatch(sink)
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    stop = _stop_event()
    log.info("chaos spark consumer started", consumer=args.name)
    while query.isActive and not stop.wait(0.5):
        pass
    if query.isActive:
        query.stop()
    failure = query.exception()
    spark.stop()
    if failure is not None:
        text = str(failure)
        reason = next((line for line in text.splitlines() if line.startswith("unilog.errors.")), text[:300])
        print(f"unilog: error: spark consumer {args.name}: {reason.strip()}", file=sys.stderr)
        return ExitCode.DATA_LOSS if "StreamGap" in text else ExitCode.FAILURE
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"produce": produce_main, "streamer": streamer_main, "consume": consume_main, "spark": spark_main}
    if not argv or argv[0] not in commands:
        print(
            "usage: python -m unilog.chaos {produce|streamer|consume|spark} ... (the runner is `unilog chaos`)",
            file=sys.stderr,
        )
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
