"""The process plumbing every throw-away server shares: ports, temp dirs, waiting, process state, and the
:class:`ServerProcess` base."""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

import structlog

from unilog.errors import ConfigurationError, UnilogError

log = structlog.get_logger(__name__)

PG_BIN_ENV = "UNILOG_PG_BIN"
PG_USER_ENV = "UNILOG_PG_USER"
REDIS_SERVER_ENV = "UNILOG_REDIS_SERVER"
DEFAULT_PG_USER = "unilog-pg"
SERVERS_DIR_ENV = "UNILOG_SERVERS_DIR"

PG_START_TIMEOUT = 30.0
PG_STOP_TIMEOUT = 30.0
REDIS_START_TIMEOUT = 20.0
REDIS_STOP_TIMEOUT = 10.0
KILL_WAIT_TIMEOUT = 10.0
POLL_INTERVAL = 0.02

_PG_EXECUTABLES = ("initdb", "pg_ctl", "postgres")
_PG_STOP_MODES = ("smart", "fast", "immediate")
# Linux sun_path is 108 bytes including the terminating NUL.
_UNIX_SOCKET_PATH_MAX = 107
# Auto-picked ports can be stolen between free_port() and the server's bind();
# retry a couple of times with a new port instead of failing the test run.
_PORT_RETRIES = 3
_ADDR_IN_USE = re.compile(r"address already in use", re.IGNORECASE)


class EmbeddedServerError(UnilogError, RuntimeError):
    """An embedded server could not be located, started or stopped (a command prints it as one line)."""


class ServerNotFound(EmbeddedServerError, ConfigurationError):
    """No usable server binary: none given, none on this machine, and the ``embedded`` extra not installed."""


# --------------------------------------------------------------------------- #
# Small OS helpers
# --------------------------------------------------------------------------- #


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free at the time of the call.

    The port is not reserved; the servers in this module retry with a new port
    if it gets taken before they bind (only when the port was auto-picked).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _proc_state(pid: int) -> str | None:
    """Return the one-letter kernel state of ``pid``, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return _fallback_state(pid)
    # comm (field 2) may contain spaces and parens; the state follows the last ')'.
    return raw.rpartition(")")[2].split()[0]


def _fallback_state(pid: int) -> str | None:
    """Best effort liveness check where /proc is unavailable."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return "S"
    return "S"


def _pid_alive(pid: int) -> bool:
    """True if ``pid`` is a running process (zombies count as dead).

    Zombies matter: a SIGKILLed postmaster is re-parented to PID 1, and inside
    containers PID 1 does not always reap, so ``kill(pid, 0)`` keeps succeeding.
    """
    return _proc_state(pid) not in (None, "Z", "X")


def _child_pids(parent: int) -> list[int]:
    """Return the pids whose parent is ``parent`` (Linux /proc scan)."""
    children: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
            if int(fields[1]) == parent:
                children.append(int(entry.name))
    return children


def _wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_INTERVAL)


def _wait_pids_gone(pids: list[int], timeout: float) -> bool:
    """Wait until none of ``pids`` is alive; return False on timeout."""
    return _wait_until(lambda: not any(_pid_alive(p) for p in pids), timeout)


def _log_tail(path: Path, lines: int = 40) -> str:
    """Return the last ``lines`` lines of a log file for error messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<log {path} unreadable: {exc}>"
    tail = text.splitlines()[-lines:]
    return "\n".join(tail) if tail else f"<log {path} is empty>"


def _read_from(path: Path, offset: int) -> str:
    """Text of ``path`` from byte ``offset`` on: the part this start wrote."""
    try:
        with path.open("rb") as file:
            file.seek(offset)
            return file.read().decode(errors="replace")
    except OSError as exc:
        return f"<log {path} unreadable: {exc}>"


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _new_temp_dir(prefix: str, *, durable: bool = False) -> Path:
    """Create a short-named temp dir (short because of the unix socket limit) under :func:`servers_root`
    (``durable``: never in RAM, for a server whose fsync is the point)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=servers_root(durable=durable)))


RAM_ROOT = "/dev/shm"
RAM_ROOT_MIN_FREE = 4 << 30


