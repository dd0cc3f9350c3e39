"""unilog on Spark (local[2], one session for the whole test session): the source, the transactional sink, and the
Spark distance consumer killed mid-batch and restarted, with and without its checkpoint folder."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

pytest.importorskip("pyspark")

from clusters import embedded_cluster
from unilog_demo.migrate import prepare
from unilog_demo.records import RideCreated
from unilog_demo.rides import STREAM, canonical_totals, consumer_totals
from unilog_demo.spark_consumer import start_query, state_effect

from unilog import Faults, RawJSON, Settings, Streamer, emit, store
from unilog.spark import TransactionalSink, spark_session
from unilog.spark.source import SourceOptions
from unilog.spark.streams import UnilogStreamsReader
from unilog.wire import registry_key

# Spark starts in about 12 s here and its tests take over a minute more: the whole suite (`pytest -m ""`, .ci/run) runs them
pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = spark_session("unilog-tests", "local[2]", {"spark.sql.shuffle.partitions": "1"})
    yield session
    session.stop()


def rides(settings: Settings, n: int) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(n):
            distance = Decimal(i % 1000) / 8
            ride = conn.execute("INSERT INTO rides (distance) VALUES (%s) RETURNING id", (distance,)).fetchone()
            emit(conn, RideCreated(id=ride[0], distance=distance))
        conn.commit()


@pytest.fixture
def app(settings: Settings) -> Settings:
    prepare(settings.database_url)
    return settings.with_(stream=STREAM)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    yield from embedded_cluster()


@pytest.fixture(params=["redis", "redis-cluster"])
def on(request: pytest.FixtureRequest, app: Settings, rds: Any) -> tuple[Settings, Any]:
    """The app's settings and a raw client, on the suite's Redis or on a real Redis Cluster (emptied)."""
    if request.param == "redis":
        return app, rds
    cluster = request.getfixturevalue("cluster")
    client = redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    client.flushall(target_nodes=redis.RedisCluster.PRIMARIES)
    request.addfinalizer(client.close)
    return app.with_(redis_url=cluster.cluster_url), client


def test_batch_read_is_split_by_entry_count(spark: Any, app: Settings) -> None:
    rides(app, 2500)
    Streamer(app).drain()
    df = (
        spark.read.format("unilog")
        .option("redisUrl", app.redis_url)
        .option("stream", STREAM)
        .option("entriesPerPartition", "1000")
        .load()
    )
    assert df.rdd.getNumPartitions() == 3, "3 ranges of at most 1000 entries: cut by count, not by time"
    two_slots = df.sparkSession.read.format("unilog").options(**{"redisUrl": app.redis_url, "stream": STREAM})
    assert two_slots.option("entriesPerPartition", "1000").option("minPartitions", "2").load().count() == 2500
    rows = df.orderBy("seq").collect()
    assert [r["seq"] for r in rows] == list(range(1, 2501))
    assert rows[0]["action"] == "create" and rows[0]["object"] == "ride" and rows[0]["producer"]
    assert rows[0]["type"] == "RideCreated@1" and json.loads(rows[0]["data"])["distance"] == "0", "an exact string"


def test_the_data_column_reads_every_digit_with_a_decimal_schema(spark: Any, app: Settings) -> None:
    """``data`` is the record's JSON text as staged; ``from_json`` with a ``DECIMAL`` field reads a long fraction
    exactly (issue 34: a float would keep 16 digits). Integers past 64 bits need ``DECIMAL(38, 0)`` too."""
    from pyspark.sql.functions import col, from_json

    text = '{"amount": 0.33333333333333333333, "big": 12345678901234567890123456789}'
    with psycopg.connect(app.conninfo) as conn:
        emit(conn, action="pay", object="payment", data=RawJSON(text), stream=STREAM)
        conn.commit()
    Streamer(app).drain()
    df = spark.read.format("unilog").option("redisUrl", app.redis_url).option("stream", STREAM).load()
    parsed = df.select(from_json(col("data"), "amount DECIMAL(38, 20), big DECIMAL(38, 0)").alias("d")).collect()
    assert parsed[0]["d"]["amount"] == Decimal("0.33333333333333333333")
    assert parsed[0]["d"]["big"] == Decimal("12345678901234567890123456789")


def test_the_reader_gives_typed_records_their_type_and_reads_them_typed(spark: Any, app: Settings) -> None:
    """The ``type`` column holds a typed entry's ``name@version`` (null for an untyped one), and
    ``unilog.spark.typed`` reads a row as its class on the executors, v1 through its upcaster, ``Decimal`` exact."""
    from typed_records import RideCreated, RideCreatedV1

    from unilog.spark import typed

    spark.sparkContext.addPyFile(str(Path(__file__).with_name("typed_records.py")))  # the executors import it too
    ride = "00000000-0000-4000-8000-000000000009"
    with psycopg.connect(app.conninfo) as conn:
        emit(conn, RideCreatedV1(ride_id=ride, name="ann", fare=Decimal("7.10")))  # type: ignore[arg-type]
        emit(conn, RideCreated(ride_id=ride, rider="bob", fare=Decimal("0.33333333333333333333")))  # type: ignore[arg-type]
        emit(conn, action="noted", object="ride", data={"untyped": True}, stream="typed-rides")
        conn.commit()
    Streamer(app.with_(stream="typed-rides")).drain()
    df = spark.read.format("unilog").option("redisUrl", app.redis_url).option("stream", "typed-rides").load()
    assert [r["type"] for r in df.orderBy("id").collect()] == ["TypedRide@1", "TypedRide@2", None]

    def fares(rows: Any) -> Any:  # runs on the executors: each row read as the consumer's class
        for row in rows:
            if row["type"]:
                yield (str(typed(RideCreated, row).rider), str(typed(RideCreated, row).fare))

    read = sorted(df.rdd.mapPartitions(fares).collect())
    assert read == [("ann", "7.10"), ("bob", "0.33333333333333333333")]


def test_a_batch_is_cut_into_equal_ranges_a_multiple_of_min_partitions() -> None:
    from unilog.spark.source import SourceOptions, split_ranges

    ids = [f"1-{i}" for i in range(1, 50_001)]
    options = SourceOptions.parse(
        {"redisUrl": "redis://x", "stream": "s", "minPartitions": "2", "entriesPerPartition": "10000"}
    )
    ranges = split_ranges(options, "0-0", ids)
    assert len(ranges) == 6, "5 ranges of 10,000 would leave one of 2 slots idle through the last wave"
    assert [r.after for r in ranges] == ["0-0"] + [r.until for r in ranges[:-1]] and ranges[-1].until == ids[-1]
    sizes = [int(r.until.split("-")[1]) - int(r.after.split("-")[1]) for r in ranges]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 50_000
    assert len(split_ranges(options, "0-0", ids[:1])) == 1 and split_ranges(options, "0-0", []) == []
    assert len(split_ranges(options, "0-0", ids[:50])) == 1, "a small batch is not cut into a task per slot"
    assert len(split_ranges(options, "0-0", ids[:2000])) == 2


def test_several_streams_small_ones_share_a_task_and_the_options_refuse_a_mix() -> None:
    """A task per stream of a few entries costs more than it reads (1,000 streams of 10 entries were 1,000 tasks):
    small streams share tasks of about ``entriesPerPartition`` entries, a large one is cut as one stream is."""
    from unilog.errors import ConfigurationError
    from unilog.spark.source import SourceOptions
    from unilog.spark.streams import Ranges, pack

    options = SourceOptions.parse({"redisUrl": "redis://x", "streamPrefix": "t-", "entriesPerPartition": "2500"})
    assert options.many and options.stream_prefix == "t-" and options.stream == ""
    found = {f"t-{n:04}": [f"1-{i}" for i in range(1, 11)] for n in range(1000)}
    found["t-big"] = [f"2-{i}" for i in range(1, 6001)]
    tasks = pack(options, dict.fromkeys(found, "0-0"), found)
    bundles = [t for t in tasks if isinstance(t, Ranges)]
    assert len(bundles) == 4, "10,000 entries of small streams in tasks of 2,500"
    assert sorted(r.stream for b in bundles for r in b.ranges) == sorted(s for s in found if s != "t-big")
    assert all(r.until == "1-10" and r.after == "0-0" for b in bundles for r in b.ranges)
    big = [t for t in tasks if not isinstance(t, Ranges)]
    assert len(big) == 3 and {t.stream for t in big} == {"t-big"} and big[-1].until == "2-6000"
    many = SourceOptions.parse({"redisUrl": "redis://x", "streams": "a, b,,c"})
    assert many.streams == ("a", "b", "c")
    with pytest.raises(ConfigurationError, match="stream, or streams"):
        SourceOptions.parse({"redisUrl": "redis://x", "stream": "a", "streams": "b"})


def test_the_options_refuse_a_stream_id_redis_would_refuse_each_time() -> None:
    """Refused once, at the query's start: the source's calls wait out their servers, not a bad option."""
    from unilog.errors import ConfigurationError

    base = {"redisUrl": "redis://x", "stream": "a"}
    with pytest.raises(ConfigurationError, match=r"startingId must be a stream id such as .* or beginning, not '\$'"):
        SourceOptions.parse(base | {"startingId": "$"})
    with pytest.raises(ConfigurationError, match="endingId must be a stream id such as 1700000000000-3, not 'end'"):
        SourceOptions.parse(base | {"endingId": "end"})
    fine = SourceOptions.parse(base | {"startingId": "1700000000000-3", "endingId": "1700000000001"})
    assert (fine.starting_id, fine.ending_id) == ("1700000000000-3", "1700000000001")
    assert SourceOptions.parse(base | {"startingId": "beginning"}).starting_id == "0-0"


def test_double_sent_batches_are_applied_once(spark: Any, app: Settings, tmp_path: Path) -> None:
    rides(app, 300)
    with Streamer(app, faults=Faults.scripted(streamer__double_send=[True])) as streamer:
        streamer.drain()
    query = start_query(spark, "spark-dd", app.database_url, app.redis_url, str(tmp_path / "chk"), once=True)
    query.awaitTermination()
    with psycopg.connect(app.conninfo) as conn:
        assert consumer_totals(conn)["spark-dd"] == canonical_totals(conn)
        last_id = conn.execute("SELECT last_id FROM unilog_checkpoints WHERE name = 'spark-dd'").fetchone()[0]
    [(top, _)] = redis.Redis.from_url(app.redis_url).xrevrange(STREAM, count=1)
    assert last_id == top.decode(), "the checkpoint ends at the stream's last entry"


def test_sink_skips_by_position_when_the_spark_checkpoint_is_lost(spark: Any, app: Settings, tmp_path: Path) -> None:
    rides(app, 200)
    Streamer(app).drain()
    start_query(spark, "spark-lost", app.database_url, app.redis_url, str(tmp_path / "a"), once=True).awaitTermination()
    # a fresh checkpoint folder and an explicit start at the beginning: every entry comes again, none is applied twice
    df = (
        spark.readStream.format("unilog")
        .option("redisUrl", app.redis_url)
        .option("stream", STREAM)
        .option("startingId", "beginning")
        .load()
    )
    sink = TransactionalSink(app.database_url, "spark-lost", STREAM, state_effect("spark-lost"))
    (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "b"))
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )
    with psycopg.connect(app.conninfo) as conn:
        assert consumer_totals(conn)["spark-lost"] == canonical_totals(conn)


def run_sink_once(spark: Any, app: Settings, sink: Any, checkpoint: Path) -> None:
    df = spark.readStream.format("unilog").option("redisUrl", app.redis_url).option("stream", STREAM).load()
    (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )


def test_the_sinks_spark_work_does_not_hold_back_the_streamer(
    spark: Any, app: Settings, rds: Any, tmp_path: Path
) -> None:
    rides(app, 50)
    streamer = Streamer(app)
    streamer.drain()
    published_meanwhile: list[int] = []
    inner = state_effect("spark-h")

    def effect(conn: psycopg.Connection[Any], fresh: Any) -> None:
        if not published_meanwhile:  # the sink's transaction is open: a ride commits and must be published now
            rides(app, 1)
            published_meanwhile.append(streamer.drain(timeout=5))  # times out if the sink holds the horizon
        inner(conn, fresh)

    run_sink_once(spark, app, TransactionalSink(app.database_url, "spark-h", STREAM, effect), tmp_path / "chk")
    streamer.close()
    assert published_meanwhile == [1]
    assert rds.xlen(STREAM) == 51


def test_the_sink_reapplies_a_batch_when_another_copy_moved_the_checkpoint(
    spark: Any, app: Settings, tmp_path: Path
) -> None:
    from unilog_demo.consumer import apply_rides

    from unilog import Consumer, ConsumerConfig

    rides(app, 120)
    Streamer(app).drain()
    name, calls = "spark-twin", []
    inner = state_effect(name)

    def effect(conn: psycopg.Connection[Any], fresh: Any) -> None:
        calls.append(fresh.count())
        if len(calls) == 1:  # a Python copy of the same consumer applies everything while Spark computes
            with Consumer(app, ConsumerConfig(name=name), lambda c, r: apply_rides(name, c, r)) as twin:
                assert twin.drain() == 120
        inner(conn, fresh)

    run_sink_once(spark, app, TransactionalSink(app.database_url, name, STREAM, effect), tmp_path / "chk")
    assert calls == [120, 0], "rolled back, then re-applied against the moved checkpoint: nothing left to apply"
    with psycopg.connect(app.conninfo) as conn:
        assert consumer_totals(conn)[name] == canonical_totals(conn)


def test_the_sink_waits_out_a_postgres_restart_mid_batch(spark: Any, app: Settings, tmp_path: Path) -> None:
    """Issue 47 item 3, the Spark sink: Postgres stops in the middle of a micro-batch's transaction (a fast shutdown
    ends the sink's session with AdminShutdown) and comes back 3 s later, under a running streaming query. The sink
    waits it out on a new session and applies the batch once; the query ends normally. On a Postgres of its own:
    the suite's is never restarted."""
    import threading

    from unilog.harness.embedded import EmbeddedPostgres
    from unilog.ops.schema import migrate

    with EmbeddedPostgres() as own:
        migrate(own.url)
        prepare(own.url)
        mine = app.with_(database_url=own.url)
        rides(mine, 40)
        Streamer(mine).drain()
        name, calls = "spark-restarted", []
        inner = state_effect(name)

        def effect(conn: psycopg.Connection[Any], fresh: Any) -> None:
            calls.append(fresh.count())
            inner(conn, fresh)
            if len(calls) == 1:
                own.stop("fast")
                threading.Timer(3.0, own.start).start()
                conn.execute("SELECT 1")  # the session is gone: the attempt fails here

        started = time.monotonic()
        run_sink_once(spark, mine, TransactionalSink(own.url, name, STREAM, effect), tmp_path / "chk")
        assert time.monotonic() - started >= 3.0, "the attempt after the stop waited for the server"
        assert calls == [40, 40], "the batch rolled back with the session, then applied again once"
        with psycopg.connect(own.url) as conn:
            assert consumer_totals(conn)[name] == canonical_totals(conn)
            saved = conn.execute("SELECT count(*) FROM unilog_checkpoints WHERE name = %s", (name,)).fetchone()
            assert saved == (1,)


