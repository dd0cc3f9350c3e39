"""The fault proxy's pieces: its modes, a connection's two pipes, commands to the loop, socket helpers."""

from __future__ import annotations

import enum
import ipaddress
import selectors
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field

import structlog

log = structlog.get_logger(__name__)

LISTEN_HOST = "127.0.0.1"
BUFFER_SIZE = 64 * 1024
MAX_QUEUED_BYTES = 1024 * 1024
STOP_TIMEOUT = 2.0
COMMAND_TIMEOUT = 5.0
_ACCEPTS_PER_EVENT = 64
_LISTEN_BACKLOG = 128
_URL_SCHEMES = frozenset({"postgres", "postgresql", "redis", "rediss"})
# libpq query parameters that would silently route around the proxy
_HOST_PARAMS = frozenset({"host", "hostaddr", "port"})
_LINGER_RST = struct.pack("ii", 1, 0)
_READ = selectors.EVENT_READ
_WRITE = selectors.EVENT_WRITE


class Mode(enum.Enum):
    """What the proxy does to the traffic; see the module docstring for the exact semantics."""

    PASS = "pass"
    DELAY = "delay"
    BLACKHOLE = "blackhole"
    RESET = "reset"
    DROP_REPLIES = "drop_replies"


@dataclass(eq=False)
class _Pipe:
    """One direction of a connection: bytes read from ``src`` and written to ``dst``."""

    src: socket.socket
    dst: socket.socket
    upstream: bool  # True: client -> server
    queue: deque[tuple[float, memoryview]] = field(default_factory=deque)  # (due time, bytes not yet sent)
    queued: int = 0
    src_eof: bool = False
    shut: bool = False  # src's EOF has been passed on to dst

    def clear(self) -> int:
        """Drop everything queued; return the number of bytes dropped."""
        dropped, self.queued = self.queued, 0
        self.queue.clear()
        return dropped

    def head_due(self) -> float | None:
        """Due time of the oldest queued chunk, or None when nothing is queued."""
        return self.queue[0][0] if self.queue else None


@dataclass(eq=False)
class _Conn:
    """A proxied client connection and its upstream leg."""

    client: socket.socket
    server: socket.socket
    connected: bool  # upstream connect() has completed
    up: _Pipe = field(init=False)
    down: _Pipe = field(init=False)
    masks: dict[socket.socket, int] = field(default_factory=dict)  # selector registrations
    closed: bool = False

    def __post_init__(self) -> None:
        self.up = _Pipe(self.client, self.server, upstream=True)
        self.down = _Pipe(self.server, self.client, upstream=False)

    def pipes(self) -> tuple[_Pipe, _Pipe]:
        """Both directions, client->server first."""
        return self.up, self.down


@dataclass(eq=False)
class _Command:
    """A callable to run on the loop thread; the caller waits for ``done``."""

    fn: Callable[[], None]
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def run(self) -> None:
        """Run ``fn``, remember its exception, and always signal ``done``."""
        try:
            self.fn()
        except BaseException as exc:  # handed to the waiting caller
            self.error = exc
        finally:
            self.done.set()


def _loopback_ipv4(host: str) -> str:
    """Return ``host`` as a loopback IPv4 address string; ``localhost`` maps to 127.0.0.1. ValueError otherwise."""
    if host == "localhost":
        return LISTEN_HOST
    try:
        address = ipaddress.IPv4Address(host)
    except ValueError:
        raise ValueError(f"upstream must be a loopback IPv4 address, got {host!r}") from None
    if not address.is_loopback:
        raise ValueError(f"upstream must be a loopback IPv4 address, got {host!r}")
    return str(address)


def _rst_close(sock: socket.socket) -> None:
    """Close ``sock`` with an RST instead of a FIN (SO_LINGER on, timeout 0)."""
    with suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    sock.close()


def _prepare(sock: socket.socket) -> None:
    """Make a connection socket non-blocking with Nagle off (small request/reply protocols)."""
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _send(sock: socket.socket, data: memoryview) -> int:
    """Non-blocking send; 0 when the socket buffer is full. Other OSErrors propagate."""
    try:
        return sock.send(data)
    except (BlockingIOError, InterruptedError):
        return 0
