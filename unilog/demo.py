"""``unilog demo``: the core pipeline end to end on embedded Postgres and Redis, with faults injected.

It starts throw-away servers, migrates, and runs one streamer and two checkpoint consumers in threads while a
producer stages ride records; the streamer double-sends 10 % of its batches and each consumer crashes 10 % of the
time before committing, as in the reference design. At the end everything drains and each consumer's total,
count and checksum is compared with the canonical ``rides`` table. Returns whether they all agree.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from .config import Settings
from .consumer import Consumer, ConsumerConfig, Record
from .embedded import EmbeddedPostgres, EmbeddedRedis
from .faults import FaultConfig, Faults
from .producer import emit
from .schema import migrate
from .streamer import Streamer

DEMO_DDL = """
CREATE TABLE IF NOT EXISTS rides (id BIGSERIAL PRIMARY KEY, distance_mm BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS consumer_states (
    name TEXT PRIMARY KEY, total_distance_mm BIGINT NOT NULL, ride_count BIGINT NOT NULL, checksum BIGINT NOT NULL
);
"""

# Sum of ride ids times a large odd constant, mod 2^63: order-independent, and a lost or doubled ride changes it.
CHECKSUM_SQL = "(sum((id * 2654435761) % 9223372036854775807) % 9223372036854775807)::bigint"


def distance_handler(name: str) -> Any:
    """The reference design's distance consumer, in exact units (millimetres) plus a count and a checksum."""

    def handle(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
        total = count = checksum = 0
        for record in records:
            total += record.data["distance_mm"]
            count += 1
            checksum += record.data["id"] * 2654435761 % 9223372036854775807
        conn.execute(
            """
            INSERT INTO consumer_states AS s (name, total_distance_mm, ride_count, checksum)
            VALUES (%s, %s, %s, %s)
            ON CONFLICT (name) DO UPDATE SET total_distance_mm = s.total_distance_mm + excluded.total_distance_mm,
                ride_count = s.ride_count + excluded.ride_count,
                checksum = mod(s.checksum::numeric + excluded.checksum, 9223372036854775807)::bigint
            """,
            (name, total, count, checksum % 9223372036854775807),
        )

    return handle


def run_demo(*, duration: float = 30.0, rate: float = 200.0, seed: int | None = None) -> bool:
    """Run the demo for ``duration`` seconds; print a verdict line; return True if every consumer agrees."""
    rng = random.Random(seed)
    with EmbeddedPostgres() as pg, EmbeddedRedis() as rd:
        migrate(pg.url)
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute(DEMO_DDL)
        settings = Settings(database_url=pg.url, redis_url=rd.url, stream="rocket-rides-log")
        streamer = Streamer(settings, faults=Faults(FaultConfig({"streamer.double_send": 0.1}, seed)))
        consumers = [
            Consumer(
                settings,
                ConsumerConfig(name=f"consumer{i}", block_ms=200),
                distance_handler(f"consumer{i}"),
                faults=Faults(FaultConfig({"consumer.crash_before_commit": 0.1}, None if seed is None else seed + i)),
            )
            for i in range(2)
        ]
        stop = threading.Event()
        loops = [streamer.run, *(c.run for c in consumers)]
        threads = [threading.Thread(target=loop, args=(stop,), daemon=True) for loop in loops]
        for t in threads:
            t.start()
        produced = _produce(pg.url, rate, duration, rng)
        ok = _settle(pg.url, [c.config.name for c in consumers], produced)
        stop.set()
        for t in threads:
            t.join(10)
        faults = sum(sum(f.counts.values()) for f in (streamer.faults, *(c.faults for c in consumers)))
        verdict = "AGREE" if ok else "DISAGREE"
        print(
            f"unilog demo: {produced} rides, {faults} faults injected; "
            f"every consumer equals the canonical totals: {verdict}"
        )
        streamer.close()
        for c in consumers:
            c.close()
        return ok


def _produce(url: str, rate: float, duration: float, rng: random.Random) -> int:
    produced, deadline = 0, time.monotonic() + duration
    with psycopg.connect(url) as conn:
        while time.monotonic() < deadline:
            with conn.transaction():
                distance = rng.randint(1, 1_000_000)
                ride_id = conn.execute(
                    "INSERT INTO rides (distance_mm) VALUES (%s) RETURNING id", (distance,)
                ).fetchone()
                assert ride_id is not None
                emit(conn, action="create", object="ride", data={"id": ride_id[0], "distance_mm": distance})
            produced += 1
            time.sleep(rng.expovariate(rate))
    return produced


def _settle(url: str, names: list[str], produced: int, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        canonical = conn.execute(
            f"SELECT coalesce(sum(distance_mm), 0), count(*), coalesce({CHECKSUM_SQL}, 0) FROM rides"
        ).fetchone()
        while True:
            states = {
                r[0]: tuple(r[1:])
                for r in conn.execute("SELECT name, total_distance_mm, ride_count, checksum FROM consumer_states")
            }
            if all(states.get(n) == canonical for n in names) or time.monotonic() > deadline:
                return all(states.get(n) == canonical for n in names)
            time.sleep(0.2)
