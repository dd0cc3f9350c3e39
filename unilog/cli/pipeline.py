"""``unilog reconcile`` and ``unilog archive``: the data pipeline on Spark."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from ..errors import ConfigurationError
from .common import ExitCode, connection_args, positive_int, settings_from, spark_args


def _spark(args: argparse.Namespace, app: str) -> Any:
    from ..spark import spark_session

    conf = dict(item.split("=", 1) for item in args.conf)
    return spark_session(app, args.master, conf)


def cmd_reconcile(args: argparse.Namespace) -> int:
    from ..consume.records import load_object
    from ..spark.reconcile import reconcile

    settings = settings_from(args)
    if not args.model:
        raise ConfigurationError(
            "give --model package.module:object, the reconcile model of your app (the demo's is "
            "unilog_demo.reconcile:model), or set UNILOG_RECONCILE_MODEL"
        )
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

    from ..spark.archive import archive

    settings = settings_from(args)
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


def add(sub: Any) -> None:
    """Add this module's commands to the ``unilog`` sub-parsers."""
    p = sub.add_parser("reconcile", help="on Spark: compare consumers with canonical totals; --repair resets them")
    p.add_argument(
        "--model",
        default=os.environ.get("UNILOG_RECONCILE_MODEL"),
        help="package.module:object, what to aggregate (see unilog.spark.reconcile; default: $UNILOG_RECONCILE_MODEL)",
    )
    p.add_argument("--stream", help="default: $UNILOG_STREAM")
    p.add_argument("--repair", action="store_true", help="reset each diverged consumer's state and checkpoint")
    p.add_argument("--slices", type=positive_int, default=8, help="parallel id ranges to read the source table in")
    spark_args(p)
    p.add_argument("--json", action="store_true")
    connection_args(p)
    p.set_defaults(func=cmd_reconcile)

    p = sub.add_parser("archive", help="on Spark: append the log to Parquet (by date) behind the archiver's checkpoint")
    p.add_argument("--path", required=True, help="archive folder (any path Spark can write: local, HDFS, S3...)")
    p.add_argument("--stream", help="default: $UNILOG_STREAM")
    p.add_argument("--every", type=float, help="keep archiving every N seconds (default: once)")
    spark_args(p)
    connection_args(p)
    p.set_defaults(func=cmd_archive)
