"""The ``unilog`` command: the process entry point.

This is the only place that reads the environment, configures logging and installs signal handlers. Failures the
user can fix (bad configuration, unreachable server, missing migrations) end in one line on stderr and a named
exit code, never a traceback.

Each module of this package adds one command group (``add(subparsers)``). Commands the library does not own
(``unilog demo`` and ``unilog chaos``, from the demo package) are entry points in the group ``unilog.commands``:
each loads to a function ``add(subparsers)`` that adds one sub-parser whose ``func(args)`` returns an exit code. A
plugin that cannot be loaded never breaks the other commands; running it prints one line and exits
:attr:`ExitCode.CONFIG`.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..errors import (
    AsyncAPIInvalid,
    BackfillRefused,
    CaptureLost,
    ConfigurationError,
    ConsumerRunning,
    DataLoss,
    HandlerNotFound,
    HorizonHeld,
    InjectedCrash,
    InvalidStreamName,
    InvalidUsage,
    MalformedEntry,
    MigrationFailed,
    PoisonRecord,
    RedisOutOfMemory,
    SchemaIncompatible,
    SchemaMissing,
    ServerUnreachable,
    UnilogError,
)
from ..log import configure_logging
from . import (
    asyncapi,
    backfill,
    capture,
    consume,
    consumers,
    dlq,
    extras,
    migrate,
    observe,
    pipeline,
    schema,
    security,
    streamer,
    streams,
)
from .common import ExitCode, common_args

if TYPE_CHECKING:
    from ..consume.records import Handler

__all__ = ["ExitCode", "consume_main", "main"]

PLUGIN_GROUP = "unilog.commands"
_COMMANDS = (
    migrate,
    streamer,
    capture,
    consumers,
    consume,
    dlq,
    streams,
    pipeline,
    observe,
    security,
    backfill,
    schema,
    asyncapi,
)

# the extras a command's optional imports come from, where a package is in several (flask: demo and dashboard)
_COMMAND_EXTRAS = {
    "backfill": ("progress",),
    "schema": ("contracts",),
    "asyncapi": ("contracts",),
    "dashboard": ("dashboard",),
    "reconcile": ("spark",),
    "archive": ("spark",),
    "demo": ("demo", "spark"),
    "chaos": ("demo", "spark"),
}

_ERROR_CODES: list[tuple[type[BaseException], ExitCode]] = [
    (DataLoss, ExitCode.DATA_LOSS),
    (RedisOutOfMemory, ExitCode.REDIS_FULL),
    (CaptureLost, ExitCode.CAPTURE_LOST),
    (HorizonHeld, ExitCode.HORIZON_HELD),
    (MalformedEntry, ExitCode.MALFORMED),
    (PoisonRecord, ExitCode.POISON),
    (HandlerNotFound, ExitCode.HANDLER),
    (BackfillRefused, ExitCode.BACKFILL_REFUSED),
    (ConsumerRunning, ExitCode.CONSUMER_RUNNING),
    (SchemaIncompatible, ExitCode.SCHEMA_INCOMPATIBLE),
    (AsyncAPIInvalid, ExitCode.ASYNCAPI_INVALID),
    (InvalidUsage, ExitCode.USAGE),
    (ConfigurationError, ExitCode.CONFIG),
    (InvalidStreamName, ExitCode.CONFIG),  # a stream name given on the command line
    (ServerUnreachable, ExitCode.UNREACHABLE),
    (SchemaMissing, ExitCode.SCHEMA),
    (MigrationFailed, ExitCode.SCHEMA),
    (UnilogError, ExitCode.FAILURE),
]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``unilog`` command; return its exit code. Run as a program (no ``argv``), the working directory is
    put first on ``sys.path`` (:func:`_users_folder_first`): a host process calling it gives ``argv``. As with
    ``python -m``, a file in the working directory then shadows a module of the same name imported after it: run
    the command from the project's folder, not from a folder others can write to."""
    if argv is None:
        _users_folder_first()
    args = _parser().parse_args(argv)
    configure_logging(level=args.log_level, json=args.log_json)
    _freeze_startup_objects()
    return _guarded(args.func, args)


def consume_main(handler: Handler, argv: Sequence[str] | None = None, *, prog: str = "consumer") -> int:
    """Run ``handler`` as a consumer with ``unilog consume``'s options (``--name`` etc.), for apps' own entry points.

    ``python -m myapp.consumer --name totals`` can be one line: ``sys.exit(consume_main(handle))``.
    """
    parser = argparse.ArgumentParser(prog=prog)
    common_args(parser)
    consume.consume_args(parser)
    args = parser.parse_args(argv)
    configure_logging(level=args.log_level, json=args.log_json)
    _freeze_startup_objects()
    from .consuming import run_consumer

    return _guarded(lambda a: run_consumer(a, handler), args)


