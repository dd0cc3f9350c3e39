"""Several producer databases into one stream, and a producer database restored into a new cluster (a new epoch)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from handlers import APPLIED_DDL, record_applied

from unilog import Consumer, ConsumerConfig, Record, Settings, Streamer, StreamerConfig, emit
from unilog.harness.embedded import EmbeddedPostgres
from unilog.harness.pytest_plugin import PostgresHandle, create_database, drop_database
from unilog.ops.schema import migrate


def stage(url: str, tag: str, n: int) -> None:
    with psycopg.connect(url) as conn:
        for i in range(n):
            emit(conn, action="create", object="ride", data={"n": i, "tag": tag}, stream="shared")
        conn.commit()


def applied(url: str) -> list[tuple[str, int]]:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT data->>'tag', (data->>'n')::int FROM applied ORDER BY 1, 2").fetchall()


def handler(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
    record_applied("c", conn, records)


def test_two_producer_databases_share_one_stream(
    unilog_postgres: PostgresHandle, unilog_template: str, unilog_redis_url: str
) -> None:
    urls = [create_database(unilog_postgres, unilog_template) for _ in range(3)]
    try:
        app_a, app_b, consumer_db = urls
        with psycopg.connect(consumer_db, autocommit=True) as conn:
            conn.execute(APPLIED_DDL)
        stage(app_a, "a", 3)
        stage(app_b, "b", 5)
        for url in (app_a, app_b):
            with Streamer(Settings(url, unilog_redis_url, "shared"), StreamerConfig(batch_size=2)) as s:
                s.drain()
        # both producers used seqs 1, 2, 3: one producer's positions must not shadow the other's
        consumer = Consumer(Settings(consumer_db, unilog_redis_url, "shared"), ConsumerConfig(name="c"), handler)
        with consumer:
            consumer.drain()
            positions = consumer.checkpoint.positions
        assert applied(consumer_db) == [("a", i) for i in range(3)] + [("b", i) for i in range(5)]
        assert sorted(seq for _, seq in positions.values()) == [3, 5]
        # more from A after B: still applied, and nothing twice
        stage(app_a, "a", 2)
        with Streamer(Settings(app_a, unilog_redis_url, "shared")) as s:
            s.drain()
        with consumer:
            consumer.drain()
        assert len(applied(consumer_db)) == 10
    finally:
        for url in urls:
            drop_database(unilog_postgres, url)


@pytest.mark.slow(light=True)
def test_restore_into_a_new_cluster_starts_a_new_epoch(settings: Settings, tmp_path: Path, rds: Any) -> None:
    """pg_dump a producer database with staged records, restore it into another cluster, keep streaming."""
    stage(settings.database_url, "before", 4)
    with Streamer(settings.with_(stream="shared")) as s:
        s.drain()
    stage(settings.database_url, "staged-at-dump", 3)  # committed, not yet streamed when the dump is taken
    with EmbeddedPostgres() as other:
        bin_dir = other.binaries.bin_dir
        dump = tmp_path / "app.dump"
        subprocess.run([str(bin_dir / "pg_dump"), "-Fc", "-f", str(dump), settings.conninfo], check=True)
        with psycopg.connect(other.url, autocommit=True) as admin:
            admin.execute("CREATE DATABASE restored")
        restored = other.url_for("restored")
        subprocess.run([str(bin_dir / "pg_restore"), "-d", restored, str(dump)], check=True)
        migrate(restored)  # already at head: a no-op, as a deploy would run it
        new = settings.with_(database_url=restored, stream="shared")
        with Streamer(new) as s:
            assert s.drain() == 3, "rows staged in the old cluster are published from the new one"
        stage(restored, "after", 2)
        with Streamer(new) as s:
            assert s.drain() == 2
        entries = [f for _, f in rds.xrange("shared")]
        assert [(f["epoch"], f["seq"]) for f in entries] == [
            ("1", "1"),
            ("1", "2"),
            ("1", "3"),
            ("1", "4"),
            ("2", "1"),
            ("2", "2"),
            ("2", "3"),
            ("2", "4"),
            ("2", "5"),
        ]
        consumer = Consumer(settings.with_(stream="shared"), ConsumerConfig(name="c"), handler)
        with consumer:
            consumer.drain()
        tags = [tag for tag, _ in applied(settings.database_url)]
        assert tags.count("before") == 4 and tags.count("staged-at-dump") == 3 and tags.count("after") == 2
