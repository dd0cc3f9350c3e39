"""The direct library producers of a chaos run: several transactions open at once, committed out of order."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog

from unilog import emit

from ..app import App
from . import tables
from .history import HistoryWriter
from .tracking import POISON_ACTION, POISON_OBJECT

log = structlog.get_logger(__name__)


# A statement that takes longer (a server paused or behind a blackholing proxy) fails instead of hanging: the
# transaction then never committed, and the producer goes on. Applications set the same on their own connections.
STATEMENT_TIMEOUT_MS = 5000


@dataclass
class _Open:
    aid: str
    cids: list[str]
    commit: bool
    due: float


class ChaosProducer:
    """A direct library producer: ``connections`` connections, each holding at most one open transaction.

    Transactions start at ``rate`` per second on a free connection, stage 1 to ``max_records`` records (each one a
    row of the app's source table, through ``app.stage``, and of ``chaos_produced``; now and then a poison record
    instead), stay open a random time
    (``max_hold``, and now and then four times longer), then commit (or, with probability ``rollback``, roll back):
    they commit in another order than they began. Every attempt and outcome goes to the history.
    """

    def __init__(
        self,
        app: App,
        conninfo: str,
        history: HistoryWriter,
        *,
        name: str,
        seed: int,
        rate: float = 6.0,
        connections: int = 4,
        max_hold: float = 1.5,
        rollback: float = 0.15,
        poison: float = 0.01,
        max_records: int = 3,
        stream: str | None = None,
    ) -> None:
        self.app = app
        self.conninfo = conninfo
        self.history = history
        self.name = name
        self.rng = random.Random(f"{seed}:{history.allocate()}")  # a new sequence per incarnation
        self.rate = rate
        self.max_hold = max_hold
        self.rollback = rollback
        self.poison = poison
        self.max_records = max_records
        self.stream = stream or app.stream
        self._conns: list[psycopg.Connection[Any] | None] = [None] * connections
        self._open: list[_Open | None] = [None] * connections
        self._retry_at = [0.0] * connections
        self.counts: Counter[str] = Counter()

    def run(self, stop: threading.Event) -> None:
        next_start = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            for i, tx in enumerate(self._open):
                if tx is not None and now >= tx.due:
                    self._finish(i)
            if now >= next_start:
                free = [i for i, tx in enumerate(self._open) if tx is None and self._retry_at[i] <= now]
                if free:
                    self._begin(self.rng.choice(free))
                next_start = max(next_start + self.rng.expovariate(self.rate), now - 1.0)
            wake = min([tx.due for tx in self._open if tx is not None] + [next_start, now + 0.05])
            stop.wait(max(0.0, wake - time.monotonic()))
        for i, tx in enumerate(self._open):
            if tx is not None:
                self._finish(i)
        for conn in self._conns:
            if conn is not None:
                conn.close()
        log.info("chaos producer stopped", producer=self.name, **self.counts)

    def _connection(self, i: int) -> psycopg.Connection[Any]:
        conn = self._conns[i]
        if conn is None or conn.closed or conn.broken:
            conn = tables.connect(
                self.conninfo,
                application_name=f"chaos-{self.name}-{i}",
                options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
                keepalives=1,
                keepalives_idle=5,
                tcp_user_timeout=STATEMENT_TIMEOUT_MS,
            )
            self._conns[i] = conn
        return conn

    def _drop(self, i: int) -> None:
        conn, self._conns[i] = self._conns[i], None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _begin(self, i: int) -> None:
        rng = self.rng
        n = self.history.allocate()
        size = 1 + rng.randrange(self.max_records)
        cids = [f"{self.name}-{n}" if size == 1 else f"{self.name}-{n}.{k}" for k in range(size)]
        poison = [cid for cid in cids if rng.random() < self.poison]
        commit = rng.random() >= self.rollback
        hold = rng.uniform(0, self.max_hold) if rng.random() > 0.05 else rng.uniform(self.max_hold, 4 * self.max_hold)
        aid = self.history.attempt(n, cids, poison=poison)
        try:
            conn = self._connection(i)
            for cid in cids:
                self._stage(conn, cid, cid in poison)
        except Exception as exc:  # nothing was committed: COMMIT was never sent
            self._drop(i)
            self.history.outcome(aid, "rolled_back", error=type(exc).__name__)
            self.counts["failed_before_commit"] += 1
            self._retry_at[i] = time.monotonic() + 0.5
            return
        self._open[i] = _Open(aid, cids, commit, time.monotonic() + hold)

    def _stage(self, conn: psycopg.Connection[Any], cid: str, poison: bool) -> None:
        """One record in the open transaction: a poison record, or a source row and its record (the app's)."""
        if poison:
            data = {"cid": cid, "poison": True}
            emit(conn, action=POISON_ACTION, object=POISON_OBJECT, data=data, stream=self.stream, key=cid)
            tables.produced(conn, cid, poison=True)
            return
        row_id = self.app.stage(conn, cid, self.rng, self.stream)
        tables.produced(conn, cid, row_id=row_id)

    def _finish(self, i: int) -> None:
        tx, self._open[i] = self._open[i], None
        assert tx is not None
        conn = self._conns[i]
        outcome = "rolled_back"
        if conn is None or conn.closed or conn.broken:
            pass  # the session died before COMMIT: the transaction cannot have committed
        elif not tx.commit:
            try:
                conn.rollback()
            except Exception:
                self._drop(i)
        elif conn.info.transaction_status != psycopg.pq.TransactionStatus.INTRANS:
            self._drop(i)  # failed inside the transaction: COMMIT would only roll it back
        else:
            try:
                conn.commit()
                outcome = "committed"
            except Exception:
                outcome = "unknown"  # COMMIT was sent; whether it happened is not known
                self._drop(i)
        self.history.outcome(tx.aid, outcome)
        self.counts[outcome] += 1
