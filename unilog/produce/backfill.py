"""Backfills: one record per existing row of a table, staged through ``emit_many``, consistent with live writes.

``unilog backfill TABLE --key COLUMN`` (and :func:`start`, :class:`Backfill`) pages through ``TABLE`` by its unique
key (keyset: ``key > last key ORDER BY key LIMIT batch``, never ``OFFSET``) and stages one record per row with the
library's own :class:`~unilog.Producer` (so it works in table and WAL capture mode alike): ``object`` the table's
name, ``action`` ``backfill``, ``key`` the key's value as text, ``data`` the row as JSON by ``emit``'s rules.

**Order against live writes** (``docs/guides/backfill.md``). Each page is one transaction that

1. locks the cursor row ``unilog_backfills`` (a cancel waits for the page) and reads the page's rows
   ``FOR SHARE``: an update of one of them that is in progress makes the read wait for it and then return the
   updated row; an update that comes later waits for the page's commit;
2. stages the page's records (one ``emit_many``: one statement, in key order) and advances the cursor, and commits
   both at once.

So for each row, a change committed before the page read it is in the page's record, and that change's own record
comes first: it committed first (WAL mode publishes in commit order) and it was emitted before the page's records
were (table mode publishes records of transactions that conflict on a row in emit order, which is then commit
order: :mod:`unilog.store.claims`). A change that waited for the page commits after it and emits after it, so its
record comes after the backfill's. Nothing waits for unrelated open transactions. A consumer applying records in
stream order ends with every row's latest
value. A killed page commits nothing: neither records nor cursor; the next run starts after the last committed page.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import psycopg
import structlog

from .. import metrics, store
from ..config import Settings, import_user_module, validate_stream_name
from ..errors import (
    BackfillRefused,
    PayloadNotSerializable,
    PostgresPermissionDenied,
    RecordContractViolation,
    UnreadableRecord,
)
from ..faults import NO_FAULTS, Faults
from ..runtime import Links, Worker
from ..store import backfills as sql
from . import producer as produce
from .encoding import PostgresJSON

__all__ = ["Backfill", "BackfillConfig", "backfills", "cancel", "default_name", "start"]

log = structlog.get_logger(__name__)

# Seconds a backfill waits for its lock before it is refused as run by another process. A session-level lock is let
# go when its backend exits, a moment after the client closed the session: a backfill restarted in-process after a
# crash (or reconnecting) found its own closed session still holding it, at load, and was refused as its own rival.
LOCK_WAIT = 5.0
EXACT_COUNT_BELOW = 200_000  # a planner estimate below this is replaced by count(*) (cheap, and exact)


@dataclass(frozen=True)
class BackfillConfig:
    """What to backfill and how fast. ``table`` may be schema-qualified; ``key`` names a column covered by a
    unique index of its own (the primary key, say); ``where`` is SQL the rows must match (the operator's own SQL,
    run with the role's privileges); ``stream`` None: the default stream; ``object`` None: the table's name;
    ``batch_size`` rows per page (one transaction, its rows locked until it commits: an application update of one
    waits up to a page); ``rate`` at most that many rows per second on average (None: no limit);
    ``name`` None: :func:`default_name`. ``record_type``: ``module:Class`` of a record type
    (:func:`unilog.contracts.record_type`) to stage typed records: each row's columns are read as that type (a
    row it refuses stops the backfill with one line naming the key, the field and the rule; nothing of that page is
    staged) and the type's stream, object and action are the records' (``stream``, ``object``, ``action`` must
    then not be given)."""

    table: str
    key: str
    where: str | None = None
    stream: str | None = None
    object: str | None = None
    action: str = "backfill"
    batch_size: int = 200
    rate: float | None = None
    name: str | None = None
    record_type: str | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise BackfillRefused(f"--batch-size must be at least 1, got {self.batch_size}")
        if self.rate is not None and self.rate <= 0:
            raise BackfillRefused(f"--rate must be above 0 rows/s, got {self.rate}")
        if self.stream is not None:
            validate_stream_name(self.stream)
        for what, value in (("--object", self.object), ("--action", self.action), ("--name", self.name)):
            if value is not None and not value.strip():
                raise BackfillRefused(f"{what} must not be empty")
        if self.record_type is not None:
            given = [o for o, v in (("--stream", self.stream), ("--object", self.object)) if v is not None]
            if self.action != "backfill":
                given.append("--action")
            if given:
                raise BackfillRefused(f"--type sets the records' stream, object and action: drop {', '.join(given)}")
            load_type(self.record_type)

    @property
    def backfill_name(self) -> str:
        return self.name or default_name(self.table, self.key, self.where)


def load_type(reference: str) -> type:
    """The record type class ``module:Class`` names, or one :class:`~unilog.errors.BackfillRefused` line."""
    module_name, _, attr = reference.partition(":")
    if not module_name or not attr:
        raise BackfillRefused(f"--type {reference!r} must look like module:Class")
    try:
        cls = getattr(import_user_module(module_name), attr)
    except (Exception, SystemExit) as exc:  # whatever the application's module does while it is imported
        raise BackfillRefused(f"--type {reference}: {type(exc).__name__}: {' '.join(str(exc).split())}") from None
    if not isinstance(cls, type) or getattr(cls, "__unilog_contract__", None) is None:
        raise BackfillRefused(f"--type {reference} is not a record type (declare it with unilog.contracts.record_type)")
    return cls


def typed_rows(cls: type, rows: list[tuple[Any, ...]]) -> list[Any]:
    """A page's rows read as ``cls``'s records (keyed by the row's key unless the type has a key field), or one
    :class:`~unilog.errors.BackfillRefused` line naming the first row the type refuses, its field and rule."""
    contract = cast(Any, cls).__unilog_contract__
    records = []
    for key, data, _ in rows:
        try:
            record = contract.decode(data)
        except UnreadableRecord as exc:
            raise BackfillRefused(f"the row with key {key!r} is not a {contract.type_tag}: {exc.reason}") from None
        records.append({"record": record, "key": None if contract.key_field else key})
    return records


def default_name(table: str, key: str, where: str | None) -> str:
    """A backfill's name unless one is given: ``TABLE.KEY``, and a digest of ``where`` if there is one (so running
    the same command again finds, and resumes, the same backfill)."""
    base = f"{table}.{key}"
    return base if not where else f"{base}-{hashlib.sha1(where.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class Plan:
    """A checked backfill: the resolved table, its key, its columns and the page statements."""

    table: sql.Table
    key: sql.Column
    columns: list[sql.Column]
    where: str | None
    first: Any = field(repr=False)  # the page statement from the start
    after: Any = field(repr=False)  # the page statement after a key


def check(conn: psycopg.Connection[Any], table: str, key: str, where: str | None) -> Plan:
    """Check everything before anything is staged, and raise one line for the first problem: the table exists and
    the role may read and lock its rows, the key column exists, has an order, is NOT NULL and unique by itself,
    every column's type can be encoded, and the page statement with ``where`` plans. ``conn`` is autocommit."""
    try:
        found = sql.resolve_table(conn, table)
    except psycopg.errors.InvalidName:
        found = None
    if found is None:
        raise BackfillRefused(f"table {table!r} does not exist (or is not on the search path)")
    may_select, may_lock = sql.privileges(conn, found)
    if not (may_select and may_lock):
        missing = " and ".join(p for p, ok in (("SELECT", may_select), ("UPDATE", may_lock)) if not ok)
        raise PostgresPermissionDenied(
            f"the role in DATABASE_URL lacks {missing} on table {found.qualified} (a backfill reads its rows and "
            f"locks them FOR SHARE, which needs UPDATE): GRANT SELECT, UPDATE ON {found.qualified} TO <role>"
        )
    columns = sql.table_columns(conn, found)
    key_column = next((c for c in columns if c.name == key), None)
    if key_column is None:
        raise BackfillRefused(f"table {found.qualified} has no column {key!r}")
    _check_key(conn, found, key_column)
    try:
        sql.check_page(conn, found, columns, key_column, where)
    except psycopg.Error as exc:
        reason = exc.diag.message_primary or " ".join(str(exc).split())
        what = f"--where {where!r} cannot be used" if where else f"table {found.qualified} cannot be paged"
        raise BackfillRefused(f"{what}: {reason}") from None
    return Plan(
        found,
        key_column,
        columns,
        where,
        sql.page_query(found, columns, key_column, where, after=False),
        sql.page_query(found, columns, key_column, where, after=True),
    )