def test_a_running_query_waits_out_redis_down_at_its_start_and_a_restart_under_it(
    spark: Any, app: Settings, tmp_path: Path
) -> None:
    """Issue 47 item 3, the Spark source: Redis is down when the distance consumer's query starts and comes back 10 s
    later; then it restarts under the running query (down 3 s, rides staged meanwhile). Each call of the source
    waits the server out, so the query is still running afterwards, with no failure, and has applied every ride
    once (before, the first call that met the stopped server failed the query). On a Redis of its own: the suite's
    is never restarted."""
    import threading

    from unilog.harness.embedded import EmbeddedRedis

    own = EmbeddedRedis().start()
    mine = app.with_(redis_url=own.url)
    name = "spark-redis-restarts"

    def caught_up(total: int) -> bool:
        return applied_all(query, mine, name, total)

    back = threading.Timer(10.0, own.start)  # the query's first calls come within a few seconds of its start

    try:
        rides(mine, 30)
        Streamer(mine).drain()
        own.stop()
        back.start()
        query = start_query(spark, name, mine.database_url, own.url, str(tmp_path / "chk"), once=False)
        try:
            wait_until(lambda: caught_up(30), 180, "the 30 rides published before the start")
            own.stop()
            rides(mine, 20)  # staged while Redis is down; the query's calls meet the stopped server
            time.sleep(3.0)
            assert query.isActive, query.exception()
            own.start()
            Streamer(mine).drain()
            wait_until(lambda: caught_up(50), 180, "the 20 rides published after the restart")
            assert query.isActive and query.exception() is None, query.exception()
        finally:
            query.stop()
    finally:
        back.cancel()
        if back.ident is not None:  # started: a Redis it starts late must not outlive the test
            back.join()
        own.stop(cleanup=True)


