"""``memory``: peak RSS of the ``unilog`` command's streamer and consumer processes while a backlog flows through.

Each process is the real command (``python -m unilog streamer --once`` / ``python -m unilog consume
bench.handlers:count_records --once``, logs at info to /dev/null), started through :mod:`bench.rss`, which writes
the process's own ``VmHWM`` (the kernel's peak-RSS high-water mark) from an ``atexit`` hook, and ``VmHWM`` is also
polled from ``/proc/<pid>/status`` every 50 ms until the process is gone (it sees interpreter teardown, which runs
after ``atexit``); the peak is the larger of the two. The ``idle`` cases run the same commands with nothing to do:
the interpreter-and-imports floor.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .core import Measurement, Profile, Results, log
from .env import BenchEnv, Urls

ROOT = Path(__file__).resolve().parent.parent
MB = 1024 * 1024


def _vm_hwm_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _run_measured(args: list[str]) -> dict[str, float]:
    """Run ``python -m unilog ARGS``; return its peak RSS (MB, two ways), wall time and exit code."""
    with tempfile.NamedTemporaryFile(prefix="bench-rss-") as peak_file:
        metrics = _run_process(args, peak_file.name)
        text = Path(peak_file.name).read_text().strip()
    at_exit = int(text) * 1024 / MB if text else 0.0
    # interpreter teardown runs after atexit hooks and may allocate more: the poller can see a later, higher mark
    return {"peak RSS MB": max(at_exit, metrics["polled VmHWM MB"]), "at-exit VmHWM MB": at_exit, **metrics}


def _run_process(args: list[str], peak_file: str) -> dict[str, float]:
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.rss", "unilog", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "UNILOG_LOG_LEVEL": "info", "BENCH_RSS_FILE": peak_file},
    )
    polled = [0]
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            polled[0] = max(polled[0], _vm_hwm_kb(proc.pid))
            done.wait(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    _, stderr = proc.communicate()
    done.set()
    poller.join()
    if proc.returncode:
        log(f"  WARNING memory: unilog {args[0]} exited {proc.returncode}: {stderr.decode(errors='replace')[-500:]}")
    return {
        "polled VmHWM MB": polled[0] * 1024 / MB,
        "seconds": time.perf_counter() - started,
        "exit": float(proc.returncode),
    }


def _connection(urls: Urls) -> list[str]:
    return ["--database-url", urls.database, "--redis-url", urls.redis, "--default-stream", urls.stream]


def streamer_args(urls: Urls) -> list[str]:
    return ["streamer", "--once", *_connection(urls)]


def consumer_args(urls: Urls) -> list[str]:
    return ["consume", "bench.handlers:count_records", "--name", "bench-memory", "--once", *_connection(urls)]


def _add(results: Results, case: str, variant: str, metrics: dict[str, float], notes: dict[str, Any]) -> None:
    results.add(Measurement("memory", case, variant, 0, metrics, notes))


def run_memory(env: BenchEnv, profile: Profile, results: Results) -> None:
    size = profile.memory_size
    log(f"memory: streamer and consumer processes, idle and through {size:,} records")
    env.reset()
    _add(results, "idle", "streamer", _run_measured(streamer_args(env.urls)), {})
    _add(results, "idle", "consumer", _run_measured(consumer_args(env.urls)), {})
    env.reset()
    env.stage(size)
    metrics = _run_measured(streamer_args(env.urls))
    metrics["records/s"] = size / metrics["seconds"]
    _add(results, f"{size:,} records", "streamer", metrics, {"staged_after": env.staged()})
    metrics = _run_measured(consumer_args(env.urls))
    metrics["records/s"] = size / metrics["seconds"]
    _add(results, f"{size:,} records", "consumer", metrics, {"xlen": env.xlen(env.urls.stream)})
