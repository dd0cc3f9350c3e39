"""``unilog backfill``: stage a record per existing row of a table (:mod:`unilog.produce.backfill`), and its ``status``,
``--resume`` and ``cancel``.

``unilog backfill TABLE --key COLUMN ...`` starts a backfill, or resumes the running one of the same name (by
default ``TABLE.KEY``, plus a digest of ``--where``): running the same command again after a kill goes on from the
last committed page. ``unilog backfill --resume NAME`` resumes by name. A table named ``status`` or ``cancel`` is
given with its schema (``public.status``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ..errors import BackfillRefused
from .common import ExitCode, connection_args, fault_args, faults_from, metrics_args, run_until_signalled, serve_metrics
from .common import settings_from as _settings
from .extras import require

_ACTIONS = ("status", "cancel")
DESCRIPTION = """Stage one record per existing row of TABLE (action backfill, key the key's value as text, data the
row as JSON), in pages of --batch-size rows read in key order, each page one transaction that locks its rows, so
the records order against the application's own changes (docs/guides/backfill.md).

  unilog backfill TABLE --key COLUMN [...]   start it, or resume the running one of the same name
  unilog backfill --resume NAME              resume by name
  unilog backfill status [NAME] [--json]     every backfill: running, stopped, done, cancelled
  unilog backfill cancel NAME                stop it after the page in progress

A table named status or cancel is given with its schema (public.status)."""


def cmd_backfill(args: argparse.Namespace) -> int:
    if args.target == "status":
        return _status(args)
    if args.target == "cancel":
        return _cancel(args)
    return _run(args)


def _status(args: argparse.Namespace) -> int:
    from ..ops.status import format_backfills
    from ..produce.backfill import backfills

    rows = backfills(_settings(args))
    if args.name:
        rows = [r for r in rows if r["name"] == args.name]
    print(json.dumps(rows, indent=2) if args.json else "\n".join(format_backfills(rows)))
    return ExitCode.OK


def _cancel(args: argparse.Namespace) -> int:
    from ..produce.backfill import cancel

    if not args.name:
        raise BackfillRefused("`unilog backfill cancel` needs a NAME (`unilog backfill status` lists them)")
    was_running = cancel(_settings(args), args.name)
    state = "cancelled: its process stops before its next page" if was_running else "had already finished"
    print(f"unilog: backfill {args.name} {state}")
    return ExitCode.OK


def _run(args: argparse.Namespace) -> int:
    from ..produce.backfill import Backfill, BackfillConfig, backfills, start
    from ..runtime.waiting import wait_for_servers

    settings = _settings(args)
    serve_metrics(args)  # /readyz answers (not ready) while the start waits for Postgres
    bar = sys.stderr.isatty() and not args.log_json
    if bar:  # checked before the backfill is created or resumed: a missing package must not leave it stopped
        require(["rich.progress"], "unilog backfill's progress bar on a terminal", hint=" (or --log-json: log lines)")
    if args.resume:
        if args.target:
            raise BackfillRefused("give either TABLE (start or resume) or --resume NAME, not both")
        found = wait_for_servers(lambda: backfills(settings), name="backfill start")
        cursor = next((r for r in found if r["name"] == args.resume), None)
        if cursor is None or cursor["status"] != "running":
            state = "no such backfill" if cursor is None else f"it is {cursor['status']}"
            raise BackfillRefused(f"cannot resume backfill {args.resume!r}: {state} (`unilog backfill status`)")
    elif not args.target or not args.key:
        raise BackfillRefused("`unilog backfill` needs TABLE and --key COLUMN (or --resume NAME)")
    else:
        config = BackfillConfig(
            table=args.target,
            key=args.key,
            where=args.where,
            stream=args.stream,
            object=args.object,
            action=args.action,
            batch_size=_default_batch(args.rate) if args.batch_size is None else args.batch_size,
            rate=args.rate,
            name=args.name,
            record_type=args.record_type,
        )
        cursor = wait_for_servers(lambda: start(settings, config), name="backfill start", backfill=config.backfill_name)
    progress = _Progress(cursor) if bar else _LogProgress(cursor)
    worker = Backfill(
        settings,
        cursor["name"],
        faults=faults_from(args),
        on_page=progress.update,
        restart_after_crash=not args.exit_on_crash,
    )
    with progress, worker:
        run_until_signalled(worker.run)
    return _report(worker, cursor["name"])


def _report(worker: Any, name: str) -> int:
    if worker.outcome == "done":
        print(f"unilog: backfill {name} done: {worker.staged_total} rows staged by this run")
    elif worker.outcome == "cancelled":
        print(f"unilog: backfill {name} was cancelled after {worker.staged_total} rows of this run")
    else:
        print(f"unilog: backfill {name} stopped after {worker.staged_total} rows: `unilog backfill --resume {name}`")
    return ExitCode.OK


def _default_batch(rate: float | None) -> int:
    """Pages of 200 rows; with ``--rate``, a tenth of a second's rows (at least 1), so the pace is even and each
    page holds its row locks briefly."""
    return 200 if rate is None else max(1, min(200, int(rate / 10)))


class _LogProgress:
    """Progress as log lines, at most one every ``every`` seconds (and the last page's)."""

    def __init__(self, cursor: dict[str, Any], every: float = 5.0) -> None:
        import structlog

        self.log = structlog.get_logger(__name__)
        self.name, self.estimate, self.every = cursor["name"], cursor["rows_estimate"], every
        self.start_rows, self.started, self.last = cursor["rows_done"], time.monotonic(), 0.0

    def __enter__(self) -> _LogProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, cursor: dict[str, Any]) -> None:
        now = time.monotonic()
        if now - self.last < self.every and cursor["status"] == "running":
            return
        self.last = now
        rate = (cursor["rows_done"] - self.start_rows) / max(now - self.started, 1e-6)
        self.log.info(
            "backfill progress",
            backfill=self.name,
            rows=cursor["rows_done"],
            estimate=self.estimate,
            rows_per_second=round(rate),
            status=cursor["status"],
        )


