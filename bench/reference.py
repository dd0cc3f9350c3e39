"""Python ports of the reference design ("Unified Rocket Rides", streamer.rb and consumer.rb), for comparison.

Faithful to the Ruby code in what costs time: the streamer reads ``ORDER BY id LIMIT 1000`` in a REPEATABLE READ
transaction, decodes each ``data`` (jsonb) and re-encodes it (``JSON.generate``), sends one ``XADD stream * data
<json>`` per record inside one ``MULTI``/``EXEC``, then deletes and commits; the consumer reads ``XRANGE`` from its
checkpoint + 1 with ``COUNT 1000``, parses every record, skips ride ids at or below its last one, adds distances and
saves state and checkpoint in the same transaction. Both sleep 5 s after a pass that found nothing.

Deliberate differences, each noted where it happens:

* the streamer's backlog bug is FIXED: it deletes exactly the ids it sent, not ``id <= last id`` (which also
  deleted rows of transactions that committed late with a lower id, never streamed);
* no ``MAXLEN ~ 10000`` on ``XADD``, so stream lengths are checkable against what was staged;
* no per-record ``$stdout.puts`` and no injected faults (double-sends, crashes);
* it reads unilog's ``staged_log_records`` (a superset of the reference table: same rows, same primary key), so both
  streamers drain identical data from an identical table.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import redis

BATCH_SIZE = 1000
SLEEP_DURATION = 5.0

SELECT_BATCH = "SELECT id, action, object, data FROM staged_log_records ORDER BY id LIMIT %s"
DELETE_EXACT = "DELETE FROM staged_log_records WHERE id = ANY(%s)"

OnRecord = Callable[[str, dict[str, Any]], None]  # (stream entry id, data)


def _repeatable_read(url: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(url)
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    return conn


def increment(redis_id: str) -> str:
    """The reference's ``Consumer.increment``: the stream id right after ``redis_id``."""
    ms, sep, seq = redis_id.partition("-")
    if not sep:
        raise ValueError("Expected ID to contain sequence")
    return f"{ms}-{int(seq) + 1}"


def _poll_loop(run_once: Callable[[], int], stop: Any) -> None:
    """The reference's ``run``: loop; after a pass that did nothing, sleep SLEEP_DURATION (stoppable here)."""
    while not stop.is_set():
        if run_once() == 0:
            stop.wait(SLEEP_DURATION)


class ReferenceStreamer:
    """``streamer.rb`` with exact-id deletes."""

    def __init__(self, database_url: str, redis_url: str, stream: str, batch_size: int = BATCH_SIZE) -> None:
        self.conn = _repeatable_read(database_url)
        self.redis = redis.Redis.from_url(redis_url)
        self.stream = stream
        self.batch_size = batch_size

    def run_once(self) -> int:
        with self.conn.transaction():
            rows = self.conn.execute(SELECT_BATCH, (self.batch_size,)).fetchall()
            if not rows:
                return 0
            pipe = self.redis.pipeline(transaction=True)  # RDB.multi
            for _id, _action, _object, data in rows:
                # no MAXLEN ~ 10000 (see the module docstring); JSON.generate(data) is compact JSON
                pipe.xadd(self.stream, {"data": json.dumps(data, separators=(",", ":"))})
            pipe.execute()
            # FIXED: the reference deletes `id <= records.last.id`
            self.conn.execute(DELETE_EXACT, ([r[0] for r in rows],))
        return len(rows)

    def drain(self) -> int:
        total = 0
        while n := self.run_once():
            total += n
        return total

    def run(self, stop: threading.Event | Any) -> None:
        _poll_loop(self.run_once, stop)

    def close(self) -> None:
        self.conn.close()
        self.redis.close()


class ReferenceConsumer:
    """``consumer.rb``: distance totals, with ``on_record`` called for each record consumed (the latency probe)."""

    def __init__(
        self,
        database_url: str,
        redis_url: str,
        stream: str,
        name: str,
        on_record: OnRecord | None = None,
        batch_size: int = BATCH_SIZE,
    ) -> None:
        self.conn = psycopg.connect(database_url)
        self.redis = redis.Redis.from_url(redis_url)
        self.stream = stream
        self.name = name
        self.on_record = on_record
        self.batch_size = batch_size

    def run_once(self) -> int:
        with self.conn.transaction():
            row = self.conn.execute(
                "SELECT last_redis_id, last_ride_id FROM ref_checkpoints WHERE name = %s", (self.name,)
            ).fetchone()
            start = "-" if row is None else increment(row[0])
            records = self.redis.xrange(self.stream, start, "+", count=self.batch_size)
            if not records:
                return 0
            return self._consume(records, row[1] if row else 0)

    def _consume(self, records: list[Any], last_ride_id: int) -> int:
        state = self.conn.execute(
            "SELECT total_distance FROM ref_consumer_states WHERE name = %s", (self.name,)
        ).fetchone()
        total = state[0] if state else 0.0
        consumed, last_redis_id = 0, None
        for redis_id, fields in records:
            data = json.loads(fields[b"data"])
            if data["id"] <= last_ride_id:
                continue  # a double-send
            total += data["distance"]
            last_redis_id, last_ride_id = redis_id.decode(), data["id"]
            if self.on_record is not None:
                self.on_record(last_redis_id, data)
            consumed += 1
        self.conn.execute(
            "INSERT INTO ref_consumer_states (name, total_distance) VALUES (%s, %s) "
            "ON CONFLICT (name) DO UPDATE SET total_distance = excluded.total_distance",
            (self.name, total),
        )
        if last_redis_id is not None:
            self.conn.execute(
                "INSERT INTO ref_checkpoints (name, last_redis_id, last_ride_id) VALUES (%s, %s, %s) "
                "ON CONFLICT (name) DO UPDATE SET last_redis_id = excluded.last_redis_id, "
                "last_ride_id = excluded.last_ride_id",
                (self.name, last_redis_id, last_ride_id),
            )
        return consumed

    def drain(self) -> int:
        total = 0
        while n := self.run_once():
            total += n
        return total

    def run(self, stop: threading.Event | Any) -> None:
        _poll_loop(self.run_once, stop)

    def close(self) -> None:
        self.conn.close()
        self.redis.close()


class PgOnlyDrainer:
    """The Postgres half of the reference streamer alone: REPEATABLE READ, ``ORDER BY id LIMIT n``, delete exactly
    those ids, commit. ``data`` is fetched as text (no JSON decoding), so this is the floor any streamer that reads
    and deletes through Postgres pays."""

    def __init__(self, database_url: str, batch_size: int = BATCH_SIZE) -> None:
        self.conn = _repeatable_read(database_url)
        self.batch_size = batch_size

    def run_once(self) -> int:
        with self.conn.transaction():
            rows = self.conn.execute(
                "SELECT id, action, object, data::text FROM staged_log_records ORDER BY id LIMIT %s",
                (self.batch_size,),
            ).fetchall()
            if rows:
                self.conn.execute(DELETE_EXACT, ([r[0] for r in rows],))
        return len(rows)

    def drain(self) -> int:
        total = 0
        while n := self.run_once():
            total += n
        return total

    def close(self) -> None:
        self.conn.close()