def servers_root(*, durable: bool = False) -> str | None:
    """Where throw-away servers keep their files: ``UNILOG_SERVERS_DIR`` when set; else a RAM-backed ``/dev/shm``
    with at least 4 GiB free (unless ``durable``); else ``/tmp`` (None: the platform's temp dir).

    RAM, because nothing here outlives its process and every server runs without fsync: on a disk, ``CREATE
    DATABASE`` from a template (once per test) took 170-550 ms, on tmpfs 25-40 ms (same machine, interleaved), and
    Redis's ``appendfsync always`` waited on the disk at every write. A small ``/dev/shm`` (a container's 64 MB) is
    left alone."""
    chosen = os.environ.get(SERVERS_DIR_ENV)
    if chosen:
        return chosen
    if not durable and ram_backed(RAM_ROOT, RAM_ROOT_MIN_FREE):
        return RAM_ROOT
    return "/tmp" if Path("/tmp").is_dir() else None


def ram_backed(path: str, min_free: int) -> bool:
    """True if ``path`` is a writable tmpfs mount point with at least ``min_free`` bytes available."""
    try:
        stats = os.statvfs(path)
        with open("/proc/mounts") as mounts:
            tmpfs = any(line.split()[1:3] == [path, "tmpfs"] for line in mounts)
    except OSError:
        return False
    return tmpfs and stats.f_bavail * stats.f_frsize >= min_free and os.access(path, os.W_OK)


# --------------------------------------------------------------------------- #
# Binary discovery
# --------------------------------------------------------------------------- #


class ServerProcess:
    """What a throw-away server shares, whatever it serves: its directory (a temp dir it owns, or the caller's), a
    loopback port (retried when another process took a free one first; kept across restarts), an idempotent
    :meth:`start` that registers an ``atexit`` stop, the context manager, and a lock around state changes.

    Subclasses set :attr:`kind` and :attr:`temp_prefix`, call :meth:`_init_process` first in ``__init__``, and
    implement :attr:`pid`, :meth:`_before_start`, :meth:`_start_once`, ``stop(..., cleanup=)`` and
    :meth:`_stop_at_exit`.
    """

    kind: ClassVar[str] = "server"
    temp_prefix: ClassVar[str] = "unilog-"

    def _init_process(self, base_dir: Path | None, port: int | None, version: str, *, durable: bool = False) -> None:
        self.version = version
        self._owns_base_dir = base_dir is None
        self.base_dir: Path = (
            _new_temp_dir(self.temp_prefix, durable=durable) if base_dir is None else Path(base_dir).absolute()
        )
        self._auto_port = port is None
        self.port: int = free_port() if port is None else port
        self._ever_started = False
        self._lock = threading.RLock()

    @property
    def pid(self) -> int | None:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError

    def _before_start(self) -> None:
        """Prepare files before a start (create the data directory, ...)."""

    def _start_once(self) -> None:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError

    def stop(self, *, cleanup: bool = False) -> None:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError

    def _stop_at_exit(self) -> None:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError

    def start(self) -> Self:
        """Start the server and wait until it serves. Idempotent. Raises :class:`EmbeddedServerError` with the log
        tail on failure or timeout."""
        with self._lock:
            if self.pid is not None:
                return self
            began = time.monotonic()
            self._before_start()
            self._start_with_port_retry()
            self._ever_started = True
            atexit.register(self._atexit_stop)
            seconds = round(time.monotonic() - began, 3)
            log.debug(f"{self.kind} started", port=self.port, version=self.version, seconds=seconds)
            return self

    def _start_with_port_retry(self) -> None:
        for attempt in range(_PORT_RETRIES):
            try:
                self._start_once()
                return
            except EmbeddedServerError as exc:
                # Once started, the port is part of the contract (restarts keep it).
                retry = self._auto_port and not self._ever_started and attempt + 1 < _PORT_RETRIES
                if not (retry and _ADDR_IN_USE.search(str(exc))):
                    raise
                log.debug(f"{self.kind} port taken, retrying", port=self.port)
                self.port = free_port()

    def _atexit_stop(self) -> None:
        """Interpreter exit: stop the server and remove an owned temp dir."""
        with contextlib.suppress(Exception):
            self._stop_at_exit()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop(cleanup=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(port={self.port}, version={self.version!r}, base_dir={str(self.base_dir)!r})"
