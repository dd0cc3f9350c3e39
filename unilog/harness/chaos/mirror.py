"""The chaos run's backfill step (``ChaosConfig.backfill_rows``): a backfill under faults, checked row by row.

The harness's own table ``chaos_accounts`` (``backfill_rows`` rows) is changed all run long by the ``updater``
process: each transaction adds 1 to two random rows' balances (holding the first a moment) and emits each new
balance on the stream :data:`STREAM` in the same transaction. The ``backfill`` process runs ``unilog backfill
chaos_accounts`` into that stream from the fleet's start, paced to span most of the run, its pages crashing
before commit (``backfill.crash_before_commit``); the schedule kills it like any fleet process and the supervisor
restarts it, and the restarted command resumes from the last committed page. The checkpoint consumer
:data:`CONSUMER` mirrors the table from the stream into ``chaos_mirror`` (upsert by key, in stream order), keeping
every value that arrives out of order (an update's balance not above the mirror's, a backfill's below it). The
updater's threads share rows, so their transactions queue on each other's row locks: the stream must carry each
row's values in the order those transactions committed, in either capture mode (issue 33). After the run, once
the backfill is done and the mirror has read everything, :func:`judge` compares the mirror with the table row by
row: they must be equal, and no value may have arrived out of order.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import psycopg

from unilog import Record, emit
from unilog.config import Settings
from unilog.ops.status import collect_status
from unilog.produce.backfill import backfills

from ..supervisor import ProcessSpec
from . import tables
from .checker import Violation
from .entry import stop_event, wrapper_args

if TYPE_CHECKING:
    from .config import ChaosConfig

STREAM = "chaos-mirror"
CONSUMER = "chaos-mirror"
BACKFILL = "chaos-accounts"
OBJECT = "chaos_account"
PROCESSES = ("updater", "backfill", CONSUMER)
BACKFILL_FAULTS = "backfill.crash_before_commit=0.05"
UPDATERS = 4  # threads of the updater process, each with a transaction in progress most of the time
HOLD = 0.05  # seconds an updater transaction holds its first row before it takes the second


def specs(config: ChaosConfig, python: str, state_dir: Path) -> list[ProcessSpec]:
    """The step's three processes: the updater, the backfill, the mirroring consumer (library faults on the last
    two, as on the fleet's consumers)."""
    harness = [python, "-m", "unilog.harness.chaos"]
    updater = [*harness, "update", "--rows", str(config.backfill_rows), "--seed", str(config.seed * 100 + 40)]
    seed = ["--seed-base", str(config.seed * 100 + 41), "--incarnations", str(state_dir / "backfill.incarnations")]
    rate = ["--rate", f"{config.backfill_rows / max(1.0, 0.75 * config.duration):.1f}"]  # spans most of the run
    consumer = [python, "-m", "unilog", "--log-json", "consume", f"{__name__}:mirror", "--name", CONSUMER]
    consumer += ["--stream", STREAM, "--block-ms", "250"]
    faults = config.library_faults
    return [
        ProcessSpec("updater", updater),
        ProcessSpec(
            "backfill", [*harness, "backfill", *seed, *rate], {"UNILOG_FAULTS": BACKFILL_FAULTS if faults else ""}
        ),
        ProcessSpec(CONSUMER, consumer, {"UNILOG_FAULTS": config.consumer_faults if faults else ""}),
    ]


