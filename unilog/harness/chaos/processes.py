"""The chaos fleet's process entry points: ``python -m unilog.harness.chaos produce | streamer | consume | spark``
(and the backfill step's ``update | backfill``, in :mod:`unilog.harness.chaos.mirror`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import structlog

from unilog.errors import ConfigurationError, UnilogError
from unilog.ops.admin import load_handler, load_object

from ..app import App
from .entry import stop_event, wrapper_args
from .history import HistoryWriter
from .mirror import backfill_main, update_main
from .producer import ChaosProducer
from .tracking import tracked, tracked_spark_effect

log = structlog.get_logger(__name__)


def produce_main(argv: Sequence[str] | None = None) -> int:
    """``python -m unilog.harness.chaos produce``: a :class:`ChaosProducer` on ``$DATABASE_URL`` until SIGTERM."""
    from unilog.config import postgres_conninfo
    from unilog.log import configure_logging

    parser = argparse.ArgumentParser(prog="python -m unilog.harness.chaos produce")
    parser.add_argument("--app", required=True, help="module:object, the app's description (an App)")
    parser.add_argument("--name", required=True)
    parser.add_argument("--history", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rate", type=float, default=6.0, help="transactions per second")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--max-hold", type=float, default=1.5)
    parser.add_argument("--rollback", type=float, default=0.15)
    parser.add_argument("--poison", type=float, default=0.01)
    parser.add_argument("--max-records", type=int, default=3)
    parser.add_argument("--stream", help="default: the app's")
    args = parser.parse_args(argv)
    configure_logging(json=True)
    stop = stop_event()
    history = HistoryWriter(args.history, args.name)
    producer = ChaosProducer(
        _load_app(args.app),
        postgres_conninfo(os.environ.get("DATABASE_URL", "")),
        history,
        name=args.name,
        seed=args.seed,
        rate=args.rate,
        connections=args.connections,
        max_hold=args.max_hold,
        rollback=args.rollback,
        poison=args.poison,
        max_records=args.max_records,
        stream=args.stream,
    )
    log.info("chaos producer started", producer=args.name, rate=args.rate)
    producer.run(stop)
    history.close()
    return 0


def streamer_main(argv: Sequence[str] | None = None) -> int:
    """``python -m unilog.harness.chaos streamer [--seed-base N --incarnations FILE] STREAMER-OPTIONS``."""
    from unilog.cli import main

    _args, rest = wrapper_args("python -m unilog.harness.chaos streamer", argv)
    return main(["--log-json", "streamer", *rest])


def consume_main(argv: Sequence[str] | None = None) -> int:
    """``python -m unilog.harness.chaos consume --handler REF [--fail-poison] CONSUME-OPTIONS``: ``unilog consume``
    with the handler wrapped by :func:`~unilog.harness.chaos.tracking.tracked`."""
    from unilog import cli

    args, rest = wrapper_args("python -m unilog.harness.chaos consume", argv)
    try:
        if not args.handler:
            raise ConfigurationError("give --handler module:function, the handler under test")
        handler = load_handler(args.handler)
    except UnilogError as exc:
        print(f"unilog: error: {exc}", file=sys.stderr)
        return cli.ExitCode.HANDLER
    wrapped = tracked(handler, fail_poison=args.fail_poison)
    return cli.consume_main(wrapped, rest, prog="python -m unilog.harness.chaos consume")


def spark_main(argv: Sequence[str] | None = None) -> int:
    """``python -m unilog.harness.chaos spark NAME --app REF --checkpoint DIR``: the app's Spark consumer with its
    effect wrapped by :func:`~unilog.harness.chaos.tracking.tracked_spark_effect` (and, like the app's, registered for
    retention by its sink)."""
    from unilog.cli import ExitCode
    from unilog.log import configure_logging
    from unilog.spark import TransactionalSink, spark_session

    parser = argparse.ArgumentParser(prog="python -m unilog.harness.chaos spark")
    parser.add_argument("name")
    parser.add_argument("--app", required=True, help="module:object, the app's description (an App)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--checkpoint", required=True)
    args = parser.parse_args(argv)
    configure_logging(json=True)
    app = _load_app(args.app)
    assert app.spark_effect is not None, f"{app.name} has no Spark consumer"
    database_url, redis_url = os.environ["DATABASE_URL"], os.environ["REDIS_URL"]
    effect = tracked_spark_effect(args.name, load_object(app.module(app.spark_effect))(args.name))
    spark = spark_session(f"unilog-chaos-{args.name}", args.master, {"spark.sql.shuffle.partitions": "1"})
    stream = (
        spark.readStream.format("unilog")
        .option("redisUrl", redis_url)
        .option("stream", app.stream)
        .option("databaseUrl", database_url)
        .option("consumer", args.name)
        .option("maxEntriesPerBatch", "20000")
        .load()
    )
    sink = TransactionalSink(database_url, args.name, app.stream, effect, redis_url=redis_url)
    query = (
        stream.writeStream.foreachBatch(sink)
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    stop = stop_event()
    log.info("chaos spark consumer started", consumer=args.name)
    while query.isActive and not stop.wait(0.5):
        pass
    if query.isActive:
        query.stop()
    failure = query.exception()
    spark.stop()
    if failure is not None:
        text = str(failure)
        reason = next((line for line in text.splitlines() if line.startswith("unilog.errors.")), text[:300])
        print(f"unilog: error: spark consumer {args.name}: {reason.strip()}", file=sys.stderr)
        return ExitCode.DATA_LOSS if "StreamGap" in text else ExitCode.FAILURE
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"produce": produce_main, "streamer": streamer_main, "consume": consume_main, "spark": spark_main}
    commands |= {"update": update_main, "backfill": backfill_main}  # the backfill step (mirror.py)
    if not argv or argv[0] not in commands:
        print(
            f"usage: python -m unilog.harness.chaos {{{'|'.join(commands)}}} ... (the runner is `unilog chaos`)",
            file=sys.stderr,
        )
        return 2
    return commands[argv[0]](argv[1:])


def _load_app(ref: str) -> App:
    app = load_object(ref)
    if not isinstance(app, App):
        raise ConfigurationError(f"{ref!r} is not an unilog.harness.app.App")
    return app
