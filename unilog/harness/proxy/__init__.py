"""A small TCP fault proxy for tests and chaos runs.

:class:`FaultProxy` sits between a client (the streamer, a consumer, psycopg, redis-py) and a real server on loopback
and injects network faults on command::

    with FaultProxy("127.0.0.1", redis_server.port) as proxy:
        client = redis.Redis.from_url(proxy.url_for(redis_server.url), socket_timeout=0.5)
        proxy.drop_replies()                   # the server executes, the client never hears back
        ...
        proxy.pass_through()

Loopback only: the proxy listens on ``127.0.0.1`` and the upstream must be a loopback IPv4 address.

Modes (:class:`Mode`) and what they mean for connections that already exist and for new ones:

``PASS``
    Bytes are forwarded unchanged in both directions as soon as they arrive.
``DELAY``
    Every chunk is held ``delay`` seconds after it arrived before it is forwarded, in either direction, order
    preserved (a latency, not a bandwidth limit: chunks arriving together leave together). At most
    ``MAX_QUEUED_BYTES`` are held per direction, so a bulk transfer runs at about ``MAX_QUEUED_BYTES / delay``
    bytes per second, like a TCP window. Switching away from ``DELAY`` does not shorten the hold of bytes already
    queued.
``BLACKHOLE``
    A dead network: connections are accepted and bytes are read from both peers, but nothing is forwarded in either
    direction and nothing is ever answered, not even a FIN. Bytes that arrive (or are still queued) while blackholed
    are DROPPED, not delivered later, so a connection that saw a blackhole is corrupt for good: the client's own
    timeout has to fire, and it should reconnect once the mode changes. A peer's RST still tears the pair down.
``RESET``
    Every current connection is aborted with an RST (``SO_LINGER`` 0) on both sides, and every new connection is
    reset right after it is accepted, until the mode changes.
``DROP_REPLIES``
    Client-to-server bytes are forwarded, server-to-client bytes (and the server's FIN) are discarded: the server
    executes the command and the client never learns the outcome.

:meth:`FaultProxy.cut` aborts the current connections with RST without changing the mode. Every mode change and
every cut has taken effect on all existing connections when the call returns.

Implementation: one daemon thread runs a ``selectors`` loop over the listener and every connection (non-blocking
sockets, ``recv_into`` a shared 64 KiB buffer, ``TCP_NODELAY`` on both legs); other threads talk to it through a
command queue and a wake-up socket pair, so all socket work happens on the loop thread and mode changes are
thread-safe. Peer errors are propagated: if either side resets or fails, both sides are reset.
"""

from __future__ import annotations

from .faultproxy import FaultProxy
from .parts import MAX_QUEUED_BYTES, Mode

__all__ = ["MAX_QUEUED_BYTES", "FaultProxy", "Mode"]