def _check_key(conn: psycopg.Connection[Any], table: sql.Table, key: sql.Column) -> None:
    try:
        sql.check_orderable(conn, table, key)
    except psycopg.errors.UndefinedFunction:
        raise BackfillRefused(
            f"key column {key.name!r} of {table.qualified} is of type {key.type_sql}, which has no order: pages "
            "are read in key order"
        ) from None
    if not sql.is_unique_key(conn, table, key):
        raise BackfillRefused(
            f"key column {key.name!r} of {table.qualified} is not unique by itself: it needs a primary key or a "
            "unique index on exactly that column (pages are read after the last key)"
        )
    if not key.not_null:
        raise BackfillRefused(
            f"key column {key.name!r} of {table.qualified} may be NULL: rows with a NULL key would be skipped; "
            "make it NOT NULL or choose another key"
        )


def start(settings: Settings, config: BackfillConfig) -> dict[str, Any]:
    """Check ``config`` (:func:`check`) and create its cursor, or find the running backfill of the same name to
    resume (it must be of the same table, key and ``where``; it takes ``config``'s batch size and rate); return the
    cursor row. A finished or cancelled
    backfill of that name starts over. Nothing is staged here: run :class:`Backfill` with the name."""
    name = config.backfill_name
    with store.connect(settings.conninfo, autocommit=True, application_name="unilog-backfill") as conn:
        store.check_schema(conn)
        plan = check(conn, config.table, config.key, config.where)
        existing = sql.get_backfill(conn, name)
        if existing is not None and existing["status"] == "running":
            same = (existing["table"], existing["key"], existing["where"]) == (
                plan.table.qualified,
                config.key,
                config.where,
            )
            if not same:
                raise BackfillRefused(
                    f"backfill {name!r} is running on {existing['table']} (key {existing['key']}, where "
                    f"{existing['where']!r}): cancel it (`unilog backfill cancel {name}`) or give another --name"
                )
            sql.set_pace(conn, name, config.batch_size, config.rate)
            return {**existing, "batch_size": config.batch_size, "rate": config.rate}
        spec = {
            "name": name,
            "table": plan.table.qualified,
            "key": config.key,
            "where": config.where,
            "stream": config.stream or "",
            "object": config.object or plan.table.name,
            "action": config.action,
            "batch_size": config.batch_size,
            "rate": config.rate,
            "rows_estimate": sql.estimate_rows(conn, plan.table, config.where, EXACT_COUNT_BELOW),
            "record_type": config.record_type,
        }
        if config.record_type is not None:  # what status shows: the type's own (it sets them on every record)
            contract = cast(Any, load_type(config.record_type)).__unilog_contract__
            spec.update(stream=contract.stream or "", object=contract.object, action=contract.action)
        sql.start_backfill(conn, spec)
        found = sql.get_backfill(conn, name)
        assert found is not None
        return found