def applied_all(query: Any, app: Settings, name: str, total: int) -> bool:
    """Whether consumer ``name`` applied ``total`` rides, agreeing with the canonical totals; a failed query never
    will: its failure is raised at once."""
    assert query.isActive, query.exception()
    with psycopg.connect(app.database_url) as conn:
        totals = consumer_totals(conn).get(name)
        return totals is not None and totals.ride_count == total and totals == canonical_totals(conn)


def test_a_running_query_rides_out_a_cluster_master_failing_over(
    spark: Any, app: Settings, cluster: Any, tmp_path: Path
) -> None:
    """Issue 47 item 3, the Spark source on a Redis Cluster: the master serving the stream is killed (SIGKILL) under
    the running query, its replica promoted, then the old master restarted (it rejoins as a replica). The query's
    calls wait the failover out; it is still running afterwards and has applied every ride once."""
    client = redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    client.flushall(target_nodes=redis.RedisCluster.PRIMARIES)
    client.close()
    mine, name = app.with_(redis_url=cluster.cluster_url), "spark-failover"
    rides(mine, 30)
    Streamer(mine).drain()
    query = start_query(spark, name, mine.database_url, mine.redis_url, str(tmp_path / "chk"), once=False)
    try:
        wait_until(lambda: applied_all(query, mine, name, 30), 180, "the 30 rides published before the failover")
        master = cluster.master_of(STREAM)
        replicas = cluster.replicas_of(master)
        master.kill()
        rides(mine, 20)
        cluster.wait_failover(replicas)
        Streamer(mine).drain()
        wait_until(lambda: applied_all(query, mine, name, 50), 180, "the 20 rides published after the failover")
        master.start()
        cluster.wait_replica_online(master)
        assert query.isActive and query.exception() is None, query.exception()
    finally:
        query.stop()


