"""Observing a running fleet (progress towards quiet) and collecting what the checker judges, through the
library's public API."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unilog.config import Settings
from unilog.ops.admin import dead_letters
from unilog.ops.dlq import DeadLetter
from unilog.ops.status import collect_status

from ..app import App
from . import tables
from .checker import Verdict, check
from .history import read_history
from .tracking import cid_of


@dataclass
class Progress:
    """How far the system is from quiet: staged records, lag per consumer, pending entries per group."""

    staged: int
    stream_length: int
    lag: dict[str, int]
    pending: dict[str, int]
    dead_letters: int
    rows: int = 0  # rows in the application's source table

    @property
    def quiet(self) -> bool:
        return self.staged == 0 and not any(self.lag.values()) and not any(self.pending.values())


def progress(app: App, database_url: str, redis_url: str, *, consumers: Sequence[str] | None = None) -> Progress:
    """Read :class:`Progress` from the servers, through ``unilog status``'s report (a consumer without a checkpoint
    yet, or a group not yet created, lags by the whole stream)."""
    report = collect_status(Settings.from_dsn(database_url, redis_url, app.stream))
    stream = next((s for s in report["streams"] if s["name"] == app.stream), None)
    length = stream["length"] if stream else 0
    checkpoints = {c["name"]: c for c in report["consumers"]}
    lag = {
        name: checkpoints[name]["lag_entries"] if name in checkpoints else length for name in consumers or app.consumers
    }
    groups = {g["name"]: g for g in (stream["groups"] if stream else [])}
    pending = {}
    for group in (app.group,):
        info = groups.get(group)
        lag[group] = info["lag_entries"] if info else length
        pending[group] = info["pending"] if info else 0
    with tables.connect(database_url, autocommit=True) as conn:
        rows = tables.source_rows(conn, app)
    dead = stream["dead_letters"] if stream else 0
    return Progress(report["staged"]["records"], length, lag, pending, dead, rows)


@dataclass
class Observation:
    """Everything :func:`~unilog.harness.chaos.checker.check` needs, as read from a fleet's servers and history by
    :func:`collect`."""

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


def _events(history: Iterable[Path | str] | Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    items = list(history)
    if items and isinstance(items[0], dict):
        return [e for e in items if isinstance(e, dict)]
    return read_history([Path(p) for p in items if not isinstance(p, dict)])


def collect(
    app: App,
    database_url: str,
    redis_url: str,
    history: Iterable[Path | str] | Sequence[dict[str, Any]],
    *,
    consumers: Sequence[str] | None = None,
    compare_states: bool = True,
) -> Observation:
    """Read a chaos run's data: the history (JSON-lines files or a directory of them, or events), ``chaos_applied``,
    the canonical ids (the app's source table and ``chaos_produced``), the dead letters of the app's stream, what is
    still staged, pending and unread, and, with ``compare_states``, the consumers' states and the canonical one."""
    consumers = list(consumers or app.consumers)
    now = progress(app, database_url, redis_url, consumers=consumers)
    names = [*consumers, app.group]
    with tables.connect(database_url, autocommit=True) as conn:
        applied = tables.applied(conn, names)
        canonical, poison = tables.canonical(conn, app), tables.poison(conn)
        states = canonical_state = None
        if compare_states:
            totals = app.consumer_totals(conn)
            states = {name: totals.get(name) for name in names}
            canonical_state = app.canonical_totals(conn)
    letters: dict[str, list[str]] = {app.group: []}
    for letter in dead_letters(Settings.from_dsn(database_url, redis_url, app.stream), app.stream):
        letters.setdefault(letter.group, []).append(letter_cid(letter))
    return Observation(
        history=_events(history),
        applied=applied,
        canonical=canonical,
        poison=poison,
        dead_letters=letters,
        groups=[app.group],
        staged_count=now.staged,
        pending=now.pending,
        lag=now.lag,
        states=states,
        canonical_state=canonical_state,
    )


def letter_cid(letter: DeadLetter) -> str:
    """The chaos id of a dead letter's record."""
    fields = letter.fields
    data = json.loads(fields["data"]) if fields.get("data") else None
    seq = fields.get("seq")
    position = (int(fields.get("epoch", "0")), int(seq)) if seq is not None else None
    return cid_of(fields.get("object"), data, fields.get("producer", ""), position, letter.original_id)