class _Progress:
    """A ``rich`` progress bar on a terminal: rows done of the estimate, rate, ETA."""

    def __init__(self, cursor: dict[str, Any]) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[rate]} rows/s"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            transient=False,
        )
        estimate = max(cursor["rows_estimate"] or 0, cursor["rows_done"])
        self.task = self.bar.add_task(cursor["name"], total=estimate, completed=cursor["rows_done"], rate="-")
        self.start_rows, self.started = cursor["rows_done"], time.monotonic()

    def __enter__(self) -> _Progress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def update(self, cursor: dict[str, Any]) -> None:
        done = cursor["rows_done"]
        rate = (done - self.start_rows) / max(time.monotonic() - self.started, 1e-6)
        total = done if cursor["status"] == "done" else max(self.bar.tasks[0].total or 0, done)
        self.bar.update(self.task, completed=done, total=total, rate=f"{rate:,.0f}")


def add(sub: Any) -> None:
    """Add ``unilog backfill`` to the ``unilog`` sub-parsers."""
    p = sub.add_parser(
        "backfill",
        help="stage a record per existing row of a table (or: backfill status, backfill cancel NAME)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("target", nargs="?", metavar="TABLE", help="the table (schema-qualified allowed); or status, cancel")
    p.add_argument("name", nargs="?", metavar="NAME", help="with status or cancel: the backfill")
    p.add_argument("--key", metavar="COLUMN", help="the unique, NOT NULL column the pages follow (the primary key)")
    p.add_argument("--where", metavar="SQL", help="only the rows that match this SQL condition")
    p.add_argument("--stream", help="the stream (default: the streamer's default stream)")
    p.add_argument("--object", metavar="NAME", help="the records' object (default: the table's name)")
    p.add_argument("--action", metavar="NAME", default="backfill", help="the records' action (default: backfill)")
    p.add_argument(
        "--type",
        dest="record_type",
        metavar="MODULE:CLASS",
        help="stage typed records of this record type (unilog.contracts): each row read as the type, which sets "
        "the stream, object and action",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        metavar="N",
        help="rows per page, one transaction that locks them (default: 200; with --rate, a tenth of a second's rows)",
    )
    p.add_argument("--rate", type=float, metavar="R", help="at most R rows per second (default: no limit)")
    p.add_argument("--name", dest="backfill_name", metavar="NAME", help="the backfill's name (default: TABLE.KEY)")
    p.add_argument("--resume", metavar="NAME", help="resume the running (stopped or killed) backfill NAME")
    p.add_argument("--json", action="store_true", help="with status: as JSON")
    connection_args(p)
    fault_args(p)
    metrics_args(p)
    p.set_defaults(func=_dispatch)


def _dispatch(args: argparse.Namespace) -> int:
    """``--name NAME`` names a new backfill; the positional NAME is status's or cancel's."""
    if args.target not in _ACTIONS:
        if args.name is not None:
            raise BackfillRefused(f"unexpected argument {args.name!r} after the table (options start with --)")
        args.name = args.backfill_name
    return cmd_backfill(args)
