"""``unilog dashboard``: one web page with the streams, the consumers' lag over the last minutes, the oldest open
transaction that staged records and the dead letters, refreshed live; dead letters can be shown, replayed and dropped
(unless ``--read-only``).

A Flask app served by waitress, a production WSGI server (threads, a bounded request queue, no debugger; both come
with the ``dashboard`` extra), no front-end build: the page is plain HTML and JavaScript that polls ``/api/status``.
A background thread samples the status every ``interval`` seconds and keeps ``history`` seconds of lag per consumer
for the charts. It binds to localhost by default and shows no secrets (the status report carries no URLs or
passwords). Actions are POSTs that must carry the page's token (a page from another site cannot make the browser
replay or drop anything), are confirmed in the page first, and are logged.
"""

from __future__ import annotations

import secrets
import threading
from typing import Any

import structlog

from ...config import Settings
from ...errors import ConfigurationError
from .history import History

log = structlog.get_logger(__name__)

THREADS = 8  # requests served at once: a few browsers polling every 2 s, and dead-letter actions


def create_app(settings: Settings, history: History, *, read_only: bool = False) -> Any:
    """The Flask app: the page, ``/api/status``, and the dead-letter actions."""
    try:
        from flask import Flask
    except ImportError:
        raise ConfigurationError("the dashboard needs Flask: pip install 'unilog-outbox[dashboard]'") from None
    from .routes import register, register_probes

    app = Flask("unilog.ops.dashboard")
    register(app, settings, history, read_only=read_only, token=secrets.token_urlsafe(24))
    register_probes(app)  # /healthz, /readyz; a server failing under a request is a 503, not a traceback
    return app


class Server:
    """``app`` served by waitress on ``addr:port`` (0: a free port), bound when built, serving once :meth:`start`.

    OSError if the address cannot be bound; ConfigurationError without waitress. :meth:`stop` closes the listener
    and waits up to ``grace`` seconds for requests in progress."""

    def __init__(self, app: Any, addr: str, port: int, *, threads: int = THREADS) -> None:
        try:
            from waitress.server import create_server
        except ImportError:
            raise ConfigurationError("the dashboard needs waitress: pip install 'unilog-outbox[dashboard]'") from None
        # ident: the Server header names the software, not its version
        self._server = create_server(app, host=addr, port=port, threads=threads, ident="waitress")
        self.port: int = self._server.effective_port
        self._thread = threading.Thread(target=self._server.run, name="unilog-dashboard", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, grace: float = 5.0) -> None:
        # the requests in progress first, as waitress's own close does: a request that ends pulls the server's
        # trigger, and close() closes it (a request ending after it raised EBADF, a traceback in the log)
        self._server.task_dispatcher.shutdown(timeout=grace)
        self._server.close()
