"""A small process supervisor for a unilog fleet: the demo and chaos runs start every process through it.

Each process runs as a child with its stdout/stderr captured line by line into a log file; JSON log lines are
parsed so the supervisor can count what happened (faults injected, errors) without any side channel. A process
that exits on its own while the fleet runs is restarted, as a process manager in production would.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import structlog

log = structlog.get_logger(__name__)


@dataclass
class ProcessSpec:
    """How to run one fleet process."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    restart: bool = True


@dataclass
class Child:
    """A running (or exited) fleet process and what its logs said."""

    spec: ProcessSpec
    popen: subprocess.Popen[bytes]
    reader: threading.Thread
    started: float = field(default_factory=time.monotonic)


class Fleet:
    """Starts, watches, signals and restarts named child processes. Thread-safe."""

    def __init__(self, log_dir: Path, *, cwd: Path | None = None, base_env: Mapping[str, str] | None = None) -> None:
        self.log_dir = log_dir
        self.cwd = cwd
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.children: dict[str, Child] = {}
        self.events: Counter[str] = Counter()  # "fault:<point>", "error", "restart:<name>", "exit:<name>"
        self._lock = threading.Lock()
        self._watching = threading.Event()
        self._watcher: threading.Thread | None = None
        log_dir.mkdir(parents=True, exist_ok=True)

    # -- lifecycle ---------------------------------------------------------------------------------------------------

    def start(self, spec: ProcessSpec) -> Child:
        """Start ``spec`` (replacing an exited child of the same name)."""
        env = {**self.base_env, **spec.env, "PYTHONUNBUFFERED": "1"}
        popen = subprocess.Popen(
            list(spec.argv),
            cwd=self.cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # signals to the fleet's terminal don't reach children; we stop them in order
        )
        assert popen.stdout is not None
        reader = threading.Thread(target=self._read, args=(spec.name, popen.stdout), daemon=True)
        reader.start()
        child = Child(spec, popen, reader)
        with self._lock:
            self.children[spec.name] = child
        log.debug("process started", process=spec.name, pid=popen.pid)
        return child

    def watch(self, interval: float = 0.5) -> None:
        """Restart processes that exit on their own, until :meth:`stop_all` (runs in a background thread)."""
        self._watching.set()

        def loop() -> None:
            while self._watching.is_set():
                for name, child in list(self.children.items()):
                    code = child.popen.poll()
                    if code is not None and child.spec.restart and self._watching.is_set():
                        with self._lock:
                            self.events[f"restart:{name}"] += 1
                        log.warning("process exited; restarting", process=name, code=code)
                        self.start(child.spec)
                time.sleep(interval)

        self._watcher = threading.Thread(target=loop, daemon=True)
        self._watcher.start()

    def signal(self, name: str, signum: int) -> None:
        """Send ``signum`` to process ``name`` if it is running."""
        child = self.children.get(name)
        if child is not None and child.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.popen.pid, signum)

    def kill(self, name: str) -> None:
        """SIGKILL process ``name`` (the watcher restarts it if its spec says so)."""
        self.signal(name, signal.SIGKILL)

    def stop(self, name: str, timeout: float = 20.0) -> int | None:
        """SIGTERM process ``name``, wait for it (SIGKILL after ``timeout``), and return its exit code."""
        child = self.children.get(name)
        if child is None:
            return None
        child.spec.restart = False
        self.signal(name, signal.SIGTERM)
        try:
            code = child.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(name)
            code = child.popen.wait(5)
        child.reader.join(5)
        return code

    def stop_all(self, order: Sequence[str] | None = None, timeout: float = 20.0) -> dict[str, int | None]:
        """Stop every process (in ``order`` first, then the rest); return their exit codes."""
        self._watching.clear()
        if self._watcher is not None:
            self._watcher.join(5)
        names = [*(order or []), *(n for n in self.children if n not in (order or []))]
        return {name: self.stop(name, timeout) for name in names}

    def running(self, name: str) -> bool:
        child = self.children.get(name)
        return child is not None and child.popen.poll() is None

    # -- logs --------------------------------------------------------------------------------------------------------

    def _read(self, name: str, stream: IO[bytes]) -> None:
        with open(self.log_dir / f"{name}.log", "ab") as sink:
            for raw in stream:
                sink.write(raw)
                sink.flush()
                self._observe(raw)

    def _observe(self, raw: bytes) -> None:
        if not raw.startswith(b"{"):
            return
        try:
            event: dict[str, Any] = json.loads(raw)
        except ValueError:
            return
        key = None
        if event.get("event") == "fault injected":
            key = f"fault:{event.get('point')}"
        elif event.get("level") in ("error", "critical"):
            key = "error"
        if key is not None:
            with self._lock:
                self.events[key] += 1

    def faults(self) -> dict[str, int]:
        """Faults injected so far, by point (from the processes' own logs)."""
        return {k.removeprefix("fault:"): v for k, v in self.events.items() if k.startswith("fault:")}
