"""Resource and network faults: the streamer stops deleting, backs off, says what is wrong, and resumes without loss.

Network faults go through unilog's TCP fault proxy (pass, delay, blackhole, reset, drop replies); resource faults
are real: Redis out of memory, Redis out of disk (its AOF on a tiny tmpfs), servers paused with SIGSTOP.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from structlog.testing import capture_logs

from unilog import Consumer, ConsumerConfig, Settings, Streamer, StreamerConfig, emit
from unilog.harness.embedded import EmbeddedRedis
from unilog.harness.proxy import FaultProxy
from unilog.harness.pytest_plugin import running


def stage(settings: Settings, n: int, start: int = 0, size: int = 0) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(start, start + n):
            emit(conn, action="create", object="ride", data={"n": i, "pad": "x" * size})
        conn.commit()


def staged(settings: Settings) -> int:
    with psycopg.connect(settings.conninfo) as conn:
        return conn.execute("SELECT count(*) FROM staged_log_records").fetchone()[0]


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def assert_exactly_once(redis_url: str, n: int, stream: str = "test-stream") -> None:
    client = redis.Redis.from_url(redis_url)
    seqs = [int(f[b"seq"]) for _, f in client.xrange(stream)]
    client.close()
    assert seqs == list(range(1, n + 1)), f"expected seqs 1..{n} once each, got {seqs[:20]}..."


def errors_logged(logs: list[dict[str, Any]]) -> list[str]:
    return [str(e.get("error")) for e in logs if e.get("log_level") == "error"]


@pytest.fixture
def redis_proxy(settings: Settings) -> Iterator[tuple[FaultProxy, Settings]]:
    port = int(settings.redis_url.rsplit(":", 1)[1].split("/")[0])
    with FaultProxy("127.0.0.1", port) as proxy:
        yield proxy, settings.with_(redis_url=proxy.url_for(settings.redis_url))


@pytest.fixture
def pg_proxy(settings: Settings) -> Iterator[tuple[FaultProxy, Settings]]:
    port = int(settings.database_url.rsplit(":", 1)[1].split("/")[0])
    with FaultProxy("127.0.0.1", port) as proxy:
        yield proxy, settings.with_(database_url=proxy.url_for(settings.database_url))


def test_redis_replies_lost_unknown_outcome_is_deduplicated(redis_proxy: Any, settings: Settings) -> None:
    """Redis runs the batch but the reply never arrives: the streamer re-sends, the broker drops the repeat."""
    proxy, via = redis_proxy
    # no trimming pass, and one batch first: the next call Redis runs without answering must be the batch itself
    streamer = Streamer(via, StreamerConfig(redis_timeout=0.5, poll_interval=0.1, retention_interval=1e9))
    stage(settings, 1)
    streamer.drain()
    stage(settings, 9)
    proxy.drop_replies()
    with capture_logs() as logs, running(streamer.run):
        wait_until(lambda: any("did not confirm" in e for e in errors_logged(logs)), 10, "a publish timeout")
        assert staged(settings) == 9, "nothing deleted while the outcome is unknown"
        direct = redis.Redis.from_url(settings.redis_url)
        assert direct.xlen("test-stream") == 10, "Redis did run the batch whose reply was lost"
        direct.close()
        proxy.pass_through()
        wait_until(lambda: staged(settings) == 0, 15, "the streamer to resume")
    streamer.close()
    assert_exactly_once(settings.redis_url, 10)


def xlen(redis_url: str, stream: str = "test-stream") -> int:
    client = redis.Redis.from_url(redis_url)
    try:
        return int(client.xlen(stream))
    finally:
        client.close()


def wait_for_failures(logs: list[dict[str, Any]], fault: str) -> None:
    """Until the streamer has logged two failed passes: the fault met, and met again by the retry."""
    wait_until(lambda: len(errors_logged(logs)) >= 2, 15, f"the streamer to log the fault twice ({fault})")


REDIS_DEADLINE = 0.5  # the streamer's redis_timeout in the Redis network faults
PG_DEADLINE = 1.0  # its pg_timeout in the Postgres ones


@pytest.mark.parametrize("fault", ["reset", "blackhole", "delay"])
def test_redis_network_faults(redis_proxy: Any, settings: Settings, fault: str) -> None:
    """Redis reset, blackholed, or delayed past the deadline (every chunk held twice ``redis_timeout``, so no reply
    arrives in time; Redis may still run a batch whose reply comes too late). While the fault is on the streamer
    logs failed passes and deletes nothing; once it clears every record is in the stream exactly once."""
    proxy, via = redis_proxy
    stage(settings, 5)
    streamer = Streamer(via, StreamerConfig(redis_timeout=REDIS_DEADLINE, poll_interval=0.1, max_backoff=0.5))
    streamer.connect()
    getattr(proxy, fault)(*([2 * REDIS_DEADLINE] if fault == "delay" else []))
    with capture_logs() as logs, running(streamer.run):
        wait_for_failures(logs, fault)
        assert staged(settings) == 5, f"nothing may be deleted while Redis is unreachable ({fault})"
        proxy.pass_through()
        stage(settings, 5, start=5)
        wait_until(lambda: staged(settings) == 0, 15, "the streamer to resume")
    streamer.close()
    assert_exactly_once(settings.redis_url, 10)


@pytest.mark.parametrize("fault", ["reset", "blackhole", "delay"])
def test_postgres_network_faults(pg_proxy: Any, settings: Settings, fault: str) -> None:
    """Postgres reset, blackholed, or delayed past the deadline (every chunk held 1.5 times ``pg_timeout``: the
    deadline breaks each call, no connection completes). While the fault is on the streamer logs failed passes and
    publishes and deletes nothing; once it clears every record is published exactly once."""
    proxy, via = pg_proxy
    stage(settings, 5)
    streamer = Streamer(via, StreamerConfig(pg_timeout=PG_DEADLINE, poll_interval=0.1, max_backoff=0.5))
    streamer.connect()
    getattr(proxy, fault)(*([1.5 * PG_DEADLINE] if fault == "delay" else []))
    with capture_logs() as logs, running(streamer.run):
        stage(settings, 5, start=5)  # producers talk to Postgres directly
        wait_for_failures(logs, fault)
        assert staged(settings) == 10, f"nothing may be deleted while Postgres is unreachable ({fault})"
        assert xlen(settings.redis_url) == 0, f"nothing may be published while Postgres is unreachable ({fault})"
        proxy.pass_through()
        wait_until(lambda: staged(settings) == 0, 20, "the streamer to resume")
    streamer.close()
    assert_exactly_once(settings.redis_url, 10)


def test_consumer_survives_postgres_reset_and_blackhole(pg_proxy: Any, settings: Settings) -> None:
    proxy, via = pg_proxy
    applied: list[int] = []

    def handler(conn: psycopg.Connection[Any], records: Any) -> None:
        conn.execute("CREATE TABLE IF NOT EXISTS seen (n int)")
        for r in records:
            conn.execute("INSERT INTO seen VALUES (%s)", (r.data["n"],))

    stage(settings, 5)
    Streamer(settings).drain()
    c = Consumer(via, ConsumerConfig(name="c", block_ms=100, pg_timeout=1.0, max_backoff=0.5), handler)
    c.connect()
    with running(c.run):
        proxy.reset()
        time.sleep(0.5)
        proxy.blackhole()
        stage(settings, 5, start=5)
        Streamer(settings).drain()
        time.sleep(1.5)
        proxy.pass_through()
        with psycopg.connect(settings.conninfo) as conn:

            def done() -> bool:
                exists = conn.execute("SELECT to_regclass('seen') IS NOT NULL").fetchone()[0]
                rows = conn.execute("SELECT n FROM seen ORDER BY n").fetchall() if exists else []
                conn.commit()
                applied[:] = [r[0] for r in rows]
                return len(applied) >= 10

            wait_until(done, 20, "the consumer to catch up")
    c.close()
    assert applied == list(range(10))


def test_redis_out_of_memory_keeps_records_staged_until_it_clears(settings: Settings, tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path / "r") as server:
        own = settings.with_(redis_url=server.url)
        client = redis.Redis.from_url(server.url)
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", str(used + 200_000))
        stage(own, 400, size=1000)  # ~400 KB of payload: cannot fit
        streamer = Streamer(own, StreamerConfig(poll_interval=0.1, max_backoff=0.3, batch_size=100))
        with capture_logs() as logs, running(streamer.run):
            wait_until(lambda: any("maxmemory" in e for e in errors_logged(logs)), 10, "an OOM error in the log")
            left = staged(own)
            assert left > 0, "records that did not fit stay staged"
            client.config_set("maxmemory", "0")
            wait_until(lambda: staged(own) == 0, 15, "the streamer to resume")
        streamer.close()
        client.close()
        assert_exactly_once(server.url, 400)


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_redis_out_of_disk_keeps_records_staged_until_it_clears(settings: Settings, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "3m") as disk, EmbeddedRedis(disk) as server:
        own = settings.with_(redis_url=server.url)
        stage(own, 3000, size=1000)  # ~3 MB of AOF: the disk fills up part-way
        streamer = Streamer(own, StreamerConfig(poll_interval=0.1, max_backoff=0.3, batch_size=100))
        with capture_logs() as logs, running(streamer.run):
            wait_until(lambda: bool(errors_logged(logs)), 20, "a write error in the log")
            assert staged(own) > 0
            subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
            # with appendfsync always Redis exits on an AOF write error, and its supervisor starts it again
            server.restart()
            wait_until(lambda: staged(own) == 0, 30, "the streamer to resume")
        print("errors seen:", sorted(set(errors_logged(logs)))[:3])
        streamer.close()
        assert_exactly_once(server.url, 3000)


def test_paused_redis_then_resumed(settings: Settings, tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path / "r") as server:
        own = settings.with_(redis_url=server.url)
        stage(own, 10)
        streamer = Streamer(own, StreamerConfig(redis_timeout=0.5, poll_interval=0.1, max_backoff=0.3))
        streamer.connect()
        server.pause()
        try:
            with running(streamer.run):
                time.sleep(1.2)
                assert staged(own) == 10
                server.resume()
                wait_until(lambda: staged(own) == 0, 15, "the streamer to resume")
        finally:
            server.resume()
        streamer.close()
        assert_exactly_once(server.url, 10)


def staged_or_none(settings: Settings) -> int | None:
    """The staged count, or None while Postgres is recovering."""
    try:
        return staged(settings)
    except psycopg.OperationalError:
        return None


def test_postgres_out_of_disk_keeps_records_staged_until_it_clears(settings: Settings, tmp_path: Path) -> None:
    """Postgres's data directory on a small tmpfs, filled up: the streamer cannot delete (or Postgres stops), backs
    off, and once space is back and Postgres is up again every record is published exactly once."""
    from unilog.harness.embedded import EmbeddedPostgres
    from unilog.ops.schema import migrate

    with tmpfs(tmp_path / "pgdisk", "200m") as disk:
        pg = EmbeddedPostgres(disk / "pg").start()
        try:
            migrate(pg.url)
            own = settings.with_(database_url=pg.url)
            stage(own, 200)
            streamer = Streamer(own, StreamerConfig(poll_interval=0.1, max_backoff=0.3, batch_size=50))
            streamer.connect()
            with psycopg.connect(pg.url, autocommit=True) as conn:
                conn.execute("CREATE TABLE filler (pad text)")
                with pytest.raises(psycopg.Error, match="space"):
                    while True:  # fill the disk
                        conn.execute("INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 20000)")
            with capture_logs() as logs, running(streamer.run):
                wait_until(lambda: bool(errors_logged(logs)), 30, "a write error in the log")
                subprocess.run(["mount", "-o", "remount,size=1g", str(disk)], check=True)
                if pg.pid is None or not Path(f"/proc/{pg.pid}").exists():
                    pg.start()  # Postgres stops (PANIC) when it cannot write its WAL; its supervisor restarts it
                wait_until(lambda: staged_or_none(own) == 0, 60, "the streamer to resume")
            print("errors seen:", sorted(set(errors_logged(logs)))[:3])
            streamer.close()
            assert_exactly_once(own.redis_url, 200)
        finally:
            pg.stop(mode="immediate", cleanup=True)
