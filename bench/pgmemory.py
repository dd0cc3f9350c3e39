"""Postgres's own memory while a workload runs: the summed RSS and PSS of the server's processes, read from ``/proc``.

The server's processes are the postmaster and every process it forked (backends, the checkpointer, the WAL writer,
autovacuum workers...), found again at each sample: backends come and go. Summed RSS counts a page of shared memory
(``shared_buffers``) once per process that touched it, so it overstates the footprint; PSS (``Pss:`` of
``/proc/<pid>/smaps_rollup``) splits each shared page between the processes that map it, so summed PSS is what
the server holds. Sampled every :data:`INTERVAL` seconds in a thread; the figures are the peaks and the value at
the start. Only a server on this machine whose postmaster pid is known (the bench's embedded Postgres) can be
read; a server given by URL is "not measured".
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

INTERVAL = 0.25  # seconds between samples
MB = 1024 * 1024


def server_pids(postmaster: int) -> list[int]:
    """The postmaster and its children (a /proc scan)."""
    pids = [postmaster]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                if int((entry / "stat").read_text().rpartition(")")[2].split()[1]) == postmaster:
                    pids.append(int(entry.name))
    return pids


def _kb(path: Path, field: str) -> int:
    """The ``field:`` line's kB of a /proc file (0 when the process is gone)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in path.read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def sample(postmaster: int) -> tuple[float, float, int]:
    """(summed RSS MB, summed PSS MB, number of processes) of the server now."""
    pids = server_pids(postmaster)
    rss = sum(_kb(Path(f"/proc/{pid}/status"), "VmRSS:") for pid in pids)
    pss = sum(_kb(Path(f"/proc/{pid}/smaps_rollup"), "Pss:") for pid in pids)
    return rss * 1024 / MB, pss * 1024 / MB, len(pids)


class PostgresMemory:
    """``with PostgresMemory(pid):`` samples the server's memory until the block ends; ``postmaster`` None (a server
    given by URL, not on this machine) measures nothing and says so in :meth:`note`."""

    def __init__(self, postmaster: int | None, interval: float = INTERVAL) -> None:
        self.postmaster, self.interval = postmaster, interval
        self.start: tuple[float, float, int] | None = None
        self.peak_rss = self.peak_pss = 0.0
        self.peak_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="pg-memory")

    def _take(self) -> None:
        assert self.postmaster is not None
        rss, pss, processes = sample(self.postmaster)
        if self.start is None:
            self.start = (rss, pss, processes)
        self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
        self.peak_processes = max(self.peak_processes, processes)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._take()

    def __enter__(self) -> PostgresMemory:
        if self.postmaster is not None:
            self._take()
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.postmaster is not None:
            self._stop.set()
            self._thread.join(10)
            self._take()

    def metrics(self) -> dict[str, float]:
        """The peaks and the start, in MB; empty when not measured."""
        if self.start is None:
            return {}
        return {
            "Postgres peak PSS MB": self.peak_pss,
            "Postgres start PSS MB": self.start[1],
            "Postgres peak RSS MB": self.peak_rss,
            "Postgres peak processes": float(self.peak_processes),
        }

    def note(self) -> str:
        if self.start is None:
            return "not measured (the server is not a local process whose pid is known)"
        return (
            f"summed over the postmaster and its children, sampled every {self.interval:g} s; RSS counts shared "
            "buffers once per process, PSS splits them"
        )
