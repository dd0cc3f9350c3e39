"""What producers attempted and how it ended: the history a chaos run is judged against."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUTCOMES = ("committed", "rolled_back", "unknown")


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
