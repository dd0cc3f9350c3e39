"""A throw-away ``redis-server`` child process, with the AOF as its only persistence."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path

import structlog

from .binaries import RedisBinary, find_redis
from .process import (
    REDIS_START_TIMEOUT,
    REDIS_STOP_TIMEOUT,
    EmbeddedServerError,
    ServerProcess,
    _read_from,
    _wait_until,
)

log = structlog.get_logger(__name__)


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


class EmbeddedRedis(ServerProcess):
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
        self._init_process(base_dir, port, self.binary.version)
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.settings: dict[str, str] = dict(settings or {})
        self.conf_path: Path = self.base_dir / "redis.conf"
        self.log_path: Path = self.base_dir / "redis.log"
        self._proc: subprocess.Popen[bytes] | None = None

    kind = "redis"
    temp_prefix = "unilog-redis-"

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

    def _before_start(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)

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
        self.conf_path.write_text("# written by unilog.harness.embedded\n" + "".join(lines))

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

    def _stop_at_exit(self) -> None:
        self.stop(cleanup=self._owns_base_dir)