def wait_until(check: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.5)


def test_the_sink_gives_up_with_a_clear_error_when_the_checkpoint_keeps_moving(spark: Any, app: Settings) -> None:
    from unilog.errors import ConcurrentConsumer

    rides(app, 10)
    Streamer(app).drain()
    name, calls = "spark-contested", []
    inner = state_effect(name)

    def effect(conn: psycopg.Connection[Any], fresh: Any) -> None:
        calls.append(fresh.count())
        inner(conn, fresh)  # rolled back each time
        with psycopg.connect(app.conninfo, autocommit=True) as other:  # a copy that does not take the lock
            other.execute("UPDATE unilog_checkpoints SET last_id = %s WHERE name = %s", (f"{len(calls)}-0", name))

    batch = spark.read.format("unilog").option("redisUrl", app.redis_url).option("stream", STREAM).load()
    with pytest.raises(ConcurrentConsumer, match="moved under it three times"):
        TransactionalSink(app.database_url, name, STREAM, effect)(batch, 0)
    assert calls == [10, 10, 10]
    with psycopg.connect(app.conninfo) as conn:
        assert name not in consumer_totals(conn), "no attempt committed its effect"
        assert conn.execute("SELECT last_id FROM unilog_checkpoints WHERE name = %s", (name,)).fetchone() == ("3-0",)


