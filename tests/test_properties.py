"""Property tests: random interleavings of producers, the streamer and consumers, with faults, on the real servers.

Hypothesis generates a list of steps that one thread executes in order against a fresh database and a flushed Redis:

* producers (3 connections): ``("begin", i, k)`` opens transaction i on connection i if it is not open and emits k
  records into it (so one transaction's records can interleave with others' in staged-id order); ``("commit", i)``
  and ``("rollback", i)`` end it (no-ops when it is not open). Transactions therefore commit out of order, stay open
  across streamer passes (their records wait, nobody else's) and roll back leaving gaps in the staged ids.
* the streamer (batch size 2, trimming behind the registered consumers on every pass): ``("stream",)`` is one
  ``run_once``; ``("stream_crash",)`` one with ``streamer.crash_after_publish`` forced, then a restart (``close``,
  and wait until the old session has released its stream lock: see ``wait_for_old_streamer_session``);
  ``("stream_double",)`` one with ``streamer.double_send`` forced.
* two consumers (batch size 2): ``("consume", c)``, ``("consume_crash_before_commit", c)`` and
  ``("consume_crash_mid_batch", c, j)`` (the crash hits before record j of the batch, after the handler applied
  the records before it); a crashed consumer restarts (``close``). After every consumer step, no consumer may have
  applied a record that is not committed, or one record twice.

After the steps every open transaction is committed or rolled back (also generated), the streamer and both consumers
drain, and then: each consumer applied every committed record exactly once, no rolled-back record, at positions
1..N per producer with no gap, in the stream's order, and with its checkpoint at N; the staged table is empty; the
stream, deduplicated by position, is a contiguous run ending at N, and its order keeps the documented guarantee: a
record emitted after another's transaction committed comes after it, and one transaction's records keep their emit
order (so records whose transactions conflict on a row are in commit order: unilog/store/claims.py).

``UNILOG_HYPOTHESIS_EXAMPLES`` (default 25) sets the number of examples; ``UNILOG_HYPOTHESIS_DERANDOMIZE=1`` makes
the run derandomized (reproducible without ``--hypothesis-seed``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
import redis
from handlers import APPLIED_DDL, record_applied
from hypothesis import event, given, note
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from unilog import Consumer, ConsumerConfig, Faults, InjectedCrash, Record, Settings, Streamer, StreamerConfig, emit
from unilog.faults import NO_FAULTS
from unilog.harness.pytest_plugin import PostgresHandle, RedisHandle, create_database, drop_database

EXAMPLES = int(os.environ.get("UNILOG_HYPOTHESIS_EXAMPLES") or 25)
DERANDOMIZE = os.environ.get("UNILOG_HYPOTHESIS_DERANDOMIZE", "").lower() in ("1", "true", "yes")
PRODUCERS = 3
CONSUMERS = 2
STREAM = "test-stream"
DRAIN_TIMEOUT_S = 60

Step = tuple[Any, ...]

begin_steps = st.tuples(st.just("begin"), st.integers(0, PRODUCERS - 1), st.integers(1, 3))
end_steps = st.tuples(st.sampled_from(["commit", "rollback", "commit"]), st.integers(0, PRODUCERS - 1))
streamer_steps = st.sampled_from([("stream",), ("stream_crash",), ("stream_double",)])
consumer_steps = st.one_of(
    st.tuples(st.sampled_from(["consume", "consume_crash_before_commit"]), st.integers(0, CONSUMERS - 1)),
    st.tuples(st.just("consume_crash_mid_batch"), st.integers(0, CONSUMERS - 1), st.integers(0, 1)),
)
# Producer steps are half of the mix, so that runs have records to move and faults have batches to hit. A flat list
# would average ~5 steps (Hypothesis's default) and a min_size would stop failures from shrinking below it, so the
# steps come as a list of chunks (~35 steps on average, at most 144) that shrinks to one step.
step = st.one_of(begin_steps, end_steps, streamer_steps, consumer_steps, begin_steps, end_steps)
steps_strategy = st.lists(st.lists(step, min_size=1, max_size=12), min_size=1, max_size=12).map(
    lambda chunks: [s for chunk in chunks for s in chunk]
)
# for each producer connection: commit (True) or roll back (False) its transaction if it is still open at the end
finish_strategy = st.lists(st.booleans(), min_size=PRODUCERS, max_size=PRODUCERS)


class CrashAt(Faults):
    """Scripted faults whose mid-batch crash happens before record ``index`` of the batch (mod its length)."""

    def __init__(self, index: int = 0, **script: Sequence[bool]) -> None:
        super().__init__(script={k.replace("__", "."): v for k, v in script.items()})
        self.index = index

    def pick(self, n: int) -> int:
        return self.index % n if n else 0


@dataclass
class Staged:
    """A record emitted by the test: its unique payload id ``n``, its staged id and its transaction's xid."""

    n: int
    staged_id: int
    xid: int
    emitted: int = 0  # the model's clock when it was emitted
    committed: int = 0  # ... and when its transaction committed


