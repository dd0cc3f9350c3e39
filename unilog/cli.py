"""The ``unilog`` command: the process entry point.

This is the only place that reads the environment, configures logging and installs signal handlers. Failures the
user can fix (bad configuration, unreachable server, missing migrations) end in one line on stderr and a named
exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from enum import IntEnum
from pathlib import Path
from typing import Any, cast

from . import __version__
from .config import Settings
from .consumer import Handler
from .errors import (
    ConfigurationError,
    DataLoss,
    HandlerNotFound,
    InjectedCrash,
    SchemaMissing,
    ServerUnreachable,
    UnilogError,
)
from .faults import FaultConfig, Faults
from .log import configure_logging
from .streamer import StreamerConfig


class ExitCode(IntEnum):
    """Exit codes of the ``unilog`` command."""

    OK = 0
    FAILURE = 1  # an unexpected error, or a check that failed (e.g. the demo's verdict)
    USAGE = 2  # bad command-line arguments (argparse's own code)
    CONFIG = 3  # a setting is missing or malformed
    UNREACHABLE = 4  # Postgres or Redis cannot be reached
    SCHEMA = 5  # the database is not migrated
    HANDLER = 6  # the consumer's handler cannot be imported
    CRASHED = 7  # an injected crash with in-process restart disabled
    DATA_LOSS = 8  # a consumer found entries missing from the stream (trimmed past it, or Redis lost data)
    INTERRUPTED = 130  # Ctrl-C


_ERROR_CODES: list[tuple[type[BaseException], ExitCode]] = [
    (DataLoss, ExitCode.DATA_LOSS),
    (HandlerNotFound, ExitCode.HANDLER),
    (ConfigurationError, ExitCode.CONFIG),
    (ServerUnreachable, ExitCode.UNREACHABLE),
    (SchemaMissing, ExitCode.SCHEMA),
    (UnilogError, ExitCode.FAILURE),
]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``unilog`` command; return its exit code."""
    args = _parser().parse_args(argv)
    configure_logging(level=args.log_level, json=args.log_json)
    return _guarded(args.func, args)


def consume_main(handler: Handler, argv: Sequence[str] | None = None, *, prog: str = "consumer") -> int:
    """Run ``handler`` as a consumer with ``unilog consume``'s options (``--name`` etc.), for apps' own entry points.

    ``python -m myapp.consumer --name totals`` can be one line: ``sys.exit(consume_main(handle))``.
    """
    parser = argparse.ArgumentParser(prog=prog)
    _common_args(parser)
    _consume_args(parser)
    args = parser.parse_args(argv)
    configure_logging(level=args.log_level, json=args.log_json)
    return _guarded(lambda a: _consume(a, handler), args)