def stage_over(settings: Settings, streams: list[str], n: int, start: int = 0) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(start, start + n):
            emit(conn, action="add", object="item", data={"n": i}, stream=streams[i % len(streams)])
        conn.commit()
    Streamer(settings).drain()


def test_a_query_over_several_streams_applies_every_entry_once_in_stream_order(
    spark: Any, app: Settings, rds: Any, tmp_path: Path
) -> None:
    """Issue 46: the source reads every stream of a prefix (one found between runs included) in batches that take a
    share of each, and the sink keeps a checkpoint row per stream (``<consumer>:<stream>``, a MultiConsumer's),
    saved in the effect's transaction. A second query with a fresh Spark checkpoint starts each stream after its
    row: the effect's table has a key per (stream, position), so applying any entry twice fails the batch."""
    streams, name = ["shop-a", "shop-b", "shop-c"], "spark-many"
    with psycopg.connect(app.conninfo) as conn:
        conn.execute("CREATE TABLE spark_seen (stream text, seq bigint, n int, batch int, PRIMARY KEY (stream, seq))")
        conn.commit()
    stage_over(app, streams, 90)
    batches: list[int] = []

    def effect(conn: psycopg.Connection[Any], fresh: Any) -> None:
        rows = [(r["stream"], r["seq"], json.loads(r["data"])["n"], len(batches)) for r in fresh.collect()]
        if rows:  # a batch of entries all applied before reaches the effect empty
            batches.append(len(rows))
            conn.cursor().executemany("INSERT INTO spark_seen VALUES (%s, %s, %s, %s)", rows)

    def run(checkpoint: Path, resume: bool = True) -> None:
        options = {"redisUrl": app.redis_url, "streamPrefix": "shop-"}
        if resume:  # else every entry comes again, and the sink must skip each one by its stream's position
            options |= {"consumer": name, "databaseUrl": app.database_url}
        df = spark.readStream.format("unilog").options(**options).load()
        sink = TransactionalSink(app.database_url, name, None, effect, redis_url=app.redis_url)
        query = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
        query.trigger(availableNow=True).start().awaitTermination()

    run(tmp_path / "a")
    stage_over(app, ["shop-a", "shop-d"], 30, start=90)  # shop-d: a stream the prefix finds on the next run
    options = SourceOptions.parse(
        {"redisUrl": app.redis_url, "streamPrefix": "shop-", "consumer": name, "databaseUrl": app.database_url}
    )
    after_rows = {s: rds.xrange(s, count=30)[-1][0] for s in streams}
    assert UnilogStreamsReader(options).initialOffset() == {"ids": {**after_rows, "shop-d": "0-0"}}, "after each row"
    run(tmp_path / "b")
    applied_batches = len(batches)
    run(tmp_path / "c", resume=False)
    assert len(batches) == applied_batches, "nothing applied again: every entry is at or below its stream's row"
    with psycopg.connect(app.conninfo) as conn:
        applied = dict(conn.execute("SELECT stream, array_agg(n ORDER BY seq) FROM spark_seen GROUP BY 1").fetchall())
        rows = dict(
            conn.execute("SELECT name, last_id FROM unilog_checkpoints WHERE name LIKE 'spark-many%'").fetchall()
        )
    expected = {s: [i for i in range(90) if streams[i % 3] == s] for s in streams}
    expected["shop-a"] += [i for i in range(90, 120) if i % 2 == 0]
    expected["shop-d"] = [i for i in range(90, 120) if i % 2 == 1]
    assert applied == expected, "every entry once, in stream order, the late stream from its start"
    assert rows == {f"{name}:{s}": rds.xrevrange(s, count=1)[0][0] for s in expected}, "each row at its stream's end"
    assert len(batches) >= 2, "the second run read only what came after each stream's row"
    whole = spark.read.format("unilog").options(redisUrl=app.redis_url, streamPrefix="shop-").load()
    assert whole.count() == sum(len(v) for v in expected.values()), "a batch read lists every stream's ids"
    # a consumer that ran over shop-a alone (its row named after it) is refused over the prefix until carried over
    with psycopg.connect(app.conninfo) as conn:
        store.ensure_checkpoint(conn, "spark-moved", "shop-a")
        store.save_checkpoint(conn, store.Checkpoint("spark-moved", "shop-a", after_rows["shop-a"], {}))
        conn.commit()
    df = spark.readStream.format("unilog").options(redisUrl=app.redis_url, streamPrefix="shop-").load()
    sink = TransactionalSink(app.database_url, "spark-moved", None, effect, redis_url=app.redis_url)
    query = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "d"))
    with pytest.raises(
        Exception, match=f"unilog consumer reset spark-moved:shop-a --stream shop-a --to {after_rows['shop-a']}"
    ):
        query.trigger(availableNow=True).start().awaitTermination()
    with psycopg.connect(app.conninfo) as conn:
        moved = conn.execute("SELECT count(*) FROM unilog_checkpoints WHERE name LIKE 'spark-moved:%'").fetchone()[0]
    assert moved == 0 and len(batches) == applied_batches, "no row created, nothing applied"
    held = {s: rds.hget(registry_key(s), f"{name}:{s}") for s in expected}
    assert all(held.values()), f"retention is held per stream: {held}"


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


