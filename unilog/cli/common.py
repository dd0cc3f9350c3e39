"""What every command shares: exit codes, settings and faults from arguments and the environment, the common
options, and running a worker until SIGTERM.

The command line is the only place that reads the environment; the library takes frozen settings.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import threading
from collections.abc import Callable
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from ..config import Settings
from ..errors import ConfigurationError
from ..health import HEALTH, MAX_SILENCE

# Every command builds the whole parser, so this module and the commands' parser set-up import no adapter, no
# structlog: those come when a command runs (each function below imports what it uses), after logging is configured
# (issue 45: tests start the command hundreds of times; tests/test_console_script.py keeps it so).
if TYPE_CHECKING:
    from .. import engine
    from ..faults import Faults


class ExitCode(IntEnum):
    """Exit codes of the ``unilog`` command."""

    OK = 0
    FAILURE = 1  # an unexpected error, or a check that failed (e.g. the demo's verdict)
    USAGE = 2  # bad command-line arguments (argparse's own code), or options that contradict each other
    CONFIG = 3  # a bad setting, or a command's extra (pip install "unilog-outbox[demo]") or program is missing
    UNREACHABLE = 4  # Postgres or Redis cannot be reached
    SCHEMA = 5  # the database is not migrated, or `unilog migrate` could not migrate it
    HANDLER = 6  # the consumer's handler cannot be imported
    CRASHED = 7  # an injected crash with in-process restart disabled
    DATA_LOSS = 8  # a consumer found entries missing from the stream (trimmed past it, or Redis lost data)
    HORIZON_HELD = 9  # retired (issue 33): no record waits behind another transaction; the number stays reserved
    MALFORMED = 10  # an entry is not a unilog record and the consumer runs with --on-malformed stop
    POISON = 11  # a record keeps failing its handler and the consumer runs with --on-poison stop (the default)
    CAPTURE_LOST = (
        12  # WAL capture lost record messages with its slot, or a batch was in doubt when it went (wal-capture.md)
    )
    REDIS_FULL = 13  # Redis is out of memory, or the streamer paused for it (--once): the records stay staged
    BACKFILL_REFUSED = 14  # `unilog backfill`: a table, key, --where or name it cannot use; nothing staged
    NOT_CAUGHT_UP = 15  # `unilog demo`: a consumer was still behind when the wait ended (not a disagreement)
    CONSUMER_RUNNING = 16  # `unilog consumer|group delete`: a process of it is running; nothing deleted
    SCHEMA_INCOMPATIBLE = 17  # `unilog schema check|register`: a record type breaks its registered versions
    ASYNCAPI_INVALID = 18  # `unilog asyncapi --validate`: the official parser found errors in the document
    INTERRUPTED = 130  # Ctrl-C


def settings_from(args: argparse.Namespace) -> Settings:
    return Settings.from_env(
        database_url=getattr(args, "database_url", None),
        redis_url=getattr(args, "redis_url", None),
        stream=getattr(args, "default_stream", None),
    )


def faults_from(args: argparse.Namespace) -> Faults:
    from ..faults import FaultConfig, Faults

    spec = args.faults if args.faults is not None else os.environ.get("UNILOG_FAULTS", "")
    seed = args.fault_seed if args.fault_seed is not None else int_env("UNILOG_FAULT_SEED")
    return Faults(FaultConfig.parse(spec, seed))


def int_env(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigurationError(f"{name} must be an integer, got {value!r}") from None


def redis_api(settings: Settings) -> engine.RedisStreams:
    """The Redis adapter on a client that answered a ping (else :class:`~unilog.errors.ServerUnreachable`)."""
    from .. import engine

    client = engine.connect(settings.redis_url)
    engine.ping(client, settings.redis_url)
    return engine.RedisStreams(client)


def runs(target: str) -> Callable[[argparse.Namespace], int]:
    """The command function ``target`` (``module:function`` of this package), imported when the command runs: the
    parser set-up stays apart from what only running the command needs."""
    module, _, function = target.partition(":")

    def run(args: argparse.Namespace) -> int:
        command: Callable[[argparse.Namespace], int] = getattr(
            importlib.import_module(f"{__package__}.{module}"), function
        )
        return command(args)

    return run


def run_until_signalled(loop: Callable[[threading.Event], None]) -> None:
    """Run ``loop(stop_event)``; SIGTERM and SIGINT set the event, so the current batch finishes and we exit 0."""
    stop = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    loop(stop)


def common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", default=os.environ.get("UNILOG_LOG_LEVEL", "info"))
    p.add_argument(
        "--log-json", action=argparse.BooleanOptionalAction, default=None, help="JSON logs (default: when not a TTY)"
    )


def connection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database-url", help="default: $DATABASE_URL")
    p.add_argument("--redis-url", help="default: $REDIS_URL")
    p.add_argument("--default-stream", help="default: $UNILOG_STREAM or 'unilog'")


def fault_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--faults", help="e.g. streamer.double_send=0.1 (default: $UNILOG_FAULTS)")
    p.add_argument("--fault-seed", type=int, help="default: $UNILOG_FAULT_SEED")
    p.add_argument(
        "--exit-on-crash",
        action="store_true",
        help="let an injected crash end the process (default: restart in-process)",
    )


def metrics_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metrics-port",
        type=int,
        default=int_env("UNILOG_METRICS_PORT"),
        help="serve Prometheus metrics (/metrics) and health probes (/healthz, /readyz) on this port "
        "(default: $UNILOG_METRICS_PORT; none)",
    )
    p.add_argument(
        "--metrics-addr",
        default=os.environ.get("UNILOG_METRICS_ADDR", "127.0.0.1"),
        help="address the metrics are served on (default: $UNILOG_METRICS_ADDR or 127.0.0.1; 0.0.0.0 for all)",
    )
    p.add_argument(
        "--health-max-silence",
        type=float,
        default=MAX_SILENCE,
        metavar="SECONDS",
        help="/healthz fails once a loop has not turned for this long (a handler's batch included; "
        "default %(default)g)",
    )


def serve_metrics(args: argparse.Namespace) -> None:
    """Serve this process's metrics if ``--metrics-port`` (or ``UNILOG_METRICS_PORT``) asks for it."""
    port = getattr(args, "metrics_port", None)
    if port is None:
        return
    from .. import metrics

    HEALTH.max_silence = getattr(args, "health_max_silence", MAX_SILENCE)
    HEALTH.starting()  # /readyz answers before the first connect: not ready until the process reaches its servers

    try:
        metrics.serve(port, args.metrics_addr)
    except OSError as exc:
        raise ConfigurationError(f"cannot serve metrics on {args.metrics_addr}:{port}: {exc.strerror or exc}") from None


def spark_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--master", default=os.environ.get("SPARK_MASTER", "local[*]"), help="Spark master URL")
    p.add_argument("--conf", action="append", default=[], help="a Spark setting, key=value (repeatable)")


def _int_at_least(value: str, least: int, words: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < least:
        raise argparse.ArgumentTypeError(f"{value!r} must be {words}")
    return number


def positive_int(value: str) -> int:
    return _int_at_least(value, 1, "at least 1")


def non_negative_int(value: str) -> int:
    return _int_at_least(value, 0, "0 or more")
