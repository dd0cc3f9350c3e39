"""The :class:`FaultProxy`: one loop thread relays every connection and applies the mode."""

from __future__ import annotations

import errno
import functools
import math
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from types import TracebackType
from urllib.parse import parse_qs, urlsplit, urlunsplit

import structlog

from .parts import (
    _ACCEPTS_PER_EVENT,
    _HOST_PARAMS,
    _LISTEN_BACKLOG,
    _READ,
    _URL_SCHEMES,
    _WRITE,
    BUFFER_SIZE,
    COMMAND_TIMEOUT,
    LISTEN_HOST,
    MAX_QUEUED_BYTES,
    STOP_TIMEOUT,
    Mode,
    _Command,
    _Conn,
    _loopback_ipv4,
    _Pipe,
    _prepare,
    _rst_close,
    _send,
)

log = structlog.get_logger(__name__)


class FaultProxy:
    """A loopback TCP proxy in front of ``upstream_host:upstream_port`` that injects faults on command.

    ``port`` is bound in the constructor (``listen_port``, or a free ephemeral port), so :meth:`url_for` works
    before :meth:`start`; connections are refused until :meth:`start` and after :meth:`stop`. All public methods
    are thread-safe. A proxy can be started again after :meth:`stop` on the same port; the mode is kept.
    """

    def __init__(self, upstream_host: str, upstream_port: int, *, listen_port: int | None = None) -> None:
        """Validate the upstream (loopback IPv4 only) and bind the listening socket. OSError if the port is taken."""
        self.upstream: tuple[str, int] = (_loopback_ipv4(upstream_host), upstream_port)
        self._listener: socket.socket | None = self._bind(listen_port or 0)
        self.port: int = self._listener.getsockname()[1]
        self._mode = Mode.PASS
        self._delay = 0.0
        self._stats = dict.fromkeys(("connections", "bytes_up", "bytes_down", "bytes_dropped", "resets"), 0)
        self._conns: set[_Conn] = set()
        self._waiting: set[_Conn] = set()  # connections with queued bytes that are not due yet
        self._buf = bytearray(BUFFER_SIZE)
        self._view = memoryview(self._buf)
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._ctl_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._selector: selectors.BaseSelector | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None

    # -- public API --------------------------------------------------------- #

    @property
    def mode(self) -> Mode:
        """The current mode."""
        return self._mode

    @property
    def delay_seconds(self) -> float:
        """The hold time applied in ``DELAY`` mode (0 in every other mode)."""
        return self._delay

    @property
    def stats(self) -> dict[str, int]:
        """A snapshot: ``connections`` accepted, ``active`` now, ``bytes_up``/``bytes_down`` forwarded
        (client->server / server->client), ``bytes_dropped`` by BLACKHOLE/DROP_REPLIES/mode changes, and
        ``resets`` (connections aborted by RESET mode or :meth:`cut`)."""
        return {**self._stats, "active": len(self._conns)}

    def start(self) -> FaultProxy:
        """Start the loop thread and begin accepting. Idempotent; returns self."""
        with self._ctl_lock:
            if self._thread is not None and self._thread.is_alive():
                return self
            listener = self._listener or self._bind(self.port)
            self._listener = listener
            listener.listen(_LISTEN_BACKLOG)
            listener.setblocking(False)
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
            self._selector = selectors.DefaultSelector()
            self._selector.register(listener, _READ)
            self._selector.register(self._wake_r, _READ)
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name=f"fault-proxy-{self.port}", daemon=True)
            self._thread.start()
            log.debug("fault proxy started", port=self.port, upstream_port=self.upstream[1])
            return self

    def stop(self) -> None:
        """Close the listener and reset every connection, then join the loop thread (at most ``STOP_TIMEOUT``).

        Never hangs on stuck peers: all socket work is non-blocking. Idempotent.
        """
        with self._ctl_lock:
            thread, self._thread = self._thread, None
            if thread is None:
                if self._listener is not None:
                    self._listener.close()
                    self._listener = None
                return
            self._stopping = True
            self._wake()
            thread.join(STOP_TIMEOUT)
            if thread.is_alive():
                log.warning("fault proxy loop did not stop in time", port=self.port)
            log.debug("fault proxy stopped", port=self.port, **self._stats)

    def url_for(self, url: str) -> str:
        """Rewrite a ``postgresql://`` / ``postgres://`` / ``redis://`` / ``rediss://`` URL (a ``+driver`` suffix
        such as ``postgresql+psycopg`` is fine) to point at this proxy, keeping user, password, database and query.

        ValueError for other schemes, or when the query names ``host``/``hostaddr``/``port`` (libpq would then
        bypass the proxy).
        """
        parts = urlsplit(url)
        if parts.scheme.partition("+")[0] not in _URL_SCHEMES:
            raise ValueError(f"not a Postgres or Redis URL: {parts.scheme!r}")
        if parse_qs(parts.query, keep_blank_values=True).keys() & _HOST_PARAMS:
            raise ValueError("the URL's query sets host, hostaddr or port, which would bypass the proxy")
        userinfo, at, _ = parts.netloc.rpartition("@")
        return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{LISTEN_HOST}:{self.port}"))

    def set_mode(self, mode: Mode, *, delay: float = 0.0) -> None:
        """Switch to ``mode`` (``delay`` seconds only with ``Mode.DELAY``); applied to existing connections
        before this returns. ValueError for a negative or non-finite delay, or a delay with another mode."""
        if not math.isfinite(delay) or delay < 0:
            raise ValueError(f"delay must be a finite number >= 0, got {delay!r}")
        if delay and mode is not Mode.DELAY:
            raise ValueError(f"a delay only applies to Mode.DELAY, not {mode}")
        self._call(lambda: self._apply_mode(mode, delay))
        log.info("fault proxy mode", port=self.port, mode=mode.value, delay=delay)

    def pass_through(self) -> None:
        """Forward everything unchanged (``Mode.PASS``)."""
        self.set_mode(Mode.PASS)

    def delay(self, seconds: float) -> None:
        """Hold every chunk ``seconds`` before forwarding it, in both directions, order preserved."""
        self.set_mode(Mode.DELAY, delay=seconds)

    def blackhole(self) -> None:
        """Read and drop all bytes, forward and answer nothing; existing connections hang (and stay corrupt)."""
        self.set_mode(Mode.BLACKHOLE)

    def reset(self) -> None:
        """RST every current connection, and every new one until the mode changes."""
        self.set_mode(Mode.RESET)

    def drop_replies(self) -> None:
        """Forward client->server bytes, discard server->client bytes (the client sees an unknown outcome)."""
        self.set_mode(Mode.DROP_REPLIES)

    def cut(self) -> None:
        """RST every current connection without changing the mode; new connections are unaffected."""
        self._call(self._abort_all)
        log.info("fault proxy cut", port=self.port)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"FaultProxy(port={self.port}, upstream={self.upstream[0]}:{self.upstream[1]}, mode={self._mode.value})"

    # -- control plumbing ---------------------------------------------------- #

    @staticmethod
    def _bind(port: int) -> socket.socket:
        """A TCP socket bound to ``127.0.0.1:port`` (0: any free port), not yet listening."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((LISTEN_HOST, port))
        except OSError:
            sock.close()
            raise
        return sock

    def _call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop thread and wait for it (directly when the loop is not running)."""
        with self._ctl_lock:
            command = _Command(fn)
            if self._thread is None or not self._thread.is_alive():
                command.run()
            else:
                self._commands.put(command)
                self._wake()
                if not command.done.wait(COMMAND_TIMEOUT):
                    raise RuntimeError(f"fault proxy on port {self.port} did not respond")
            if command.error is not None:
                raise command.error

    def _wake(self) -> None:
        """Interrupt the loop's select()."""
        wake_w = self._wake_w
        if wake_w is not None:
            with suppress(OSError):
                wake_w.send(b"\0")

    def _run_commands(self) -> None:
        """Loop thread: drain the wake-up socket and run the queued commands."""
        wake_r = self._wake_r
        if wake_r is not None:
            with suppress(OSError):
                while wake_r.recv(4096):
                    pass
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            command.run()

    def _apply_mode(self, mode: Mode, delay: float) -> None:
        """Loop thread: switch modes and bring every existing connection in line with the new mode."""
        self._mode, self._delay = mode, delay
        if mode is Mode.RESET:
            self._abort_all()
            return
        now = time.monotonic()
        for conn in list(self._conns):
            self._guard(conn, functools.partial(self._resync, conn, now))

    def _resync(self, conn: _Conn, now: float) -> None:
        """Drop what a blocked direction holds, release what an open direction may now send (incl. held EOFs)."""
        for pipe in conn.pipes():
            if self._blocked(pipe):
                self._stats["bytes_dropped"] += pipe.clear()
            else:
                self._flush(conn, pipe, now)
        self._update(conn, now)

    def _abort_all(self) -> None:
        """Loop thread: RST every current connection (counted as injected resets)."""
        for conn in list(self._conns):
            self._abort(conn, injected=True)

    # -- event loop ---------------------------------------------------------- #

    def _run(self) -> None:
        """Loop thread body: select, dispatch, fire delay timers; tear everything down on exit."""
        selector = self._selector
        assert selector is not None
        try:
            while not self._stopping:
                events = selector.select(self._next_timeout(time.monotonic()))
                now = time.monotonic()
                for key, mask in events:
                    self._dispatch(key, mask, now)
                self._fire_timers(now)
        except Exception:
            log.exception("fault proxy loop crashed", port=self.port)
        finally:
            self._teardown()

    def _dispatch(self, key: selectors.SelectorKey, mask: int, now: float) -> None:
        """Route one selector event to the listener, the command queue or a connection."""
        if key.fileobj is self._listener:
            self._accept_all()
        elif key.fileobj is self._wake_r:
            self._run_commands()
        else:
            conn: _Conn = key.data
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            self._guard(conn, lambda: self._on_io(conn, sock, mask, now))

    def _guard(self, conn: _Conn, fn: Callable[[], None]) -> None:
        """Run connection work; on any error reset both sides of that connection (never kill the loop)."""
        if conn.closed:
            return
        try:
            fn()
        except OSError as exc:
            log.debug("fault proxy connection failed", port=self.port, error=str(exc))
            self._abort(conn, injected=False)
        except Exception:
            log.exception("fault proxy connection error", port=self.port)
            self._abort(conn, injected=False)

    def _next_timeout(self, now: float) -> float | None:
        """Seconds until the earliest held chunk is due, or None when nothing is held."""
        dues = [due for conn in self._waiting for pipe in conn.pipes() if (due := pipe.head_due()) is not None]
        return max(0.0, min(dues) - now) if dues else None

    def _fire_timers(self, now: float) -> None:
        """Send held chunks that became due."""
        for conn in list(self._waiting):
            self._guard(conn, functools.partial(self._resync, conn, now))

    def _teardown(self) -> None:
        """Loop thread, on exit: reset all connections, close every socket, release waiting callers."""
        for conn in list(self._conns):
            self._abort(conn, injected=False)
        for sock in (self._listener, self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()
        self._listener = self._wake_r = self._wake_w = None
        if self._selector is not None:
            self._selector.close()
            self._selector = None
        self._run_commands()

    # -- connections --------------------------------------------------------- #

    def _accept_all(self) -> None:
        """Accept pending clients; in RESET mode reset them at once, else open their upstream leg."""
        assert self._listener is not None
        for _ in range(_ACCEPTS_PER_EVENT):
            try:
                client, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: leave the client in the backlog
                log.warning("fault proxy accept failed", port=self.port, error=str(exc))
                return
            self._stats["connections"] += 1
            if self._mode is Mode.RESET:
                self._stats["resets"] += 1
                _rst_close(client)
            else:
                self._open(client)

    def _open(self, client: socket.socket) -> None:
        """Start a non-blocking connect upstream for ``client``; reset the client if it fails at once."""
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            _prepare(client)
            _prepare(server)
            err = server.connect_ex(self.upstream)
        except OSError as exc:
            err = exc.errno or errno.EIO
        if err not in (0, errno.EINPROGRESS):
            log.debug("fault proxy upstream connect failed", port=self.port, error=errno.errorcode.get(err, err))
            server.close()
            _rst_close(client)
            return
        conn = _Conn(client, server, connected=err == 0)
        self._conns.add(conn)
        self._guard(conn, lambda: self._update(conn, time.monotonic()))

    def _on_io(self, conn: _Conn, sock: socket.socket, mask: int, now: float) -> None:
        """Handle readiness of one of ``conn``'s sockets."""
        if sock is conn.server and not conn.connected:
            if not mask & _WRITE:
                return
            err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                raise OSError(err, f"upstream connect failed: {errno.errorcode.get(err, err)}")
            conn.connected = True
        if mask & _READ:
            self._read(conn, conn.up if sock is conn.client else conn.down, now)
        if mask & _WRITE:
            self._flush(conn, conn.down if sock is conn.client else conn.up, now)
        self._update(conn, now)

    def _blocked(self, pipe: _Pipe) -> bool:
        """True when the current mode discards this direction's bytes (and holds its EOF)."""
        return self._mode is Mode.BLACKHOLE or (self._mode is Mode.DROP_REPLIES and not pipe.upstream)

    def _read(self, conn: _Conn, pipe: _Pipe, now: float) -> None:
        """Read one chunk from ``pipe.src``: drop it, send it straight on, or queue it with its due time."""
        n = pipe.src.recv_into(self._buf)
        if n == 0:
            pipe.src_eof = True
            self._flush(conn, pipe, now)
            return
        if self._blocked(pipe):
            self._stats["bytes_dropped"] += n
            return
        data = self._view[:n]
        delay = self._delay if self._mode is Mode.DELAY else 0.0
        if not delay and not pipe.queue and conn.connected:
            sent = _send(pipe.dst, data)
            self._count_sent(pipe, sent)
            if sent == n:
                return
            data = data[sent:]
        pipe.queue.append((now + delay, memoryview(bytes(data))))
        pipe.queued += len(data)

    def _flush(self, conn: _Conn, pipe: _Pipe, now: float) -> None:
        """Send ``pipe``'s due chunks until the socket buffer fills; pass on a pending EOF once drained."""
        if not conn.connected or self._blocked(pipe):
            return
        while pipe.queue:
            due, data = pipe.queue[0]
            if due > now:
                return
            sent = _send(pipe.dst, data)
            self._count_sent(pipe, sent)
            pipe.queued -= sent
            if sent < len(data):
                pipe.queue[0] = (due, data[sent:])
                return
            pipe.queue.popleft()
        if pipe.src_eof and not pipe.shut:
            pipe.dst.shutdown(socket.SHUT_WR)
            pipe.shut = True

    def _count_sent(self, pipe: _Pipe, sent: int) -> None:
        """Account forwarded bytes per direction."""
        self._stats["bytes_up" if pipe.upstream else "bytes_down"] += sent

    def _update(self, conn: _Conn, now: float) -> None:
        """Recompute ``conn``'s selector interests and timer; close it once both directions have ended."""
        if conn.closed:
            return
        if conn.up.shut and conn.down.shut:
            self._close(conn)
            return
        up, down = conn.up, conn.down
        self._set_mask(conn, conn.client, read=self._wants_read(up), write=self._wants_write(conn, down, now))
        self._set_mask(
            conn,
            conn.server,
            read=conn.connected and self._wants_read(down),
            write=not conn.connected or self._wants_write(conn, up, now),
        )
        if any((due := pipe.head_due()) is not None and due > now for pipe in conn.pipes()):
            self._waiting.add(conn)
        else:
            self._waiting.discard(conn)

    @staticmethod
    def _wants_read(pipe: _Pipe) -> bool:
        """Read more from ``pipe.src`` unless it ended or too much is already held (backpressure)."""
        return not pipe.src_eof and pipe.queued < MAX_QUEUED_BYTES

    def _wants_write(self, conn: _Conn, pipe: _Pipe, now: float) -> bool:
        """Wait for ``pipe.dst`` to be writable only when a due chunk is waiting to be sent."""
        due = pipe.head_due()
        return conn.connected and due is not None and due <= now and not self._blocked(pipe)

    def _set_mask(self, conn: _Conn, sock: socket.socket, *, read: bool, write: bool) -> None:
        """Register, modify or unregister ``sock`` so the selector watches exactly the wanted events."""
        assert self._selector is not None
        mask = (_READ if read else 0) | (_WRITE if write else 0)
        old = conn.masks.get(sock, 0)
        if mask == old:
            return
        if not old:
            self._selector.register(sock, mask, conn)
        elif not mask:
            self._selector.unregister(sock)
        else:
            self._selector.modify(sock, mask, conn)
        conn.masks[sock] = mask

    def _forget(self, conn: _Conn) -> None:
        """Unregister ``conn``'s sockets and drop it from the bookkeeping."""
        conn.closed = True
        for sock, mask in conn.masks.items():
            if mask and self._selector is not None:
                with suppress(KeyError, ValueError):
                    self._selector.unregister(sock)
        conn.masks.clear()
        self._conns.discard(conn)
        self._waiting.discard(conn)

    def _close(self, conn: _Conn) -> None:
        """Both directions ended cleanly: close both sockets normally."""
        self._forget(conn)
        conn.client.close()
        conn.server.close()

    def _abort(self, conn: _Conn, *, injected: bool) -> None:
        """Reset both sides of ``conn``; ``injected`` counts it in ``stats["resets"]``."""
        if conn.closed:
            return
        self._forget(conn)
        _rst_close(conn.client)
        _rst_close(conn.server)
        if injected:
            self._stats["resets"] += 1