SPARK_SESSION = "application_name = 'unilog-spark-spark0'"


@pytest.mark.slow
def test_spark_consumer_killed_mid_batch_and_restarted(app: Settings, pg: Any, tmp_path: Path) -> None:
    """SIGKILLed inside a batch (twice: restarted with its checkpoint folder, then without it), the Spark consumer
    commits nothing of that batch and, restarted, catches up with every ride applied once."""
    env = {**os.environ, "DATABASE_URL": app.database_url, "REDIS_URL": app.redis_url, "PYTHONPATH": str(ROOT)}
    checkpoint = tmp_path / "chk"

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "unilog_demo.spark_consumer", "spark0", "--checkpoint", str(checkpoint)],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def waiting_in_batch() -> bool:
        """The sink's batch transaction is writing its effect and waits for the lock the test holds."""
        row = pg.execute(
            f"SELECT count(*) FROM pg_stat_activity WHERE {SPARK_SESSION} AND state = 'active' "
            "AND wait_event_type = 'Lock' AND query LIKE '%consumer_states%'"
        ).fetchone()
        return bool(row[0])

    def session_open() -> bool:
        return bool(pg.execute(f"SELECT count(*) FROM pg_stat_activity WHERE {SPARK_SESSION}").fetchone()[0])

    def committed() -> tuple[Any, Any]:
        state = pg.execute("SELECT total_distance, ride_count, checksum FROM consumer_states WHERE name = 'spark0'")
        position = pg.execute("SELECT last_id, positions FROM unilog_checkpoints WHERE name = 'spark0'")
        return state.fetchall(), position.fetchall()

    def kill_mid_batch(proc: subprocess.Popen[bytes]) -> None:
        """The test holds a lock the batch's effect needs (SHARE on consumer_states, which the INSERT waits for), so
        the next batch waits inside its transaction (planned, its totals computed, nothing committed) until the
        SIGKILL lands there; then nothing of that batch may have committed."""
        with psycopg.connect(app.conninfo) as holder:
            holder.execute("LOCK TABLE consumer_states IN SHARE MODE")
            rides(app, 200)
            streamer.drain()
            # the consumer's first batch, after its JVM's warm-up: over 120 s at load 10
            wait_for(waiting_in_batch, 240, "a Spark batch to wait inside its transaction")
            at_kill = committed()
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            holder.rollback()  # the killed session's INSERT runs now; its transaction must end uncommitted
        wait_for(lambda: not session_open(), 30, "the killed consumer's session to end")
        assert committed() == at_kill, "the batch the kill landed in committed nothing"
        assert consumer_totals(pg).get("spark0") != canonical_totals(pg), "the batch's rides are not applied yet"

    def caught_up(what: str) -> None:
        # a restart is a new JVM and a first micro-batch: as long as the first batch above (a CI run at load 12-16
        # missed 120 s here, 2026-11-30)
        with psycopg.connect(app.conninfo, autocommit=True) as conn:
            wait_for(lambda: consumer_totals(conn).get("spark0") == canonical_totals(conn), 240, what)

    streamer = Streamer(app)
    proc = start()
    try:
        kill_mid_batch(proc)
        rides(app, 100)
        streamer.drain()
        proc = start()  # with its checkpoint folder
        caught_up("the restarted Spark consumer (with its checkpoint folder) to catch up")
        kill_mid_batch(proc)
        shutil.rmtree(checkpoint, ignore_errors=True)
        rides(app, 100)
        streamer.drain()
        proc = start()
        caught_up("the restarted Spark consumer (without its checkpoint folder) to catch up")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    streamer.close()


