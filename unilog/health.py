"""Liveness and readiness of this process, for a container orchestrator and the compose file's health checks.

Every worker loop (:func:`unilog.runtime.serve`, both faces, through :class:`unilog.runtime.hooks.HealthHook`)
reports each turn here: ``/healthz`` answers 200 while every loop of the process turned within ``max_silence``
seconds (a loop stuck in a handler, a hung call or a dead thread stops turning), else 503 naming the silent loop.
``/readyz`` answers 200 while every loop's last pass reached its servers: a pass that failed to reach Postgres or
Redis makes it 503 with the error until a pass succeeds again. A standby streamer waiting for the stream's lock, or
an idle consumer, is ready: that is what it should be doing. Both are served beside ``/metrics`` on the process's
``--metrics-port`` (:func:`unilog.metrics.serve`). A process with no loop (``unilog metrics``, the exporter; ``unilog
dashboard``) is alive while it serves, and ready unless its last read of the servers failed (:meth:`Health.unready`);
a step outside a loop that waits for a server (a consumer placing its new group at start) is unready meanwhile too.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

MAX_SILENCE = 60.0  # seconds a loop may go without turning before /healthz fails; a handler's batch counts as a turn


@dataclass
class _Loop:
    turned: float
    ready: bool = True
    reason: str = ""


class Health:
    """The loops of this process and what they last reported. Thread-safe."""

    def __init__(self, max_silence: float = MAX_SILENCE) -> None:
        self.max_silence = max_silence
        self._loops: dict[str, _Loop] = {}
        self._unready: dict[str, str] = {}  # what is not a loop but cannot reach a server now, with why
        self._starting: str | None = None  # set by starting(): not ready until something reaches its servers
        self._lock = threading.Lock()

    def starting(self, reason: str = "starting: has not reached its servers yet") -> None:
        """This process serves ``/readyz`` before any of its steps has tried a server: it is not ready until a loop's
        pass reaches its servers (:meth:`turned`) or a step does (:meth:`reached`), so a probe that comes first does
        not see ready a process that has not connected yet."""
        with self._lock:
            self._starting = reason

    def turned(self, name: str, *, ready: bool = True, reason: str = "") -> None:
        """Loop ``name`` finished a pass (``ready``: it reached its servers; else ``reason`` says what failed)."""
        with self._lock:
            self._loops[name] = _Loop(time.monotonic(), ready, reason)
            if ready:
                self._starting = None

    def stopped(self, name: str) -> None:
        """Loop ``name`` ended on purpose (a stop event): it no longer counts."""
        with self._lock:
            self._loops.pop(name, None)

    def unready(self, name: str, reason: str) -> None:
        """``name``, not a loop (the exporter's scrape, a step at start), cannot reach a server: ``/readyz`` fails
        with ``reason`` until :meth:`reached`; ``/healthz`` is not affected."""
        with self._lock:
            self._unready[name] = reason

    def reached(self, name: str) -> None:
        """``name`` reached its servers again (or never failed): it no longer holds ``/readyz`` back."""
        with self._lock:
            self._unready.pop(name, None)
            self._starting = None

    def names(self) -> list[str]:
        """The loops that report here now."""
        with self._lock:
            return sorted(self._loops)

    def alive(self) -> tuple[bool, dict[str, str]]:
        """(every loop turned within ``max_silence``, the silent loops with how long they have been silent)."""
        now = time.monotonic()
        with self._lock:
            silent = {n: f"silent {now - loop.turned:.0f}s" for n, loop in self._loops.items()}
            silent = {n: s for n, s in silent.items() if now - self._loops[n].turned > self.max_silence}
        return not silent, silent

    def ready(self) -> tuple[bool, dict[str, str]]:
        """(every loop's last pass reached its servers, the loops that did not with why)."""
        with self._lock:
            failing = {n: loop.reason for n, loop in self._loops.items() if not loop.ready} | self._unready
            if self._starting is not None:
                failing["process"] = self._starting
        return not failing, failing


HEALTH = Health()


def respond(path: str) -> tuple[int, bytes] | None:
    """The status and JSON body for ``/healthz`` and ``/readyz``; None for any other path."""
    checks = {"/healthz": HEALTH.alive, "/readyz": HEALTH.ready}
    check = checks.get(path.rstrip("/") or path)
    if check is None:
        return None
    ok, problems = check()
    body = json.dumps({"status": "ok" if ok else "failing", "loops": problems}).encode()
    return (200 if ok else 503), body


def probe(url: str, timeout: float = 4.0) -> int:
    """0 if ``url`` answers 200 within ``timeout`` seconds, else 1: a container health check's exit code.

    ``python -m unilog.health URL`` is the compose file's health check: one argument per word, with no spaces in
    any, because Podman's Docker-compatible API (4.3) splits a ``CMD`` test's arguments on spaces
    (``python -c "import sys, ..."`` arrives as ``import``), and the app image has no curl.
    """
    from urllib.error import URLError
    from urllib.request import urlopen

    try:
        with urlopen(url, timeout=timeout) as response:
            return 0 if response.status == 200 else 1
    except (URLError, OSError, ValueError):
        return 1


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 2:
        print("usage: python -m unilog.health URL (exit 0 if it answers 200)", file=sys.stderr)
        sys.exit(2)
    sys.exit(probe(sys.argv[1]))
