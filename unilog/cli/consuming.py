"""``unilog consume``'s work once its arguments are parsed: check them, prepare the start, run the worker (or N
worker processes). Imported when the command runs, not when the parser is built (:mod:`unilog.cli.consume`)."""

from __future__ import annotations

import argparse
import inspect
import os
import signal
import sys
from typing import Any

from ..config import Settings
from ..consume.records import Handler
from ..consume.settings import from_arguments
from ..errors import ConfigurationError
from .common import ExitCode, faults_from, run_until_signalled, serve_metrics, settings_from
from .starting import check_options, child_environment, prepare_start


def run_consumer(args: argparse.Namespace, handler: Handler) -> int:
    """Run one worker in the mode the flags pick (checkpoint, group or partitioned), or N worker processes.

    Options that contradict each other are refused first; a new consumer or group starts where ``--from`` says and
    says how much of the retained stream it will replay (:mod:`unilog.cli.starting`). A long-running worker (not
    ``--once``) waits there for a server that cannot be reached yet, as its loop does."""
    check_options(args)
    settings = settings_from(args)
    _config(args)  # every name and setting checked before anything touches a server (prepare_start may create)
    if args.workers == 1:
        serve_metrics(args)  # /readyz answers (not ready) while the start waits for a server
    prepare_start(args, settings)
    if args.workers > 1:
        return _run_workers(args)
    if inspect.iscoroutinefunction(handler):
        return _run_async(args, settings, handler)
    worker = _make_worker(args, settings, handler)
    with worker:
        if args.once:
            count = worker.drain()
            print(f"unilog: consumer {args.group or args.name} handled {count} records")
            return ExitCode.OK
        run_until_signalled(worker.run)
    return ExitCode.OK


def _run_async(args: argparse.Namespace, settings: Settings, handler: Any) -> int:
    """An ``async def`` handler: an asyncio worker of the kind the flags pick (:class:`~unilog.AsyncConsumer`,
    :class:`~unilog.AsyncGroupConsumer`, :class:`~unilog.AsyncPartitionedConsumer`) in its own event loop; SIGTERM
    and SIGINT set its stop event, so the batch in progress finishes and commits."""
    import asyncio

    from ..consume.consumer import AsyncConsumer

    consumer: Any
    if args.partitioned:
        from ..consume.partitions import AsyncPartitionedConsumer

        consumer = AsyncPartitionedConsumer(settings, _config(args), handler, faults=faults_from(args))
    elif args.group:
        from ..consume.group import AsyncGroupConsumer

        consumer = AsyncGroupConsumer(
            settings, _group_config(args, not args.exit_on_crash), handler, faults=faults_from(args)
        )
    elif not args.name:
        raise ConfigurationError("give --name NAME (a checkpoint consumer) or --group GROUP")
    else:
        config = _checkpoint_config(args, not args.exit_on_crash)
        if config.several:
            from ..consume.consumer import AsyncMultiConsumer

            consumer = AsyncMultiConsumer(settings, config, handler, faults=faults_from(args))
        else:
            consumer = AsyncConsumer(settings, config, handler, faults=faults_from(args))

    async def main() -> int:
        async with consumer:
            if args.once:
                return await consumer.drain()
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, stop.set)
            await consumer.run(stop)
            return consumer.handled_total

    count = asyncio.run(main())
    if args.once:
        print(f"unilog: consumer {args.group or args.name} handled {count} records")
    return ExitCode.OK


def _make_worker(args: argparse.Namespace, settings: Settings, handler: Handler) -> Any:
    from ..consume.consumer import Consumer, MultiConsumer
    from ..consume.group import GroupConsumer
    from ..consume.partitions import PartitionedConsumer

    config = _config(args)
    if args.group:
        return GroupConsumer(settings, config, handler, faults=faults_from(args))
    if args.partitioned:
        return PartitionedConsumer(settings, config, handler, faults=faults_from(args))
    if config.several:
        return MultiConsumer(settings, config, handler, faults=faults_from(args))
    return Consumer(settings, config, handler, faults=faults_from(args))


def _config(args: argparse.Namespace) -> Any:
    """The config of the kind the flags pick, built (so checked, in one line) from the command line; no I/O."""
    if args.group:
        return _group_config(args, not args.exit_on_crash)
    if not args.name:
        raise ConfigurationError("give --name NAME (a checkpoint or partitioned consumer) or --group GROUP")
    crash_restart = {"restart_after_crash": not args.exit_on_crash}
    if args.partitioned:
        return from_arguments("partitioned", args, name=args.name, worker=args.worker or "", **crash_restart)
    return from_arguments("checkpoint", args, name=args.name, **crash_restart)


def _group_config(args: argparse.Namespace, crash_restart: bool) -> Any:
    return from_arguments("group", args, group=args.group, worker=args.worker or "", restart_after_crash=crash_restart)


def _checkpoint_config(args: argparse.Namespace, crash_restart: bool) -> Any:
    return from_arguments("checkpoint", args, name=args.name, restart_after_crash=crash_restart)


def _run_workers(args: argparse.Namespace) -> int:
    """Start ``--workers`` copies of this command as separate processes; forward SIGTERM; wait for all."""
    import subprocess

    argv = list(sys.orig_argv[1:])  # the interpreter's own arguments too (`-m unilog`, `-m services.consumer`)
    i = argv.index("--workers")
    del argv[i : i + 2]
    base = args.worker or f"{os.uname().nodename}-{os.getpid()}"
    env = child_environment()  # this process placed a new group already (--from): its workers go on from there
    procs = [
        subprocess.Popen([sys.executable, *argv, *_child_args(args, n), "--worker", f"{base}-{n}"], env=env)
        for n in range(args.workers)
    ]

    def _forward(signum: int, _frame: Any) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, _forward)
    signal.signal(signal.SIGINT, _forward)
    codes = [proc.wait() for proc in procs]
    return max(codes)


def _child_args(args: argparse.Namespace, n: int) -> list[str]:
    """Worker ``n``'s own metrics port: the given one plus ``n`` (each process serves its own metrics)."""
    return [] if args.metrics_port is None else ["--metrics-port", str(args.metrics_port + n)]