def mirror(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
    """The mirroring consumer's handler: each record of a ``chaos_accounts`` row (a backfill's or the updater's)
    sets the mirror's row to the balance it carries."""
    for r in records:
        if r.object == OBJECT and r.key is not None:
            tables.mirror(conn, int(r.key), int(r.data["balance"]), r.action or "")


def update_main(argv: Sequence[str] | None = None) -> int:
    """``python -m unilog.harness.chaos update --rows N``: until SIGTERM, :data:`UPDATERS` threads of transactions
    that each add 1 to two random rows' balances and emit their new balances (key: the row's id) on :data:`STREAM`;
    each reconnects after any failure (whatever committed is in the table, which the mirror is checked against)."""
    parser = argparse.ArgumentParser(prog="python -m unilog.harness.chaos update")
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    stop, url = stop_event(), Settings.from_env().database_url
    threads = [
        threading.Thread(target=_updater, args=(url, args.rows, random.Random(args.seed * 10 + i), stop))
        for i in range(UPDATERS)
    ]
    for thread in threads:
        thread.start()
    stop.wait()
    for thread in threads:
        thread.join(30)
    return 0


def _updater(url: str, rows: int, rng: random.Random, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            with tables.connect(url) as conn:
                while not stop.wait(rng.uniform(0, 0.02)):
                    _update(conn, rng, rows)
        except psycopg.Error as exc:
            print(f"updater: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}", file=sys.stderr, flush=True)
            stop.wait(0.5)


def _update(conn: psycopg.Connection[Any], rng: random.Random, rows: int) -> None:
    """One transaction: two rows' balances, each with its record; the first row stays locked (and the transaction's
    id taken) while it waits a moment, so a backfill page that reads either row meets a transaction in progress, and
    another updater that wants the row queues behind it (having taken its transaction id first). The threads share
    rows: the hot tenth of them takes half the updates, so such queues are frequent."""
    hot = max(1, rows // 10)
    picks = {rng.randint(1, hot) if rng.random() < 0.5 else rng.randint(1, rows) for _ in range(2)}
    for n, row_id in enumerate(sorted(picks)):  # in id order: updaters queue on a row instead of deadlocking
        balance = tables.bump(conn, row_id)
        if balance is not None:
            emit(conn, action="update", object=OBJECT, data={"balance": balance}, key=str(row_id), stream=STREAM)
        if n == 0:
            time.sleep(HOLD)
    conn.commit()


def backfill_main(argv: Sequence[str] | None = None) -> int:
    """``python -m unilog.harness.chaos backfill [--seed-base N --incarnations FILE] [BACKFILL-OPTIONS]``:
    ``unilog backfill chaos_accounts`` into :data:`STREAM` (the same command again resumes it); once it is done,
    waits for SIGTERM (the supervisor restarts a process that exits: a finished backfill must not start over)."""
    from unilog.cli import main

    _args, rest = wrapper_args("python -m unilog.harness.chaos backfill", argv)
    if _done(Settings.from_env()):
        stop_event().wait()
        return 0
    command = ["backfill", "chaos_accounts", "--key", "id", "--stream", STREAM, "--object", OBJECT]
    return main(["--log-json", *command, "--name", BACKFILL, *rest])


def _done(settings: Settings) -> bool:
    return any(b["name"] == BACKFILL and b["status"] == "done" for b in backfills(settings))


def settle(settings: Settings, timeout: float, out: TextIO, t0: float) -> bool:
    """Wait until the backfill is done, nothing is staged and the mirror has read its whole stream (three polls in
    a row); False after ``timeout`` seconds."""
    deadline, quiet = time.monotonic() + timeout, 0
    while quiet < 3:
        try:
            status = collect_status(settings)
            lag = next((c["lag_entries"] for c in status["consumers"] if c["name"] == CONSUMER), None)
            quiet = quiet + 1 if _done(settings) and status["staged"]["records"] == 0 and lag == 0 else 0
        except Exception:  # a server still coming back: poll again
            quiet = 0
        if time.monotonic() > deadline:
            print(f"[{time.monotonic() - t0:6.1f}s] the backfill step did not settle in {timeout:.0f}s", file=out)
            return False
        time.sleep(0.5)
    return True


def judge(database_url: str, settings: Settings) -> tuple[list[Violation], dict[str, Any]]:
    """The mirror against the table, row by row, and whether the backfill finished: violations and counts."""
    violations = []
    if not _done(settings):
        violations.append(Violation("backfill_not_done", f"backfill {BACKFILL} did not finish", CONSUMER))
    with tables.connect(database_url, autocommit=True) as conn:
        rows, differ = tables.mirror_differences(conn)
        inversions = tables.mirror_inversions(conn)
    if differ:
        shown = ", ".join(f"{i}: table {a} mirror {m}" for i, a, m in differ[:10])
        message = f"{len(differ)} of {rows} rows of chaos_accounts differ in the mirror ({shown})"
        violations.append(Violation("mirror_mismatch", message, CONSUMER, tuple(f"account-{i}" for i, _, _ in differ)))
    if inversions:
        shown = ", ".join(f"{i}: {got} ({action}) after {before}" for i, before, got, action in inversions[:10])
        message = f"{len(inversions)} values reached the mirror out of order ({shown})"
        keys = tuple(f"account-{i}" for i, _, _, _ in inversions)
        violations.append(Violation("mirror_out_of_order", message, CONSUMER, keys))
    counts = {"backfill_rows": rows, "mirror_differences": len(differ), "mirror_inversions": len(inversions)}
    return violations, counts