def _users_folder_first() -> None:
    """The working directory first on ``sys.path``, where ``python -m unilog`` has it (and uvicorn's and gunicorn's
    commands put theirs): the user's modules, and the top-level modules they import themselves (a flat layout's
    ``pricing.py`` beside ``shop/``), are found through the installed console script as through ``python -m``. The
    command's entry point only: the library never touches the path (tests/test_architecture.py)."""
    here = os.getcwd()
    # not under `python -P` / PYTHONSAFEPATH (or -I): the user asked for no such entry
    if here not in sys.path and "" not in sys.path and not sys.flags.safe_path:
        sys.path.insert(0, here)


def _freeze_startup_objects() -> None:
    """Move everything imported so far out of the cyclic collector's reach. A batch holds thousands of short-lived
    records (the WAL streamer one object each), and the full collections they trigger would otherwise walk the
    process's hundreds of thousands of long-lived import-time objects again and again: about a fifth of a WAL
    streamer's CPU (bench/RESULTS.md, issue 26)."""
    gc.freeze()


def _guarded(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a command, mapping errors to one line on stderr and a named exit code (an optional package that is not
    installed: the extra that installs it, :attr:`ExitCode.CONFIG`)."""
    try:
        return int(func(args))
    except ModuleNotFoundError as exc:
        command = getattr(args, "command", None) or ""
        # only a command with optional packages: elsewhere (an application's code a consumer runs) it is not unilog's
        error = None
        if command in _COMMAND_EXTRAS:
            error = extras.missing(exc, _COMMAND_EXTRAS[command], f"unilog {command}")
        if error is None:
            raise  # no extra installs it: a bug or a broken install, where the traceback is the report
        return _refused(error)
    except InjectedCrash as exc:
        print(f"unilog: {exc}", file=sys.stderr)
        return ExitCode.CRASHED
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except UnilogError as exc:
        return _refused(exc)
    except Exception as exc:
        refusal = _server_refusal(exc)
        if refusal is None:
            raise
        return _refused(refusal)


def _server_refusal(exc: Exception) -> UnilogError | None:
    """The one line for a server's refusal no retry can fix, raised outside a worker's loop (burst mode), else None.

    Only an exception of redis-py's or psycopg's (or a subclass) can be one: anything else is told without importing
    the runtime, which a command that uses neither (``unilog acl``) never imports (issue 45)."""
    if not any(cls.__module__.partition(".")[0] in ("redis", "psycopg") for cls in type(exc).__mro__):
        return None
    from ..runtime import FATAL, fatal

    return (fatal(exc) or UnilogError(str(exc))) if isinstance(exc, FATAL) else None


def _refused(exc: UnilogError) -> int:
    code = next(c for t, c in _ERROR_CODES if isinstance(exc, t))
    print(f"unilog: error: {exc}", file=sys.stderr)
    return code


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="unilog", description="Transactional outbox / unified log over Redis Streams")
    parser.add_argument("--version", action="version", version=f"unilog {__version__}")
    common_args(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in _COMMANDS:
        module.add(sub)
    for plugin in entry_points(group=PLUGIN_GROUP):
        _add_plugin(sub, plugin)
    return parser


def _add_plugin(sub: Any, plugin: EntryPoint) -> None:
    """Let ``plugin`` add its command; if it cannot, add a stand-in that says why when that command is run."""
    if plugin.name in sub.choices:
        return  # one distribution installed twice (an editable install beside a wheel): the first one wins
    try:
        plugin.load()(sub)
    except Exception as exc:  # any failure of someone else's code: the other commands must keep working
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        extra = plugin.dist.name if plugin.dist is not None else "the package that provides it"
        message = f"the {plugin.name!r} command cannot be loaded ({reason}); is {extra!r} installed with its extra?"
        if plugin.value.startswith("unilog_demo."):
            message = f"the {plugin.name!r} command needs the demo extra: {extras.install('demo')} ({reason})"
        # no option prefix: whatever follows the command name is taken, so running it reaches the one-line error
        stand_in = sub.add_parser(
            plugin.name, help="(unavailable: run it to see why)", add_help=False, prefix_chars="\0"
        )
        stand_in.add_argument("rest", nargs="*")
        stand_in.set_defaults(func=_unavailable(message))


def _unavailable(message: str) -> Callable[[argparse.Namespace], int]:
    def refuse(_args: argparse.Namespace) -> int:
        raise ConfigurationError(message)

    return refuse
