"""The checker: a pure function over plain data that judges a run (lost, unexpected, applied twice, ...)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .history import HistorySummary, summarize_history


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
    "mirror_mismatch": "the backfill step's mirror differs from its table (a row missing or at another value)",
    "backfill_not_done": "the backfill step's backfill did not finish",
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
    poison = set(poison_ids) | h.poison
    violations: list[Violation] = []
    counts = _history_counts(h, poison)
    for cid, n in sorted(h.duplicate_commits.items()):
        violations.append(Violation("duplicate_cid", f"{cid} was committed by {n} attempts", cids=(cid,)))
    expected, allowed = _expectations(h, canonical, violations, counts)
    letters, group_names = _letters(dead_letter_ids, groups)
    counts["applied"] = _judge_applied(
        h, applied_by_consumer, expected, allowed, poison, group_names, canonical is not None, violations
    )
    _judge_dead_letters(letters, group_names, poison, expected, allowed, violations, counts)
    _judge_states(states, canonical_state, violations)
    _judge_leftovers(staged_count, pending, lag, violations)
    return Verdict(violations, counts)


def _history_counts(h: HistorySummary, poison: set[str]) -> dict[str, Any]:
    return {
        "attempts": h.attempts,
        "records": len(h.outcome),
        "committed": len(h.ids("committed")),
        "rolled_back": len(h.ids("rolled_back")),
        "unknown": len(h.ids("unknown")),
        "unknown_anonymous": sum(h.anonymous_unknown.values()),
        "poison": len(poison),
        "by_source": {s: dict(c) for s, c in sorted(h.by_source.items())},
    }


def _expectations(
    h: HistorySummary, canonical: Collection[str] | None, violations: list[Violation], counts: dict[str, Any]
) -> tuple[set[str], set[str]]:
    """(the records every consumer must apply, the records it may apply): the canonical set when the database says
    which committed, else the committed ones, with unknown outcomes allowed."""
    committed, rolled_back, unknown = h.ids("committed"), h.ids("rolled_back"), h.ids("unknown")
    if canonical is None:
        return committed, committed | unknown
    canon = set(canonical)
    absorbed, never = _absorb(canon - h.outcome.keys(), h.anonymous_unknown)
    _add(violations, "not_durable", sorted(committed - canon), "acknowledged commits missing from the database")
    _add(violations, "rolled_back_committed", sorted(rolled_back & canon), "rolled back, yet in the database")
    _add(violations, "never_attempted", sorted(never), "in the database, but no producer attempted them")
    counts.update(
        canonical=len(canon),
        unknown_committed=len(unknown & canon) + len(absorbed),
        unknown_not_committed=len(unknown - canon) + sum(h.anonymous_unknown.values()) - len(absorbed),
    )
    return canon, canon


def _letters(
    dead_letter_ids: Mapping[str, Iterable[str]] | Iterable[str], groups: Collection[str]
) -> tuple[dict[str, Counter[str]], set[str]]:
    group_names = set(groups)
    if isinstance(dead_letter_ids, Mapping):
        letters = {g: Counter(str(c) for c in ids) for g, ids in dead_letter_ids.items()}
        return letters, group_names | set(letters)
    return {"": Counter(str(c) for c in dead_letter_ids)}, group_names


def _judge_applied(
    h: HistorySummary,
    applied_by_consumer: Mapping[str, Iterable[str]],
    expected: set[str],
    allowed: set[str],
    poison: set[str],
    group_names: set[str],
    with_canonical: bool,
    violations: list[Violation],
) -> dict[str, dict[str, int]]:
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
        for reason, cids in _classify(seen.keys() - ok, h, poison, is_group, with_canonical).items():
            _add(violations, "unexpected", sorted(cids), f"applied but {reason}", consumer)
    return applied_counts


def _judge_dead_letters(
    letters: dict[str, Counter[str]],
    group_names: set[str],
    poison: set[str],
    expected: set[str],
    allowed: set[str],
    violations: list[Violation],
    counts: dict[str, Any],
) -> None:
    good_poison = poison & allowed
    for group, found in sorted(letters.items()):
        _add(violations, "dead_letter_unexpected", sorted(found.keys() - good_poison), "dead-lettered", group or None)
    for group in sorted(group_names):
        found = letters.get(group, letters.get("", Counter()))
        missing = (poison & expected) - found.keys()
        _add(violations, "poison_not_dead_lettered", sorted(missing), "poison records not in the dead letters", group)
    counts["dead_letters"] = sum(sum(found.values()) for found in letters.values())
    counts["poison_committed"] = len(poison & expected)
    counts["dead_letter_copies"] = sum(n - 1 for found in letters.values() for n in found.values() if n > 1)


def _judge_states(states: Mapping[str, Any] | None, canonical_state: Any, violations: list[Violation]) -> None:
    for consumer, state in sorted((states or {}).items()):
        if state != canonical_state:
            message = f"{consumer}'s state {_show(state)} differs from the canonical {_show(canonical_state)}"
            violations.append(Violation("state_mismatch", message, consumer))


def _judge_leftovers(
    staged_count: int, pending: Mapping[str, int] | int, lag: Mapping[str, int] | None, violations: list[Violation]
) -> None:
    if staged_count:
        violations.append(Violation("staged_not_empty", f"{staged_count} records still in staged_log_records"))
    pending_map = pending if isinstance(pending, Mapping) else {"": pending}
    for group, n in sorted(pending_map.items()):
        if n:
            who = f"{group}: " if group else ""
            violations.append(Violation("pending_entries", f"{who}{n} entries still pending", group or None))
    for consumer, n in sorted((lag or {}).items()):
        if n:
            violations.append(
                Violation("not_caught_up", f"{consumer}: {n} entries behind the end of the stream", consumer)
            )


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
