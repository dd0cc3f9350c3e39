"""``commits``: memory per commit, not per record: the real processes of a fleet with a standby streamer, through a
stream of single-record transactions.

Issue 24: a publishing streamer beside a standby kept one notification per producer's commit (about 175 bytes),
which the ``memory`` workload (one large backlog, drained in big batches) never shows. Here ``unilog streamer``
(the publisher: it takes the stream's lock first), a second ``unilog streamer`` (the standby) and ``unilog consume``
run as long-lived processes while producer threads commit ``commits_size`` transactions of one ``emit`` each
(``synchronous_commit = off`` for the producers only: the workload is about the fleet's memory, not fsync). Every
process's RSS (``VmRSS``) is sampled every 0.25 s against the number of commits so far; the figure is the growth
per commit, the least-squares slope over the samples after the first 10 % of commits (warm-up: imports, caches,
the allocator's first arenas), with the RSS at that point and at the end. A bound leak shows as a slope near 0;
the leak fixed by issue 24 was about 175 bytes per commit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from unilog import emit

from .core import Measurement, Profile, Results, log
from .env import BenchEnv, Urls
from .memory import ROOT

PRODUCERS = 4
SAMPLE_EVERY = 0.25


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _start(urls: Urls, *args: str) -> subprocess.Popen[bytes]:
    connection = ["--database-url", urls.database, "--redis-url", urls.redis, "--default-stream", urls.stream]
    return subprocess.Popen(
        [sys.executable, "-m", "unilog", *args, *connection],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "UNILOG_LOG_LEVEL": "warning"},
    )


def _wait(what: str, done: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"commits: timed out waiting for {what}")
        time.sleep(0.05)


def _produce(urls: Urls, total: int, counter: list[int], lock: threading.Lock) -> None:
    with psycopg.connect(urls.database) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.commit()
        while True:
            with lock:
                if counter[0] >= total:
                    return
                counter[0] += 1
                i = counter[0]
            emit(conn, action="create", object="ride", data={"id": i, "distance": 1.5})
            conn.commit()


def _caught_up(env: BenchEnv) -> bool:
    """Nothing staged, and the consumer's checkpoint at the stream's last entry (retention trims what it read, so
    the stream's length says nothing)."""
    if env.staged():
        return False
    last = env.rds.xinfo_stream(env.urls.stream)["last-generated-id"]
    row = env.admin.execute("SELECT last_id FROM unilog_checkpoints WHERE name = 'bench-commits'").fetchone()
    return row is not None and row[0] == (last.decode() if isinstance(last, bytes) else last)


def slope(points: list[tuple[int, int]]) -> float:
    """Least-squares slope of (commits, RSS kB), in bytes per commit."""
    n = len(points)
    if n < 2:
        return float("nan")
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    return sxy / sxx * 1024 if sxx else float("nan")


def _sample(procs: dict[str, subprocess.Popen[bytes]], counter: list[int], stop: threading.Event) -> dict[str, Any]:
    series: dict[str, list[tuple[int, int]]] = {name: [] for name in procs}
    while not stop.is_set():
        done = counter[0]
        for name, proc in procs.items():
            series[name].append((done, _rss_kb(proc.pid)))
        stop.wait(SAMPLE_EVERY)
    return series


def commits_trial(env: BenchEnv, total: int) -> dict[str, dict[str, float]]:
    """One run: publisher, standby and consumer through ``total`` single-record commits; per process, its RSS
    growth per commit and RSS after warm-up and at the end."""
    urls = env.urls
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        procs["publisher"] = _start(urls, "streamer", "--name", "publisher")
        with psycopg.connect(urls.database) as conn:
            emit(conn, action="create", object="ride", data={"id": 0})
        _wait("the publisher", lambda: env.xlen(urls.stream) >= 1, 60)  # it holds the stream's lock now
        procs["standby"] = _start(urls, "streamer", "--name", "standby")
        procs["consumer"] = _start(urls, "consume", "bench.handlers:count_records", "--name", "bench-commits")
        time.sleep(3.0)  # both up and settled: the standby found the stream held, the consumer registered
        counter, lock, stop = [0], threading.Lock(), threading.Event()
        sampled: dict[str, Any] = {}
        sampler = threading.Thread(target=lambda: sampled.update(_sample(procs, counter, stop)), daemon=True)
        sampler.start()
        started = time.perf_counter()
        producers = [
            threading.Thread(target=_produce, args=(urls, total, counter, lock), daemon=True) for _ in range(PRODUCERS)
        ]
        for t in producers:
            t.start()
        for t in producers:
            t.join()
        seconds = time.perf_counter() - started
        _wait("the publisher and the consumer to catch up", lambda: _caught_up(env), 120)
        time.sleep(1.0)
        stop.set()
        sampler.join(5)
        dead = [name for name, p in procs.items() if p.poll() is not None]
        if dead:
            raise RuntimeError(f"commits: {', '.join(dead)} exited")
        return {name: _figures(series, total, seconds) for name, series in sampled.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _figures(series: list[tuple[int, int]], total: int, seconds: float) -> dict[str, float]:
    warm = [(x, y) for x, y in series if x >= total // 10]
    return {
        "RSS growth bytes/commit": slope(warm),
        "RSS after warm-up MB": warm[0][1] / 1024 if warm else float("nan"),
        "RSS at end MB": series[-1][1] / 1024 if series else float("nan"),
        "commits/s": total / seconds,
    }


def run_commits(env: BenchEnv, profile: Profile, results: Results) -> None:
    total = profile.commits_size
    log(f"commits: publisher, standby streamer and consumer through {total:,} single-record commits")
    env.reset()
    for name, metrics in commits_trial(env, total).items():
        results.add(Measurement("commits", f"{total:,} commits", name, 0, metrics, {}))