def backfills(settings: Settings) -> list[dict[str, Any]]:
    """Every backfill's cursor (name, table, key, where, status, rows done, estimate, last key, times), with
    ``active``: whether a process runs it now."""
    with store.connect(settings.conninfo, autocommit=True, application_name="unilog-backfill") as conn:
        store.check_schema(conn)
        return sql.list_backfills(conn)


def cancel(settings: Settings, name: str) -> bool:
    """Cancel backfill ``name``: its process stops before its next page (the page in progress commits first).
    Return False if it had already finished; :class:`BackfillRefused` if there is no such backfill."""
    with store.connect(settings.conninfo, autocommit=True, application_name="unilog-backfill") as conn:
        store.check_schema(conn)
        if sql.get_backfill(conn, name) is None:
            raise BackfillRefused(f"no backfill named {name!r} (`unilog backfill status` lists them)")
        return sql.finish_backfill(conn, name, "cancelled")


Progress = Callable[[dict[str, Any]], Any]  # called after each committed page with the cursor row


class Backfill(Worker):
    """Runs backfill ``name`` (created by :func:`start`) page by page until it is done or cancelled.

    One page per :meth:`run_once`, each one transaction (see the module docstring); ``run(stop)`` runs the shared
    worker loop (reconnecting after a lost connection, restarting from the cursor after an injected crash) and
    sets ``stop`` when the backfill ended; :meth:`drain` runs pages until it ended. ``on_page`` gets the cursor
    after each committed page. The process holds the backfill's lock while connected: a second process refuses.
    """

    kind = "backfill"

    def __init__(
        self,
        settings: Settings,
        name: str,
        *,
        faults: Faults = NO_FAULTS,
        on_page: Progress | None = None,
        restart_after_crash: bool = True,
        pg_timeout: float | None = 60.0,
    ) -> None:
        self.name = name
        self.faults = faults
        self.on_page = on_page
        self.restart_after_crash = restart_after_crash
        self.links = Links(
            settings, app_name=f"unilog-backfill {name}", pg_timeout=pg_timeout, redis_timeout=None, autocommit=True
        )
        self.producer = produce.Producer()  # no stream given: the streamer's default stream, as `emit` does
        self.plan: Plan | None = None
        self.typed: type | None = None  # the record type's class, for a typed backfill
        self.stream = settings.stream  # until connect() reads the cursor's
        self.outcome: str | None = None  # done or cancelled, once it ended
        self.staged_total = 0
        self._run_started = time.monotonic()
        self._run_rows = 0
        self._rate_limit: float | None = None

    @property
    def label(self) -> dict[str, Any]:
        return {"backfill": self.name}

    def describe(self) -> dict[str, Any]:
        """The start-up line names the stream the backfill stages to (its cursor's, else the default stream)."""
        return {**self.links.settings.describe(), "stream": self.stream}

    def connect(self) -> None:
        """Open the session, take the backfill's lock and check its table again (it may have changed)."""
        conn = self.links.pg()
        deadline = time.monotonic() + LOCK_WAIT
        while not sql.try_backfill_lock(conn, self.name):
            if time.monotonic() >= deadline:
                raise BackfillRefused(f"backfill {self.name!r} is being run by another process")
            time.sleep(0.1)
        cursor = sql.get_backfill(conn, self.name)
        if cursor is None:
            raise BackfillRefused(f"no backfill named {self.name!r} (`unilog backfill status` lists them)")
        self.plan = check(conn, cursor["table"], cursor["key"], cursor["where"])
        self.typed = None if cursor["record_type"] is None else load_type(cursor["record_type"])
        self.stream = cursor["stream"] or self.links.settings.stream
        metrics.BACKFILL_ESTIMATE.labels(self.name).set(cursor["rows_estimate"] or 0)
        metrics.BACKFILL_RUNNING.labels(self.name).set(1)

    def run_once(self) -> int:
        """Stage one page in one transaction; return its rows (0 when the backfill has ended: see :attr:`outcome`)."""
        if self.plan is None or self.links.pg_open is None:
            self.connect()
        assert self.plan is not None
        conn = self.links.pg()
        started = time.perf_counter()
        with conn.transaction():
            cursor = sql.lock_backfill(conn, self.name)
            if cursor is None or cursor["status"] != "running":
                self.outcome = "cancelled" if cursor is None else cursor["status"]
                return 0
            rows = sql.read_page(
                conn, self.plan.after if cursor["last_key"] is not None else self.plan.first, cursor["last_key"],
                cursor["batch_size"],
            )  # fmt: skip
            self._stage(conn, cursor, rows)
            if rows:
                sql.advance_backfill(conn, self.name, rows[-1][0], len(rows))
            if len(rows) < cursor["batch_size"]:
                sql.finish_backfill(conn, self.name, "done")
            self.faults.crash("backfill.crash_before_commit")
        self._account(cursor, len(rows), time.perf_counter() - started)
        return len(rows)

    def _stage(self, conn: psycopg.Connection[Any], cursor: dict[str, Any], rows: list[tuple[Any, ...]]) -> None:
        """Stage the page's records with one ``emit_many`` (one statement), in key order. Each row's data is the
        JSON text Postgres built (:func:`unilog.store.backfills.page_query`), staged as it is: every digit kept."""
        action, object_, stream = cursor["action"], cursor["object"], cursor["stream"] or None
        for key, _, problem in rows:
            if problem is not None:
                raise BackfillRefused(
                    f"the row with key {key!r} cannot be staged: {problem}: NaN and Infinity are not valid JSON"
                )
        records: list[Any] = (
            [{"action": action, "object": object_, "data": PostgresJSON(data), "stream": stream, "key": key}
             for key, data, _ in rows]
            if self.typed is None
            else typed_rows(self.typed, rows)
        )  # fmt: skip
        try:
            self.producer.emit_many(conn, records)
        except (PayloadNotSerializable, RecordContractViolation) as exc:
            if exc.index is None:
                raise
            reason = str(exc).removeprefix(produce.record_prefix(exc.index, records[exc.index]))
            raise BackfillRefused(f"the row with key {rows[exc.index][0]!r} cannot be staged: {reason}") from None

    def _account(self, cursor: dict[str, Any], rows: int, seconds: float) -> None:
        """After a committed page: totals, metrics, the progress callback."""
        self.staged_total += rows
        self._rate_limit = cursor["rate"]
        self._run_rows += rows
        metrics.BACKFILL_ROWS.labels(self.name).inc(rows)
        metrics.BACKFILL_PAGE_SECONDS.labels(self.name).observe(seconds)
        done = cursor["rows_done"] + rows
        if rows < cursor["batch_size"]:
            self.outcome = "done"
        if self.on_page is not None:
            self.on_page({**cursor, "rows_done": done, "status": self.outcome or "running"})

    def idle(self, result: Any, stop_event: threading.Event) -> None:
        """End the loop once the backfill ended; otherwise hold the pace to ``rate`` rows per second."""
        if self.outcome is not None:
            stop_event.set()
            return
        self._pace(stop_event)

    def _pace(self, stop_event: threading.Event) -> None:
        if self._rate_limit:
            due = self._run_started + self._run_rows / self._rate_limit
            stop_event.wait(max(0.0, due - time.monotonic()))

    def drain_pass(self) -> tuple[int, bool]:
        """One page of :meth:`drain` (run pages until the backfill is done or cancelled, at the ``rate`` pace)."""
        before = self.staged_total
        self.run_once()
        if self.outcome is None:
            self._pace(threading.Event())
        return self.staged_total - before, self.outcome is not None

    def totals(self) -> dict[str, Any]:
        return {"rows": self.staged_total, "outcome": self.outcome or "stopped"}

    def finish(self) -> None:
        """The loop ended (either mode): this process no longer runs the backfill."""
        metrics.BACKFILL_RUNNING.labels(self.name).set(0)

    def close(self) -> None:
        """Close the session (its lock goes with it); only committed pages carry over."""
        self.plan = None
        super().close()