@dataclass
class Txn:
    xid: int | None = None
    records: list[Staged] = field(default_factory=list)


def applying_handler(name: str) -> Any:
    """Applies records one at a time, so a mid-batch crash leaves (rolled-back) partial effects behind."""

    def handle(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
        for record in records:
            record_applied(name, conn, [record])

    return handle


@contextlib.contextmanager
def time_limit(seconds: float, what: str) -> Iterator[None]:
    """Fail instead of hanging forever if ``what`` does not finish (a drain waiting on a horizon that never moves)."""

    if threading.current_thread() is not threading.main_thread():  # signals work in the main thread only
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"{what} did not finish within {seconds}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Pipeline:
    """The system under test plus a model of what the producers committed and rolled back."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.check = psycopg.connect(settings.conninfo, autocommit=True)
        self.check.execute(APPLIED_DDL)
        self.check.execute("ALTER TABLE applied ADD COLUMN ord BIGINT GENERATED ALWAYS AS IDENTITY")
        self.producers: list[psycopg.Connection[Any] | None] = [None] * PRODUCERS
        self.open: dict[int, Txn] = {}
        self.committed: list[Staged] = []
        self.rolled_back: list[Staged] = []
        self.next_n = 0
        self.clock = 0  # the model's clock: one tick per emit and per commit
        self.streamer = Streamer(settings, StreamerConfig(batch_size=2, retention_interval=0.0), name="prop")
        self.consumers = [
            Consumer(settings, ConsumerConfig(name=f"c{c}", batch_size=2), applying_handler(f"c{c}"))
            for c in range(CONSUMERS)
        ]
        for consumer in self.consumers:
            consumer.connect()  # as run() does: registers the checkpoint, so trimming never passes it

    def close(self) -> None:
        for conn in [*self.producers, self.check]:
            if conn is not None:
                conn.close()
        self.streamer.close()
        for consumer in self.consumers:
            consumer.close()

    # -- steps -------------------------------------------------------------------------------------------------------

    def run(self, step: Step) -> None:
        kind, *args = step
        getattr(self, kind)(*args)

    def begin(self, i: int, k: int) -> None:
        conn = self.producers[i]
        if conn is None:
            conn = self.producers[i] = psycopg.connect(self.settings.conninfo)
        txn = self.open.setdefault(i, Txn())
        for _ in range(k):
            n = self.next_n
            self.next_n += 1
            staged_id = emit(conn, action="create", object="ride", data={"n": n})
            if txn.xid is None:
                row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
                assert row is not None
                txn.xid = int(row[0])
            self.clock += 1
            txn.records.append(Staged(n, staged_id, txn.xid, emitted=self.clock))

    def commit(self, i: int) -> None:
        txn = self.open.pop(i, None)
        if txn is not None:
            conn = self.producers[i]
            assert conn is not None
            conn.commit()
            self.clock += 1
            for record in txn.records:
                record.committed = self.clock
            if any(
                other.xid is not None and txn.xid is not None and other.xid < txn.xid for other in self.open.values()
            ):
                event("a transaction committed while an older one stayed open")
            self.committed += txn.records

    def rollback(self, i: int) -> None:
        txn = self.open.pop(i, None)
        if txn is not None:
            conn = self.producers[i]
            assert conn is not None
            conn.rollback()
            self.rolled_back += txn.records

    def stream(self) -> None:
        if self.streamer.run_once().published and self.open:
            event("the streamer published beside an open transaction")

    def _stream_with(self, faults: Faults) -> None:
        self.streamer.faults = faults
        try:
            self.streamer.run_once()
        except InjectedCrash:
            self.streamer.close()  # a restart: only committed state carries over
            self.wait_for_old_streamer_session()
        finally:
            self.streamer.faults = NO_FAULTS
        for point in faults.counts:
            event(f"fired: {point}")

    def wait_for_old_streamer_session(self) -> None:
        """Wait until the crashed streamer's backend has exited and released its session-level stream lock.

        ``close()`` does not wait for the server to end the session. A restarted streamer that asks for the lock
        before that gets ``pg_try_advisory_lock`` = false and stands by for that pass (``BatchResult.blocked``;
        ``drain()`` waits it out, see ``test_drain_waits_for_a_stream_another_session_holds``). Waiting here keeps
        every step deterministic: a step never depends on the server's scheduling.
        """
        deadline = time.monotonic() + 10
        while self.check.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
            "WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database() "
            # producers that staged hold the wake-up lock shared until they end (migration unilog_0007)
            "AND ((l.classid::bigint << 32) | l.objid::bigint) <> hashtextextended('unilog.wakeup', 0)"
        ).fetchone() != (0,):
            assert time.monotonic() < deadline, "the crashed streamer's session still holds its lock after 10 s"
            time.sleep(0.001)

    def stream_crash(self) -> None:
        self._stream_with(Faults.scripted(streamer__crash_after_publish=[True]))

    def stream_double(self) -> None:
        self._stream_with(Faults.scripted(streamer__double_send=[True]))

    def consume(self, c: int) -> None:
        self.consumers[c].run_once(block_ms=-1)
        self.check_applied_so_far()

    def _consume_with(self, c: int, faults: Faults) -> None:
        consumer = self.consumers[c]
        consumer.faults = faults
        try:
            consumer.run_once(block_ms=-1)
        except InjectedCrash:
            consumer.close()  # a restart: only the committed checkpoint carries over
        finally:
            consumer.faults = NO_FAULTS
        for point in faults.counts:
            event(f"fired: {point}")
        self.check_applied_so_far()

    def consume_crash_before_commit(self, c: int) -> None:
        self._consume_with(c, CrashAt(consumer__crash_before_commit=[True]))

    def consume_crash_mid_batch(self, c: int, index: int) -> None:
        self._consume_with(c, CrashAt(index, consumer__crash_mid_batch=[True]))

    # -- checks ------------------------------------------------------------------------------------------------------

    def check_applied_so_far(self) -> None:
        """At any moment a consumer has applied only committed records, each at most once."""
        committed = {r.n for r in self.committed}
        for name, n, times in self.check.execute("SELECT consumer, n, count(*) FROM applied GROUP BY consumer, n"):
            assert n in committed, f"{name} applied record {n}, which is not committed"
            assert times == 1, f"{name} applied record {n} {times} times"

    def finish(self, commit: Sequence[bool]) -> None:
        """End the open transactions as generated, then drain the streamer and both consumers (no faults)."""
        for i in sorted(self.open):
            (self.commit if commit[i] else self.rollback)(i)
        note(f"committed: {[(r.n, r.xid, r.staged_id) for r in self.committed]}")
        note(f"rolled back: {[r.n for r in self.rolled_back]}")
        with time_limit(DRAIN_TIMEOUT_S, "draining the streamer and the consumers"):
            self.streamer.drain()
            for consumer in self.consumers:
                consumer.drain()

    def stream_order(self) -> list[int]:
        """The records' order in the stream: by the positions the first consumer applied them at (retention has
        trimmed what every consumer read), each position once."""
        rows = self.check.execute("SELECT DISTINCT seq, n FROM applied WHERE consumer = 'c0' ORDER BY seq").fetchall()
        return [n for _, n in rows]

    def check_order(self, order: list[int]) -> None:
        """The documented guarantee: a record emitted after another's transaction committed comes after it; one
        transaction's records keep their emit order."""
        at = {n: i for i, n in enumerate(order)}
        for a in self.committed:
            for b in self.committed:
                before = a.committed < b.emitted or (a.xid == b.xid and a.staged_id < b.staged_id)
                if before and a.n in at and b.n in at:
                    assert at[a.n] < at[b.n], f"record {a.n} (committed at {a.committed}) after {b.n} (emitted at "
                    f"{b.emitted}): stream order {order}"

    def check_final(self) -> None:
        # the stream's order (each consumer must apply it), which must keep the documented guarantee
        expected = self.stream_order()
        assert sorted(set(expected)) == sorted(r.n for r in self.committed), f"stream records {expected}"
        self.check_order(expected)
        committed = set(expected)
        rolled_back = {r.n for r in self.rolled_back}
        row = self.check.execute("SELECT producer_id FROM unilog_producer").fetchone()
        assert row is not None
        producer = row[0]
        staged = self.check.execute("SELECT count(*) FROM staged_log_records").fetchone()
        assert staged == (0,), f"{staged[0] if staged else '?'} records still staged after the streamer drained"

        for c in range(CONSUMERS):
            name = f"c{c}"
            rows = self.check.execute(
                "SELECT producer, seq, n FROM applied WHERE consumer = %s ORDER BY ord", (name,)
            ).fetchall()
            counts = Counter(n for _, _, n in rows)
            twice = sorted(n for n, times in counts.items() if times > 1)
            assert not twice, f"{name} applied records more than once: {twice}"
            wrong = sorted(set(counts) & rolled_back)
            assert not wrong, f"{name} applied rolled-back records {wrong}"
            missing = sorted(committed - set(counts))
            assert not missing, f"{name} never applied committed records {missing}"
            assert set(counts) <= committed, f"{name} applied records nobody emitted: {sorted(set(counts) - committed)}"
            assert {p for p, _, _ in rows} <= {producer}, f"{name} applied records of unknown producers"
            seqs = [seq for _, seq, _ in rows]
            assert sorted(seqs) == list(range(1, len(expected) + 1)), f"{name} positions are not 1..N: {seqs}"
            assert seqs == sorted(seqs), f"{name} applied positions out of order: {seqs}"
            got = [n for _, _, n in rows]
            assert got == expected, f"{name} applied records in order {got}, the stream's order is {expected}"
            cp = self.check.execute("SELECT positions FROM unilog_checkpoints WHERE name = %s", (name,)).fetchone()
            assert cp is not None
            want = {producer: [1, len(expected)]} if expected else {}
            assert cp[0] == want, f"{name} checkpoint positions {cp[0]}, expected {want}"

        # the stream itself: deduplicated by position (what every consumer does), a contiguous run ending at N
        client = redis.Redis.from_url(self.settings.redis_url)
        try:
            entries: Any = client.xrange(STREAM)
        finally:
            client.close()
        firsts: list[tuple[int, int]] = []
        for _, fields in entries:
            seq = int(fields[b"seq"])
            if not firsts or seq > firsts[-1][0]:
                firsts.append((seq, json.loads(fields[b"data"])["n"]))
        assert bool(firsts) == bool(expected), f"stream holds {len(entries)} entries for {len(expected)} records"
        if expected:
            top = len(expected)
            assert [s for s, _ in firsts] == list(range(top - len(firsts) + 1, top + 1)), f"stream positions {firsts}"
            assert [n for _, n in firsts] == expected[top - len(firsts) :], f"stream records {firsts}"


@hypothesis_settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=DERANDOMIZE,
    database=None,  # keep .hypothesis/ out of the repository; a failure prints its steps and a reproduce blob
    print_blob=True,
)
@pytest.mark.slow(light=True)  # over 8 s: the default run stays near 12 minutes; .ci/run runs it
@given(steps=steps_strategy, finish=finish_strategy)
def test_interleavings_apply_every_committed_record_exactly_once_in_order(
    unilog_postgres: PostgresHandle,
    unilog_template: str,
    unilog_redis: RedisHandle,
    steps: list[Step],
    finish: list[bool],
) -> None:
    url = create_database(unilog_postgres, unilog_template)
    try:
        client = redis.Redis.from_url(unilog_redis.url)
        try:
            client.flushdb()
        finally:
            client.close()
        pipeline = Pipeline(Settings(database_url=url, redis_url=unilog_redis.url, stream=STREAM))
        try:
            for step in steps:
                pipeline.run(step)
            pipeline.finish(finish)
            pipeline.check_final()
            event(f"committed records: {len(pipeline.committed) // 10 * 10}+")
            event(f"steps: {len(steps) // 10 * 10}+")
        finally:
            pipeline.close()
    finally:
        drop_database(unilog_postgres, url)
