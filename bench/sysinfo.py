"""What the numbers were measured on: machine, load, fsync rate, server settings and software versions."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import unilog

from .env import BenchEnv

ROOT = Path(__file__).resolve().parent.parent


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def fsync_rate(directory: Path, seconds: float = 1.0) -> float:
    """8 KiB overwrite + ``fdatasync`` per round, for ``seconds``, in ``directory``: durable writes per second."""
    path = directory / "bench-fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        block, n = b"\0" * 8192, 0
        started = time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds:
            os.pwrite(fd, block, 0)
            os.fdatasync(fd)
            n += 1
        return n / elapsed
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def pg_test_fsync(env: BenchEnv) -> str:
    """``pg_test_fsync -s 1`` on the data directory's file system (about 15 s)."""
    exe = env.pg.binaries.exe("pg_test_fsync")
    target = env.pg.base_dir / "pg_test_fsync.out"
    try:
        out = subprocess.run([str(exe), "-s", "1", "-f", str(target)], capture_output=True, text=True, timeout=120)
        return out.stdout + out.stderr
    except (OSError, subprocess.SubprocessError) as exc:
        return f"pg_test_fsync failed: {exc}"
    finally:
        target.unlink(missing_ok=True)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _mem_total_gb() -> float:
    try:
        kb = int(Path("/proc/meminfo").read_text().split("\n", 1)[0].split()[1])
        return round(kb / 1024 / 1024, 1)
    except (OSError, ValueError, IndexError):
        return float("nan")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _git() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return "?"
    return head.stdout.strip() + (" (uncommitted changes)" if dirty.stdout.strip() else "")


def machine() -> dict[str, Any]:
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "mem_total_gb": _mem_total_gb(),
    }


def servers(env: BenchEnv) -> dict[str, Any]:
    pg = {name: env.postgres_setting(name) for name in PG_SETTINGS}
    info = env.rds.info("server")
    persistence = env.rds.config_get("append*")
    return {
        "postgres": {"version": env.postgres_setting("server_version"), "bin_dir": str(env.pg.binaries.bin_dir), **pg},
        "redis": {"version": info.get("redis_version"), "binary": str(env.redis.binary.path), **persistence},
    }


PG_SETTINGS = ("fsync", "synchronous_commit", "full_page_writes", "wal_sync_method", "shared_buffers", "max_wal_size")


def software() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "unilog": unilog.__version__,
        "unilog_git": _git(),
        "redis-py": _version("redis"),
        "hiredis": _version("hiredis"),
        "psycopg": _version("psycopg"),
        "psycopg-binary": _version("psycopg-binary"),
    }
