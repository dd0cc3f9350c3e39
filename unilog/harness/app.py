"""What the harness needs to know about an application to run it (``unilog demo``) and judge it (``unilog chaos``).

The harness owns no application: an :class:`App` describes one. The demo package describes Rocket Rides
(``unilog_demo.fleet.ROCKET_RIDES``); yours can describe your app the same way and hand it to
:func:`unilog.harness.demo.run_demo` and :func:`unilog.harness.chaos.run_chaos`.

The contract the runners rely on:

* the application's processes are modules of ``package`` (``python -m <package>.<module>``), so the fleet runs the
  same from a source checkout and from an installed wheel, in any working directory;
* ``api`` is a WSGI app (``module:attribute``) with ``GET /health`` (served by gunicorn), ``asgi_api`` optionally
  the same API as an ASGI app (served by uvicorn: ``--api fastapi``), and ``simulator`` a module that drives it with
  ``--api URL --rate R [--seed S] [--history FILE]`` (writing a chaos history with ``--history``);
* ``consumer`` is a module run as ``python -m <consumer> NAME [--group --worker W] UNILOG-CONSUME-OPTIONS`` whose
  state the ``consumer_totals`` reader returns by consumer name, and ``spark_consumer`` (optional) likewise with
  ``NAME --master M --checkpoint DIR``;
* every record the application stages for one row of ``source_table`` carries ``data["id"]`` = that row's id and
  ``object`` = ``source_object``, and ``canonical_totals`` recomputes from the table what every consumer must hold;
* ``stage(conn, cid, rng, stream)`` (chaos) inserts one source row and stages its record with ``data["cid"] = cid``
  in the caller's transaction, and returns the row's id;
* ``api_requires`` and ``asgi_requires`` name the modules each API imports that unilog does not depend on (its web
  framework): :meth:`App.missing_modules` checks them, and the server the API runs under, before anything starts.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from unilog.errors import ConfigurationError


@dataclass(frozen=True)
class App:
    """An application built on unilog, as the harness runs it (see the module docstring for the contract)."""

    name: str
    package: str
    stream: str
    prepare: Callable[[str], None]  # database URL -> unilog's migrations and the app's tables, idempotent
    canonical_totals: Callable[[Any], Any]  # psycopg connection -> the totals every consumer must reach
    consumer_totals: Callable[[Any], Mapping[str, Any]]  # psycopg connection -> each consumer's totals, by name
    stage: Callable[..., int]  # (conn, cid, rng, stream) -> source row id; chaos's direct producers call it
    source_table: str
    source_object: str
    api: str = "api:app"
    asgi_api: str | None = None
    simulator: str = "simulator"
    consumer: str = "consumer"
    handler: str = "consumer:handle"  # the consumers' handler, relative to ``package``
    spark_consumer: str | None = "spark_consumer"
    spark_effect: str | None = "spark_consumer:state_effect"  # NAME -> effect(conn, df), for chaos's Spark process
    streamers: tuple[str, ...] = ("streamer", "streamer2")
    consumers: tuple[str, ...] = ("consumer0", "consumer1")
    group: str = "group0"
    group_workers: tuple[str, ...] = ("group0-a", "group0-b")
    spark_name: str = "spark0"
    state_tables: tuple[str, ...] = ()  # the consumers' state: must be empty before a chaos run
    api_requires: tuple[str, ...] = ()  # modules the WSGI ``api`` imports beyond unilog's dependencies
    asgi_requires: tuple[str, ...] = ()  # modules the ASGI ``asgi_api`` imports beyond unilog's dependencies

    def module(self, name: str) -> str:
        """The importable name of one of the app's modules (or ``module:attribute``)."""
        return f"{self.package}.{name}"

    @property
    def default_handler(self) -> str:
        return self.module(self.handler)

    def api_argv(self, port: int, kind: str = "flask", python: str = sys.executable) -> list[str]:
        """The command that serves the API on ``port``: ``flask`` (the WSGI ``api`` under gunicorn, 2 workers of 4
        threads) or ``fastapi`` (the ASGI ``asgi_api`` under uvicorn, one process: with ``--workers 2`` uvicorn 0.54
        answered POSTs on kept-alive connections in 45 ms instead of 2 ms here, a cause not found yet)."""
        if kind == "fastapi":
            if self.asgi_api is None:
                raise ConfigurationError(f"{self.name} has no ASGI API (App.asgi_api): use --api flask")
            uvicorn = [python, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port)]
            return [*uvicorn, "--timeout-graceful-shutdown", "5", self.module(self.asgi_api)]
        if kind != "flask":
            raise ConfigurationError(f"--api must be flask or fastapi, not {kind!r}")
        gunicorn = [python, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--workers", "2", "--threads", "4"]
        return [*gunicorn, "--graceful-timeout", "5", self.module(self.api)]

    def missing_modules(self, kind: str = "flask") -> list[str]:
        """What serving the ``kind`` API (see :meth:`api_argv`) needs and cannot import here: the server it runs
        under (gunicorn, uvicorn) and the app's ``api_requires`` or ``asgi_requires``. Checked without importing
        anything, in a moment, so a runner can refuse before it starts a server."""
        needs = ("uvicorn", *self.asgi_requires) if kind == "fastapi" else ("gunicorn", *self.api_requires)
        return missing_modules(needs)


def missing_modules(names: Iterable[str]) -> list[str]:
    """The modules of ``names`` (dotted names allowed) that cannot be imported here, in order; found by
    ``importlib.util.find_spec`` (a dotted name's parent packages are imported, the modules themselves are not)."""
    return [name for name in names if not _importable(name)]


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except Exception:  # a parent package that is missing, or fails to import
        return False


# A fleet's Spark consumer is a short-lived JVM on a machine it shares with a dozen processes: C1, the JIT's quick
# tier, alone. Its session's start took 10 s of CPU against 19 s with both tiers (wall 12.3 against 15.2 s, idle
# 2-core machine), its first batch applied 27-30 s after the process started against 33-35 s; the demo's and chaos
# runs' few rides a second never need C2's code. Left out when SPARK_SUBMIT_OPTS is set (the user's own choice).
SPARK_SHORT_JVM = {"SPARK_SUBMIT_OPTS": "-XX:TieredStopAtLevel=1"}


def spark_env() -> dict[str, str]:
    """The environment a fleet's Spark consumer process gets on top of the fleet's (:data:`SPARK_SHORT_JVM`)."""
    return {} if "SPARK_SUBMIT_OPTS" in os.environ else dict(SPARK_SHORT_JVM)


def spark_available() -> bool:
    """Whether a Spark consumer can run here (pyspark importable, a Java runtime on PATH)."""
    return importlib.util.find_spec("pyspark") is not None and shutil.which("java") is not None
