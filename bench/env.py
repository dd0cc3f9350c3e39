"""The benchmark's servers and the database operations every workload shares (reset, stage, Redis housekeeping)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import psycopg
import redis

from unilog import Settings
from unilog.harness.embedded import EmbeddedPostgres, EmbeddedRedis
from unilog.ops.schema import migrate

DB_NAME = "bench"
DEFAULT_STREAM = "rides"

# The reference design's consumer tables (schema.sql of Unified Rocket Rides, prefixed), the business table the
# `produce` workload writes (and its plain-outbox floor), and the state row of the unilog "distance" handler.
BENCH_DDL = (
    """CREATE TABLE IF NOT EXISTS ref_checkpoints (
        id BIGSERIAL PRIMARY KEY, name TEXT NOT NULL UNIQUE, last_redis_id TEXT NOT NULL, last_ride_id BIGINT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS ref_consumer_states (
        id BIGSERIAL PRIMARY KEY, name TEXT NOT NULL UNIQUE, total_distance DOUBLE PRECISION NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS bench_rides (
        id BIGSERIAL PRIMARY KEY, created_at TIMESTAMPTZ NOT NULL DEFAULT now(), distance DOUBLE PRECISION NOT NULL
    )""",
    "CREATE TABLE IF NOT EXISTS bench_outbox (id BIGSERIAL PRIMARY KEY, data JSONB NOT NULL)",
    """CREATE TABLE IF NOT EXISTS bench_state (
        name TEXT PRIMARY KEY, total_distance DOUBLE PRECISION NOT NULL DEFAULT 0, n BIGINT NOT NULL DEFAULT 0
    )""",
)

RESET_TABLES = (
    "staged_log_records",
    "unilog_stream_positions",
    "unilog_claims",  # a failed trial's saved claims would be re-sent by the next
    "unilog_checkpoints",
    "ref_checkpoints",
    "ref_consumer_states",
    "bench_rides",
    "bench_outbox",
    "bench_state",
)

# ~80 bytes of JSON per record, as Postgres's jsonb prints it back (keys re-ordered, a space after ':' and ',').
# Through unilog_stage, as emit stages: a row in table mode, a logical message in WAL capture mode.
STAGE_SQL = """
    SELECT count(unilog_stage('create', 'ride',
           jsonb_build_object('id', g, 'distance', round((g %% 100000) / 1000.0 + 1, 3),
                              'rider', 'r-' || lpad((g %% 10000)::text, 4, '0'),
                              'pilot', 'p-' || lpad((g %% 100)::text, 2, '0'))::text,
           (%s::text[])[1 + g %% cardinality(%s::text[])], NULL, NULL, NULL))
    FROM generate_series(%s::int, %s::int) AS g
"""
STAGE_TRANSACTION = 1000  # records per transaction, as a producer emitting in transactions of 1,000


def payload(i: int) -> str:
    """The JSON of record ``i`` as the producer-side workloads and ``redis_only`` write it (~64-80 bytes)."""
    distance = (i % 100000) / 1000 + 1
    return f'{{"id":{i},"distance":{distance:.3f},"rider":"r-{i % 10000:04d}","pilot":"p-{i % 100:02d}"}}'


@dataclass(frozen=True)
class Urls:
    """Where the servers are; picklable, handed to worker processes."""

    database: str
    redis: str
    stream: str = DEFAULT_STREAM

    def settings(self) -> Settings:
        return Settings.from_dsn(self.database, self.redis, stream=self.stream)


class BenchEnv:
    """A throw-away Postgres (fsync on) and Redis (AOF, fsync always) with unilog migrated into database ``bench``."""

    def __init__(self) -> None:
        self.pg = EmbeddedPostgres(fsync=True)
        # auto-rewrite off: an AOF rewrite forking mid-trial is noise; the AOF is rewritten between trials instead.
        self.redis = EmbeddedRedis(appendonly=True, appendfsync="always", settings={"auto-aof-rewrite-percentage": "0"})
        self.urls = Urls("", "")
        self._admin: psycopg.Connection[Any] | None = None
        self._rds: redis.Redis | None = None

    def start(self) -> BenchEnv:
        self.pg.start()
        self.redis.start()
        with psycopg.connect(self.pg.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DB_NAME}")
        self.urls = Urls(self.pg.url_for(DB_NAME), self.redis.url)
        migrate(self.urls.database)
        for ddl in BENCH_DDL:
            self.admin.execute(ddl)
        return self

    def stop(self) -> None:
        for closeable in (self._admin, self._rds):
            if closeable is not None:
                closeable.close()
        self.redis.stop(cleanup=True)
        self.pg.stop(cleanup=True)

    @property
    def admin(self) -> psycopg.Connection[Any]:
        """An autocommit connection to the bench database."""
        if self._admin is None or self._admin.closed:
            self._admin = psycopg.connect(self.urls.database, autocommit=True)
        return self._admin

    @property
    def rds(self) -> redis.Redis:
        if self._rds is None:
            self._rds = redis.Redis.from_url(self.urls.redis, socket_timeout=300)
        return self._rds

    def reset(self, *, keep_redis: bool = False) -> None:
        """Empty every table a workload writes and (unless ``keep_redis``) Redis, then compact the AOF."""
        self.admin.execute("TRUNCATE " + ", ".join(RESET_TABLES))
        if not keep_redis:
            self.rds.flushall()
            self.compact_aof()

    def compact_aof(self) -> None:
        """Rewrite the AOF now and wait for it, so no rewrite or huge AOF carries into the next trial."""
        self.rds.bgrewriteaof()
        time.sleep(0.05)
        while int(self.rds.info("persistence")["aof_rewrite_in_progress"]):
            time.sleep(0.05)

    def stage(self, count: int, streams: list[str] | None = None, per_transaction: int = STAGE_TRANSACTION) -> None:
        """Stage ``count`` records as ``emit`` does, in transactions of ``per_transaction`` (spread round-robin over
        ``streams``; default: the default stream, staged as ''), then VACUUM ANALYZE and CHECKPOINT so neither runs
        inside the timed part."""
        names = streams or [""]
        for lo in range(1, count + 1, per_transaction):
            self.admin.execute(STAGE_SQL, (names, names, lo, min(count, lo + per_transaction - 1)))
        self.settle()

    def settle(self) -> None:
        self.admin.execute("VACUUM ANALYZE")
        self.admin.execute("CHECKPOINT")

    def staged(self) -> int:
        row = self.admin.execute("SELECT count(*) FROM staged_log_records").fetchone()
        return int(row[0]) if row else 0

    def xlen(self, stream: str) -> int:
        return int(self.rds.xlen(stream))

    @property
    def postmaster_pid(self) -> int | None:
        """The local server's postmaster pid (the embedded one's), for reading its memory; None if unknown."""
        return self.pg.pid

    def postgres_setting(self, name: str) -> str:
        row = self.admin.execute("SELECT current_setting(%s)", (name,)).fetchone()
        return str(row[0]) if row else "?"