def _guarded(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a command, mapping errors to one line on stderr and a named exit code."""
    try:
        return int(func(args))
    except InjectedCrash as exc:
        print(f"unilog: {exc}", file=sys.stderr)
        return ExitCode.CRASHED
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except UnilogError as exc:
        code = next(c for t, c in _ERROR_CODES if isinstance(exc, t))
        print(f"unilog: error: {exc}", file=sys.stderr)
        return code


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


# -- commands ---------------------------------------------------------------------------------------------------------


def _settings(args: argparse.Namespace) -> Settings:
    return Settings.from_env(
        database_url=getattr(args, "database_url", None),
        redis_url=getattr(args, "redis_url", None),
        stream=getattr(args, "default_stream", None),
    )


def _faults(args: argparse.Namespace) -> Faults:
    spec = args.faults if args.faults is not None else os.environ.get("UNILOG_FAULTS", "")
    seed = args.fault_seed if args.fault_seed is not None else _int_env("UNILOG_FAULT_SEED")
    return Faults(FaultConfig.parse(spec, seed))


def _int_env(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigurationError(f"{name} must be an integer, got {value!r}") from None


def cmd_migrate(args: argparse.Namespace) -> int:
    from .schema import migrate

    url = args.database_url or os.environ.get("DATABASE_URL", "")
    from .config import postgres_conninfo

    postgres_conninfo(url)
    migrate(url, producer_id=args.producer_id)
    print("unilog: database migrated")
    return ExitCode.OK


def cmd_streamer(args: argparse.Namespace) -> int:
    from .streamer import Streamer

    settings = _settings(args)
    config = StreamerConfig(
        batch_size=args.batch_size,
        poll_interval=args.poll_interval,
        streams=tuple(args.streams.split(",")) if args.streams else None,
        restart_after_crash=not args.exit_on_crash,
        retention_interval=args.retention_interval,
        max_len=args.max_len,
        wait_replicas=args.wait_replicas,
        wait_timeout_ms=args.wait_timeout_ms,
    )
    with Streamer(settings, config, faults=_faults(args), name=args.name) as streamer:
        if args.once:
            count = streamer.drain()
            print(f"unilog: streamed {count} records")
            return ExitCode.OK
        _run_until_signalled(streamer.run)
    return ExitCode.OK


def cmd_consume(args: argparse.Namespace) -> int:
    from .consumer import load_handler

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`, find handler modules in the working directory
    return _consume(args, load_handler(args.handler))


def _consume(args: argparse.Namespace, handler: Handler) -> int:
    """Run one worker in the mode the flags pick (checkpoint, group or partitioned), or N worker processes."""
    if args.workers > 1:
        return _run_workers(args)
    settings = _settings(args)
    worker = _make_worker(args, settings, handler)
    with worker:
        if args.once:
            count = worker.drain()
            print(f"unilog: consumer {args.group or args.name} handled {count} records")
            return ExitCode.OK
        _run_until_signalled(worker.run)
    return ExitCode.OK


def _make_worker(args: argparse.Namespace, settings: Settings, handler: Handler) -> Any:
    from .consumer import Consumer, ConsumerConfig
    from .group import GroupConfig, GroupConsumer
    from .partitions import PartitionConfig, PartitionedConsumer

    crash_restart = not args.exit_on_crash
    if args.group:
        config = GroupConfig(
            group=args.group,
            worker=args.worker or "",
            stream=args.stream,
            batch_size=args.batch_size,
            block_ms=args.block_ms,
            claim_idle_ms=args.claim_idle_ms,
            max_deliveries=args.max_deliveries,
            restart_after_crash=crash_restart,
        )
        return GroupConsumer(settings, config, handler, faults=_faults(args))
    if not args.name:
        raise ConfigurationError("give --name NAME (a checkpoint or partitioned consumer) or --group GROUP")
    if args.partitioned:
        part = PartitionConfig(
            name=args.name,
            stream=args.stream,
            worker=args.worker or "",
            batch_size=args.batch_size,
            block_ms=args.block_ms,
            restart_after_crash=crash_restart,
        )
        return PartitionedConsumer(settings, part, handler, faults=_faults(args))
    checkpoint = ConsumerConfig(
        name=args.name,
        stream=args.stream,
        batch_size=args.batch_size,
        block_ms=args.block_ms,
        restart_after_crash=crash_restart,
    )
    return Consumer(settings, checkpoint, handler, faults=_faults(args))


def _run_workers(args: argparse.Namespace) -> int:
    """Start ``--workers`` copies of this command as separate processes; forward SIGTERM; wait for all."""
    import subprocess

    argv = list(sys.orig_argv[1:])  # the interpreter's own arguments too (`-m unilog`, `-m services.consumer`)
    i = argv.index("--workers")
    del argv[i : i + 2]
    base = args.worker or f"{os.uname().nodename}-{os.getpid()}"
    procs = [subprocess.Popen([sys.executable, *argv, "--worker", f"{base}-{n}"]) for n in range(args.workers)]

    def _forward(signum: int, _frame: Any) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, _forward)
    signal.signal(signal.SIGINT, _forward)
    codes = [proc.wait() for proc in procs]
    return max(codes)


def cmd_consumer_register(args: argparse.Namespace) -> int:
    settings = _settings(args)
    stream = args.stream or settings.stream
    api = _redis_api(settings)
    try:
        current = api.registered(stream).get(args.name)
        if current is None:
            api.register(stream, args.name, "0-0")
    finally:
        api.close()
    print(f"unilog: consumer {args.name} registered on {stream} at {current or 'the beginning'}")
    return ExitCode.OK


def cmd_consumer_unregister(args: argparse.Namespace) -> int:
    from . import engine

    settings = _settings(args)
    stream = args.stream or settings.stream
    client = engine.connect(settings.redis_url)
    try:
        engine.ping(client, settings.redis_url)
        found = engine.RedisStreams(client).unregister(stream, args.name)
    finally:
        client.close()
    print(f"unilog: consumer {args.name} {'unregistered from' if found else 'was not registered on'} {stream}")
    return ExitCode.OK


def _redis_api(settings: Settings) -> Any:
    from . import engine

    client = engine.connect(settings.redis_url)
    engine.ping(client, settings.redis_url)
    return engine.RedisStreams(client)


def _checkpoint_stream(conn: Any, name: str, default: str) -> str:
    row = conn.execute("SELECT stream FROM unilog_checkpoints WHERE name = %s", (name,)).fetchone()
    return row[0] if row else default


def cmd_consumer_reset(args: argparse.Namespace) -> int:
    from . import store
    from .consumer import reset_checkpoint

    settings = _settings(args)
    api = _redis_api(settings)
    with store.connect(settings.conninfo) as conn:
        store.check_schema(conn)
        stream = args.stream or _checkpoint_stream(conn, args.name, settings.stream)
        cp = reset_checkpoint(conn, api, args.name, stream, args.to)
    api.close()
    print(f"unilog: consumer {args.name} on {stream} reset to {args.to} (last id {cp.last_id})")
    return ExitCode.OK


def cmd_consumer_rebuild(args: argparse.Namespace) -> int:
    from . import store
    from .consumer import Consumer, ConsumerConfig, load_handler, reset_checkpoint

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    handler, reset_state = load_handler(args.handler), cast(Any, load_handler(args.reset_state))
    settings = _settings(args)
    api = _redis_api(settings)
    with store.connect(settings.conninfo) as conn:
        store.check_schema(conn)
        stream = args.stream or _checkpoint_stream(conn, args.name, settings.stream)
        reset_checkpoint(conn, api, args.name, stream, "beginning", reset_state=reset_state)
    api.close()
    config = ConsumerConfig(name=args.name, stream=stream, strict_start=True)
    with Consumer(settings, config, handler) as consumer:
        count = consumer.drain()
    print(f"unilog: consumer {args.name} rebuilt from the retained log of {stream}: {count} records applied")
    return ExitCode.OK


def cmd_dlq(args: argparse.Namespace) -> int:
    from . import dlq, store

    settings = _settings(args)
    stream = args.stream or settings.stream
    api = _redis_api(settings)
    try:
        if args.dlq_command == "list":
            letters = [d.summary() for d in dlq.list_letters(api, stream, args.group)]
            print(json.dumps(letters, indent=2) if args.json else _letters_table(letters))
        elif args.dlq_command == "show":
            letter = dlq.get_letter(api, stream, args.id)
            print(json.dumps({**letter.summary(), "at_ms": letter.at_ms, "fields": letter.fields}, indent=2))
        elif args.dlq_command == "replay":
            if not args.id and not args.all:
                raise ConfigurationError("give a dead letter id, or --all")
            targets = dlq.list_letters(api, stream, args.group) if args.all else [dlq.get_letter(api, stream, args.id)]
            for letter in targets:
                print(f"unilog: dead letter {letter.id} replayed as {dlq.replay(api, stream, letter)}")
        else:
            letter = dlq.get_letter(api, stream, args.id)
            with store.connect(settings.conninfo) as conn:
                dlq.drop(api, conn, stream, letter)
            print(f"unilog: dead letter {letter.id} dropped")
    finally:
        api.close()
    return ExitCode.OK


def _letters_table(letters: list[dict[str, Any]]) -> str:
    from .status import table

    rows = [[d["id"], d["original_id"], d["group"], d["position"], d["attempts"], d["error"][:60]] for d in letters]
    return "\n".join(table(["id", "original id", "group", "position", "attempts", "error"], rows or [["(none)"] * 6]))


def cmd_stream_partition(args: argparse.Namespace) -> int:
    settings = _settings(args)
    api = _redis_api(settings)
    try:
        api.set_partitions(args.stream, args.count)
    finally:
        api.close()
    print(f"unilog: stream {args.stream} has {args.count} partitions ({args.stream}.p0 .. .p{args.count - 1})")
    return ExitCode.OK


def _spark(args: argparse.Namespace, app: str) -> Any:
    from .spark import spark_session

    conf = dict(item.split("=", 1) for item in args.conf)
    return spark_session(app, args.master, conf)


def cmd_reconcile(args: argparse.Namespace) -> int:
    from .consumer import load_object
    from .reconcile import reconcile

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    settings = _settings(args)
    model = load_object(args.model)
    spark = _spark(args, "unilog-reconcile")
    try:
        report = reconcile(spark, settings, model, stream=args.stream, slices=args.slices, repair=args.repair)
    finally:
        spark.stop()
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(f"canonical at {report.producer} {report.epoch}:{report.last_seq}: {report.canonical}")
        for c in report.consumers:
            verdict = "agrees" if c.agree else ("REPAIRED" if c.repaired else "DIFFERS")
            detail = "" if c.agree else f" (expected {c.expected}, has {c.actual})"
            print(f"  {c.name}: {verdict}{detail}")
    return ExitCode.OK if report.agree else ExitCode.FAILURE


def cmd_archive(args: argparse.Namespace) -> int:
    import time

    from .archive import archive

    settings = _settings(args)
    spark = _spark(args, "unilog-archive")
    try:
        while True:
            count = archive(spark, settings, args.path, stream=args.stream)
            print(f"unilog: archived {count} entries to {args.path}")
            if not args.every:
                return ExitCode.OK
            time.sleep(args.every)
    finally:
        spark.stop()


def cmd_status(args: argparse.Namespace) -> int:
    from .status import collect_status, format_status

    report = collect_status(_settings(args))
    print(json.dumps(report, indent=2) if args.json else format_status(report))
    return ExitCode.OK


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    log_dir = Path(args.log_dir) if args.log_dir else None
    agree = run_demo(
        duration=args.duration, rate=args.rate, seed=args.seed, faults=args.faults, spark=args.spark, log_dir=log_dir
    )
    return ExitCode.OK if agree else ExitCode.FAILURE


def cmd_chaos(args: argparse.Namespace) -> int:
    import shlex
    import tempfile

    from .chaos import DEFAULT_HANDLER, ChaosConfig, FaultRates, build_schedule, print_schedule, run_chaos
    from .fleet import ProcessSpec

    defaults = FaultRates()
    rates = FaultRates(
        kill=defaults.kill if args.kill_rate is None else args.kill_rate,
        pause=defaults.pause if args.pause_rate is None else args.pause_rate,
        redis_restart=defaults.redis_restart if args.server_faults else 0.0,
        postgres_restart=defaults.postgres_restart if args.server_faults else 0.0,
        redis_pause=defaults.redis_pause if args.server_faults else 0.0,
        network=defaults.network if args.network_faults else 0.0,
    )
    if args.schedule_only:  # the schedule the seed gives with the default fleet and embedded servers
        from .chaos import fleet_specs

        sample = ChaosConfig(seed=args.seed, spark=args.spark)
        names = [s.name for s in fleet_specs(sample, api_port=0, history_dir=Path(), state_dir=Path())]
        servers = [s for s, url in (("postgres", args.database_url), ("redis", args.redis_url)) if not url]
        print_schedule(build_schedule(args.seed, args.duration, names, rates, servers=servers))
        return ExitCode.OK
    log_dir = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix=f"unilog-chaos-{args.seed}-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    # the runner's own logs (supervisor, proxies) go to a file, so the terminal shows the live lines and the summary
    configure_logging(level=args.log_level, json=True, stream=open(log_dir / "runner.log", "a"))  # noqa: SIM115
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    config = ChaosConfig(
        duration=args.duration,
        seed=args.seed,
        database_url=args.database_url,
        redis_url=args.redis_url,
        handler=args.handler or DEFAULT_HANDLER,
        rate=args.rate,
        producer_rate=args.producer_rate,
        faults=rates,
        library_faults=args.library_faults,
        quiesce_timeout=args.quiesce_timeout,
        log_dir=log_dir,
        keep_logs=None if args.log_dir else False,
        report_path=Path(args.report) if args.report else None,
        extra_processes=[ProcessSpec(f"extra{i}", shlex.split(cmd)) for i, cmd in enumerate(args.extra_process or [])],
        extra_consumers=args.extra_consumer or [],
        spark=args.spark,
    )
    result = run_chaos(config, stop=stop)
    return ExitCode.OK if result.verdict.ok else ExitCode.FAILURE  # 1: the checker found a violation


def _run_until_signalled(loop: Callable[[threading.Event], None]) -> None:
    """Run ``loop(stop_event)``; SIGTERM and SIGINT set the event, so the current batch finishes and we exit 0."""
    stop = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    loop(stop)


# -- argument parsing -------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="unilog", description="Transactional outbox / unified log over Redis Streams")
    parser.add_argument("--version", action="version", version=f"unilog {__version__}")
    _common_args(parser)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("migrate", help="apply unilog's migrations to DATABASE_URL")
    p.add_argument("--database-url", help="default: $DATABASE_URL")
    p.add_argument("--producer-id", help="set this database's producer id (default: a random one at first migrate)")
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("streamer", help="stream staged records into Redis")
    _connection_args(p)
    p.add_argument("--once", action="store_true", help="drain everything visible, then exit")
    p.add_argument("--batch-size", type=_positive_int, default=StreamerConfig.batch_size, help="default %(default)s")
    p.add_argument("--poll-interval", type=float, default=1.0, help="seconds between polls without notifications")
    p.add_argument("--streams", help="comma-separated target streams this streamer publishes (default: all)")
    p.add_argument("--name", default="streamer", help="name in logs and pg_stat_activity")
    p.add_argument(
        "--retention-interval", type=float, default=5.0, help="seconds between trims behind registered consumers"
    )
    p.add_argument("--max-len", type=_positive_int, help="hard cap on stream length (may trim past slow consumers)")
    p.add_argument("--wait-replicas", type=int, default=0, help="WAIT for this many replicas before deleting")
    p.add_argument("--wait-timeout-ms", type=_positive_int, default=1000)
    _fault_args(p)
    p.set_defaults(func=cmd_streamer)

    p = sub.add_parser("consumer", help="manage checkpoint consumers")
    consumer_sub = p.add_subparsers(dest="consumer_command", required=True)
    q = consumer_sub.add_parser("reset", help="move a consumer's checkpoint (it re-applies or skips from there)")
    q.add_argument("name")
    q.add_argument("--to", required=True, help="beginning, end, or a stream entry id")
    q.add_argument("--stream", help="default: the checkpoint's stream, else $UNILOG_STREAM")
    _connection_args(q)
    q.set_defaults(func=cmd_consumer_reset)
    q = consumer_sub.add_parser("rebuild", help="clear a consumer's state and replay the retained log into it")
    q.add_argument("name")
    q.add_argument("handler", help="package.module:function, the consumer's handler")
    q.add_argument("--reset-state", required=True, help="package.module:function(conn, name) clearing its state")
    q.add_argument("--stream", help="default: the checkpoint's stream, else $UNILOG_STREAM")
    _connection_args(q)
    q.set_defaults(func=cmd_consumer_rebuild)
    q = consumer_sub.add_parser("register", help="declare a consumer before it first runs, so retention waits for it")
    q.add_argument("name")
    q.add_argument("--stream", help="default: $UNILOG_STREAM")
    _connection_args(q)
    q.set_defaults(func=cmd_consumer_register)
    q = consumer_sub.add_parser("unregister", help="stop a consumer from holding back trimming")
    q.add_argument("name")
    q.add_argument("--stream", help="default: $UNILOG_STREAM")
    _connection_args(q)
    q.set_defaults(func=cmd_consumer_unregister)

    p = sub.add_parser("consume", help="run a checkpoint consumer: HANDLER is package.module:function")
    p.add_argument("handler")
    _consume_args(p)
    p.set_defaults(func=cmd_consume)

    p = sub.add_parser("dlq", help="dead letters of consumer groups: list, show, replay, drop")
    dlq_sub = p.add_subparsers(dest="dlq_command", required=True)
    for verb, text in (
        ("list", "list dead letters"),
        ("show", "show one"),
        ("replay", "re-append to the stream"),
        ("drop", "give up on it for good"),
    ):
        q = dlq_sub.add_parser(verb, help=text)
        if verb != "list":
            q.add_argument("id", nargs="?" if verb == "replay" else None, help="dead letter id")
        if verb == "replay":
            q.add_argument("--all", action="store_true", help="replay every dead letter (of --group)")
        q.add_argument("--group", help="only this group's dead letters")
        q.add_argument("--stream", help="default: $UNILOG_STREAM")
        q.add_argument("--json", action="store_true")
        _connection_args(q)
        q.set_defaults(func=cmd_dlq)

    p = sub.add_parser("stream", help="stream settings")
    stream_sub = p.add_subparsers(dest="stream_command", required=True)
    q = stream_sub.add_parser("partition", help="split a stream into N partitions by record key (once)")
    q.add_argument("stream")
    q.add_argument("count", type=_positive_int)
    _connection_args(q)
    q.set_defaults(func=cmd_stream_partition)

    p = sub.add_parser("reconcile", help="on Spark: compare consumers with canonical totals; --repair resets them")
    p.add_argument("--model", default="services.reconcile:model", help="package.module:object (see unilog.reconcile)")
    p.add_argument("--stream", help="default: $UNILOG_STREAM")
    p.add_argument("--repair", action="store_true", help="reset each diverged consumer's state and checkpoint")
    p.add_argument("--slices", type=_positive_int, default=8, help="parallel id ranges to read the source table in")
    _spark_args(p)
    p.add_argument("--json", action="store_true")
    _connection_args(p)
    p.set_defaults(func=cmd_reconcile)

    p = sub.add_parser("archive", help="on Spark: append the log to Parquet (by date) behind the archiver's checkpoint")
    p.add_argument("--path", required=True, help="archive folder (any path Spark can write: local, HDFS, S3...)")
    p.add_argument("--stream", help="default: $UNILOG_STREAM")
    p.add_argument("--every", type=float, help="keep archiving every N seconds (default: once)")
    _spark_args(p)
    _connection_args(p)
    p.set_defaults(func=cmd_archive)

    p = sub.add_parser("status", help="streams, staged backlog and consumer lag")
    _connection_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("demo", help="run the Rocket Rides fleet on embedded Postgres and Redis, with a verdict")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of traffic before the verdict")
    p.add_argument("--rate", type=float, default=50.0, help="rides per second from the simulator")
    p.add_argument("--seed", type=int, default=None, help="seed for the simulator and the fault schedule")
    p.add_argument(
        "--faults", action=argparse.BooleanOptionalAction, default=True, help="inject the reference's 10%% faults"
    )
    p.add_argument("--log-dir", help="keep every process's log here (default: a temporary folder)")
    p.add_argument(
        "--spark",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the Spark consumer too (default: when pyspark and Java are installed)",
    )
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "chaos", help="run the whole system under a seeded schedule of faults, then check it Jepsen-style"
    )
    p.add_argument("--duration", type=float, default=60.0, help="seconds of faults before healing and checking")
    p.add_argument("--seed", type=int, default=1, help="the fault schedule's seed (same seed, same schedule)")
    p.add_argument("--report", help="write the JSON report here (default: ./chaos-report-SEED.json)")
    p.add_argument("--database-url", help="a throw-away Postgres to use instead of an embedded one")
    p.add_argument("--redis-url", help="a throw-away Redis to use instead of an embedded one")
    p.add_argument("--handler", help="module:function, the consumer handler under test (default: the demo's)")
    p.add_argument("--rate", type=float, default=20.0, help="API rides per second from the simulator")
    p.add_argument("--producer-rate", type=float, default=6.0, help="transactions per second per direct producer")
    p.add_argument("--kill-rate", type=float, help="process SIGKILLs per minute (default 15)")
    p.add_argument("--pause-rate", type=float, help="process SIGSTOP/SIGCONT pauses per minute (default 5)")
    p.add_argument(
        "--server-faults",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Redis restarts and pauses, Postgres immediate restarts",
    )
    p.add_argument(
        "--network-faults",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="resets, cuts, blackholes and dropped replies through the fault proxies",
    )
    p.add_argument(
        "--library-faults",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="double-sends and crashes between steps inside the processes",
    )
    p.add_argument("--quiesce-timeout", type=float, default=180.0, help="seconds to wait for the system to settle")
    p.add_argument(
        "--log-dir",
        help="keep every process's log and the histories here (default: a temporary folder, "
        "kept only when the verdict fails)",
    )
    p.add_argument(
        "--extra-process",
        action="append",
        help="another fleet process (a command line), e.g. a Spark consumer; repeatable",
    )
    p.add_argument(
        "--extra-consumer",
        action="append",
        help="a consumer name an extra process records in chaos_applied; repeatable",
    )
    p.add_argument(
        "--spark",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the Spark distance consumer too (default: when pyspark and Java are installed)",
    )
    p.add_argument("--schedule-only", action="store_true", help="print the seed's fault schedule and exit")
    p.set_defaults(func=cmd_chaos)
    return parser


def _common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", default=os.environ.get("UNILOG_LOG_LEVEL", "info"))
    p.add_argument(
        "--log-json", action=argparse.BooleanOptionalAction, default=None, help="JSON logs (default: when not a TTY)"
    )


def _consume_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", help="the consumer's name: its checkpoint key (prefix, with --partitioned)")
    p.add_argument("--group", help="run as a worker of this consumer group instead of a checkpoint consumer")
    p.add_argument("--partitioned", action="store_true", help="per-key order over a partitioned stream")
    p.add_argument("--worker", help="this worker's name in a group or partitioned consumer (default: host-pid)")
    p.add_argument("--workers", type=_positive_int, default=1, help="run this many worker processes")
    _connection_args(p)
    p.add_argument("--stream", help="stream to read (default: $UNILOG_STREAM)")
    p.add_argument("--once", action="store_true", help="consume everything in the stream, then exit")
    p.add_argument("--batch-size", type=_positive_int, default=1000)
    p.add_argument("--block-ms", type=_positive_int, default=1000)
    p.add_argument("--claim-idle-ms", type=_positive_int, default=30_000, help="group: claim entries idle this long")
    p.add_argument("--max-deliveries", type=_positive_int, default=5, help="group: attempts before dead-lettering")
    _fault_args(p)


def _spark_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--master", default=os.environ.get("SPARK_MASTER", "local[*]"), help="Spark master URL")
    p.add_argument("--conf", action="append", default=[], help="a Spark setting, key=value (repeatable)")


def _connection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database-url", help="default: $DATABASE_URL")
    p.add_argument("--redis-url", help="default: $REDIS_URL")
    p.add_argument("--default-stream", help="default: $UNILOG_STREAM or 'unilog'")


def _fault_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--faults", help="e.g. streamer.double_send=0.1 (default: $UNILOG_FAULTS)")
    p.add_argument("--fault-seed", type=int, help="default: $UNILOG_FAULT_SEED")
    p.add_argument(
        "--exit-on-crash",
        action="store_true",
        help="let an injected crash end the process (default: restart in-process)",
    )


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be at least 1")
    return number