def test_reconcile_detects_a_planted_discrepancy_and_repair_fixes_it(
    spark: Any, on: tuple[Settings, Any], pg: Any
) -> None:
    from unilog_demo.consumer import apply_rides
    from unilog_demo.reconcile import model

    from unilog import Consumer, ConsumerConfig
    from unilog.spark.reconcile import reconcile

    app = on[0]
    rides(app, 120)
    streamer = Streamer(app)
    streamer.drain()
    for name in ("honest", "broken"):
        with Consumer(app, ConsumerConfig(name=name, batch_size=50), lambda c, r, n=name: apply_rides(n, c, r)) as c:
            c.run_once(block_ms=-1)  # 50 of 120: behind the stream end, still comparable at its checkpoint
    rides(app, 30)  # staged, not streamed: reconciliation must not count them for anyone
    pg.execute(
        "UPDATE consumer_states SET ride_count = ride_count + 1, total_distance = total_distance + 7 "
        "WHERE name = 'broken'"
    )
    report = reconcile(spark, app, model, slices=3)
    verdicts = {c.name: c.agree for c in report.consumers}
    assert verdicts == {"honest": True, "broken": False}
    assert report.last_seq == 120
    assert next(c for c in report.consumers if c.name == "broken").expected.ride_count == 50
    repaired = reconcile(spark, app, model, slices=3, repair=True)
    assert [c.repaired for c in repaired.consumers if c.name == "broken"] == [True]
    assert reconcile(spark, app, model).agree, "after --repair everyone agrees"
    streamer.drain()
    with Consumer(app, ConsumerConfig(name="broken"), lambda c, r: apply_rides("broken", c, r)) as c:
        c.drain()  # continues from the repaired checkpoint: no gap, no overlap
    with psycopg.connect(app.conninfo) as conn:
        assert consumer_totals(conn)["broken"] == canonical_totals(conn)
    streamer.close()


