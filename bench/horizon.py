"""``horizon``: commit-to-handler latency beside an idle-in-transaction session, in table mode and in WAL capture
mode (issues 18 and 33).

The latency workload's pipeline (a producer at a steady rate, ``Streamer.run``, ``Consumer.run``), with a session
that takes a transaction id and sits idle in transaction for ``HOLD`` seconds from the moment the producer starts
(a forgotten ``BEGIN``, a slow job). Until issue 33 table mode read only below the visibility horizon, so every
record committed meanwhile waited for that session to end (p99 about the hold); now table mode claims every
committed row and, as in WAL mode (``unilog capture wal`` before the trial), only the idle session's own records
(none here) would wait. ``no idle`` variants are the same pipelines without it.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from unilog.stream.modes import disable_wal, enable_wal

from .core import Profile, Results, interleaved, log
from .env import BenchEnv
from .latency import latency_trial

HOLD = 2.0  # seconds the idle-in-transaction session stays open
RATE = 500
VARIANTS = ("table, no idle", "table, idle 2s", "wal, no idle", "wal, idle 2s")


def horizon_trial(
    env: BenchEnv, variant: str, seconds: float, rate: int = RATE, **trial: Any
) -> tuple[dict[str, float], dict[str, Any]]:
    """A latency trial in the variant's mode (``table...`` or ``wal...``), with the idle session if the variant ends
    with ``idle 2s``; ``trial`` goes to :func:`bench.latency.latency_trial`."""
    settings = env.urls.settings()
    wal = variant.startswith("wal")
    holders: list[psycopg.Connection[Any]] = []

    def hold() -> None:
        conn = psycopg.connect(env.urls.database, application_name="bench-idle-in-transaction")
        conn.execute("SELECT pg_current_xact_id()")  # takes an xid: holds the horizon until it ends
        holders.append(conn)
        threading.Timer(HOLD, conn.rollback).start()

    if wal:
        enable_wal(settings)
    try:
        idle = variant.endswith("idle 2s")  # not "no idle": that variant held the session too until 2026-11-25
        return latency_trial(env, "unilog", rate, seconds, before_producer=hold if idle else None, **trial)
    finally:
        for conn in holders:
            conn.close()
        if wal:
            disable_wal(settings)


def run_horizon(env: BenchEnv, profile: Profile, results: Results) -> None:
    seconds = max(3.0, profile.latency_seconds / 3)  # past HOLD: the producer runs on after the idle session ends
    variants = VARIANTS if profile.side_variants else tuple(v for v in VARIANTS if v.startswith("wal"))
    log(f"horizon: {RATE}/s for {seconds:g} s, an idle transaction held {HOLD:g} s, {', '.join(variants)}")
    interleaved(
        results,
        "horizon",
        f"{RATE}/s x {seconds:g}s",
        variants,
        profile.latency_reps,
        lambda v: horizon_trial(env, v, seconds),
    )
