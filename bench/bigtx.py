"""``bigtx``: one transaction of ``profile.bigtx_size`` records goes out without the streamer's memory growing with it.

Each trial starts from empty tables and Redis, stages its records in one statement (one transaction, then VACUUM
ANALYZE and CHECKPOINT), and runs the real ``python -m unilog streamer --once`` as a measured process (peak RSS as in
:mod:`bench.memory`: the process's own ``VmHWM`` at exit and polled every 50 ms), in table mode and in WAL mode
(``unilog capture wal`` before staging, as the drain workload's ``unilog-wal`` variant; table mode again after). The
same command over a small transaction of :data:`SMALL` records, in the same run, is the baseline: the target is the
big transaction's peak RSS over the small one's, per mode. ``records/s`` is over the process's wall time (interpreter
start-up and connecting included, about half a second: it understates the small trials' rate).
"""

from __future__ import annotations

from typing import Any

from unilog.stream.modes import disable_wal, enable_wal

from .core import Measurement, Profile, Results, log
from .env import BenchEnv
from .memory import _run_measured, streamer_args

SMALL = 10_000  # the baseline transaction
MODES = ("table", "wal")


def bigtx_case(size: int) -> str:
    return f"{size:,} records in one transaction"


def bigtx_trial(env: BenchEnv, mode: str, size: int) -> tuple[dict[str, float], dict[str, Any]]:
    env.reset()
    if mode == "wal":
        enable_wal(env.urls.settings())
    try:
        env.stage(size, per_transaction=size)  # one transaction
        metrics = _run_measured(streamer_args(env.urls))
    finally:
        if mode == "wal":
            disable_wal(env.urls.settings())
    metrics["records/s"] = size / metrics["seconds"]
    notes: dict[str, Any] = {"staged_after": env.staged(), "xlen": env.xlen(env.urls.stream)}
    notes["ok"] = metrics["exit"] == 0 and notes["staged_after"] == 0 and notes["xlen"] == size
    if not notes["ok"]:
        log(f"  WARNING bigtx {mode}: expected {size:,} published, exit 0; got {notes}, exit {metrics['exit']:.0f}")
    return metrics, notes


def run_bigtx(env: BenchEnv, profile: Profile, results: Results) -> None:
    big = profile.bigtx_size
    log(
        f"bigtx: the streamer process's peak RSS through one transaction of {SMALL:,} and of {big:,} records, "
        f"{', '.join(MODES)} mode"
    )
    for mode in MODES:
        for size in (SMALL, big):
            metrics, notes = bigtx_trial(env, mode, size)
            results.add(Measurement("bigtx", bigtx_case(size), mode, 0, metrics, notes))