def test_archive_plus_live_stream_rebuilds_a_consumer_exactly(
    spark: Any, on: tuple[Settings, Any], pg: Any, tmp_path: Path
) -> None:
    from unilog_demo.consumer import apply_rides

    from unilog import Consumer, ConsumerConfig
    from unilog.spark.archive import archive, archiver_name, read_archive, rebuild_from_archive

    app, rds = on
    path = str(tmp_path / "archive")
    rides(app, 300)
    streamer = Streamer(app)
    streamer.drain()
    assert archive(spark, app, path) == 300
    assert archive(spark, app, path) == 0, "nothing new"
    rides(app, 200)
    streamer.drain()
    # retention drops the archived history from Redis (here, by hand, up to the archiver's checkpoint)
    archived_until = pg.execute(
        "SELECT last_id FROM unilog_checkpoints WHERE name = %s", (archiver_name(STREAM),)
    ).fetchone()[0]
    rds.xtrim(STREAM, minid=archived_until, approximate=False)  # "~" (the default) keeps whole nodes
    assert rds.xlen(STREAM) == 201, "the first 299 entries exist only in the archive now"
    assert read_archive(spark, path).count() == 300
    assert rebuild_from_archive(spark, app, path, "from-archive", state_effect("from-archive")) == 300
    with Consumer(app, ConsumerConfig(name="from-archive"), lambda c, r: apply_rides("from-archive", c, r)) as c:
        c.drain()  # continues from the archive's end: no gap (StreamGap would stop it), no overlap
    with psycopg.connect(app.conninfo) as conn:
        assert consumer_totals(conn)["from-archive"] == canonical_totals(conn)
    streamer.close()


def test_the_sink_records_a_process_span_linked_to_each_record(spark: Any, app: Settings, spans: Any) -> None:
    from opentelemetry import trace

    with trace.get_tracer("test").start_as_current_span("request") as request:
        rides(app, 3)
    Streamer(app).drain()
    df = spark.read.format("unilog").option("redisUrl", app.redis_url).option("stream", STREAM).load()
    TransactionalSink(app.database_url, "spark-traced", STREAM, state_effect("spark-traced"))(df, 0)
    (process,) = [s for s in spans.get_finished_spans() if s.name == f"process {STREAM}"]
    assert process.kind is trace.SpanKind.CONSUMER and process.attributes["unilog.consumer.kind"] == "spark"
    assert [link.context.trace_id for link in process.links] == [request.get_span_context().trace_id] * 3


def test_spark_redacts_a_urls_password(spark: Any) -> None:
    """The source's options carry URLs; whatever Spark prints of them (plans, its UI, event logs) passes through its
    string redaction, which spark_session points at a URL's password. (The plans of this source show no options.)"""
    conf = spark._jsparkSession.sessionState().conf()
    text = "redisUrl=redis://user:planted-password@127.0.0.1:1/0 databaseUrl=postgresql://app:pw2@db/x"
    redacted = spark.sparkContext._jvm.org.apache.spark.util.Utils.redact(conf.stringRedactionPattern(), text)
    assert "planted-password" not in redacted and "pw2" not in redacted and "redis://" in redacted, redacted
