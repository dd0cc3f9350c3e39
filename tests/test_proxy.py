"""Tests for unilog.harness.proxy.FaultProxy against real Redis and Postgres servers (no mocks)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from unilog.harness.embedded import EmbeddedPostgres, EmbeddedRedis, free_port
from unilog.harness.proxy import FaultProxy, Mode


@pytest.fixture(scope="module")
def redis_server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as server:
        yield server


@pytest.fixture(scope="module")
def pg_server() -> Iterator[EmbeddedPostgres]:
    with EmbeddedPostgres() as server:
        yield server


@pytest.fixture
def redis_proxy(redis_server: EmbeddedRedis) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", redis_server.port) as proxy:
        yield proxy


@pytest.fixture
def pg_proxy(pg_server: EmbeddedPostgres) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", pg_server.port) as proxy:
        yield proxy


def _client(url: str, timeout: float | None = 2.0) -> redis.Redis:
    """A redis-py client without retries (redis-py >= 6 retries by default, which would blur the faults)."""
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=2.0,
        retry=Retry(NoBackoff(), 0),
        single_connection_client=True,
    )


def _via(proxy: FaultProxy, server: EmbeddedRedis, timeout: float | None = 2.0) -> redis.Redis:
    return _client(proxy.url_for(server.url), timeout)


def _timed_ping(client: redis.Redis) -> float:
    began = time.monotonic()
    assert client.ping()
    return time.monotonic() - began


def test_url_for_keeps_credentials_database_and_query() -> None:
    with FaultProxy("localhost", 5432) as proxy:
        port = proxy.port
        assert proxy.url_for("postgresql://u:p%40ss@127.0.0.1:5432/db?sslmode=disable&application_name=x") == (
            f"postgresql://u:p%40ss@127.0.0.1:{port}/db?sslmode=disable&application_name=x"
        )
        assert proxy.url_for("postgresql+psycopg://postgres@db.example:5432/app") == (
            f"postgresql+psycopg://postgres@127.0.0.1:{port}/app"
        )
        assert proxy.url_for("redis://:secret@127.0.0.1:6379/3") == f"redis://:secret@127.0.0.1:{port}/3"
        assert proxy.url_for("redis://localhost") == f"redis://127.0.0.1:{port}"
        with pytest.raises(ValueError, match="Postgres or Redis"):
            proxy.url_for("http://127.0.0.1:80/")
        with pytest.raises(ValueError, match="bypass"):
            proxy.url_for("postgresql://postgres@127.0.0.1/db?host=/tmp")


def test_rejects_non_loopback_upstream_and_bad_delays() -> None:
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("10.0.0.1", 6379)
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("example.com", 6379)
    with FaultProxy("127.0.0.1", 6379) as proxy:
        with pytest.raises(ValueError):
            proxy.delay(-1)
        with pytest.raises(ValueError):
            proxy.set_mode(Mode.BLACKHOLE, delay=1.0)
        assert proxy.mode is Mode.PASS


def test_pass_redis_commands_and_a_10mb_value(redis_proxy: FaultProxy, redis_server: EmbeddedRedis) -> None:
    client = _via(redis_proxy, redis_server)
    assert client.ping()
    client.set("greeting", "hello")
    assert client.get("greeting") == b"hello"
    big = bytes(range(256)) * (10 * 1024 * 1024 // 256)
    client.set("big", big)
    assert client.get("big") == big
    # the proxy counts a chunk after forwarding it: the client may hold the reply a moment before the count moves
    deadline = time.monotonic() + 5
    while redis_proxy.stats["bytes_down"] <= len(big) and time.monotonic() < deadline:
        time.sleep(0.01)
    stats = redis_proxy.stats
    assert stats["connections"] == 1
    assert stats["bytes_up"] > len(big)
    assert stats["bytes_down"] > len(big)
    client.close()


def test_pass_postgres_query(pg_proxy: FaultProxy, pg_server: EmbeddedPostgres) -> None:
    with psycopg.connect(pg_proxy.url_for(pg_server.url), connect_timeout=5) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


def test_fifty_concurrent_connections(redis_proxy: FaultProxy, redis_server: EmbeddedRedis) -> None:
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            with _via(redis_proxy, redis_server) as client:
                for j in range(20):
                    client.set(f"conc:{i}", j)
                    assert client.get(f"conc:{i}") == str(j).encode()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not errors
    assert redis_proxy.stats["connections"] == 50


def test_delay_applies_to_existing_connections_and_keeps_order(
    redis_proxy: FaultProxy, redis_server: EmbeddedRedis
) -> None:
    client = _via(redis_proxy, redis_server)
    assert _timed_ping(client) < 0.1
    warm = client.pipeline()  # pipelines take a pooled connection: open it before the handshake is slowed
    warm.ping()
    warm.execute()
    redis_proxy.delay(0.2)
    assert redis_proxy.mode is Mode.DELAY
    # held 0.2 s on the way up and 0.2 s on the way down
    assert 0.35 <= _timed_ping(client) < 2.0
    pipe = client.pipeline(transaction=False)
    for i in range(200):
        pipe.set(f"order:{i}", i)
        pipe.get(f"order:{i}")
    replies = pipe.execute()
    assert replies[1::2] == [str(i).encode() for i in range(200)]
    redis_proxy.pass_through()
    assert _timed_ping(client) < 0.1
    client.close()


def test_blackhole_times_out_and_new_clients_work_after_pass(
    redis_proxy: FaultProxy, redis_server: EmbeddedRedis
) -> None:
    client = _via(redis_proxy, redis_server, timeout=0.5)
    assert client.ping()
    redis_proxy.blackhole()
    began = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        client.ping()
    assert time.monotonic() - began >= 0.4
    with pytest.raises((redis.TimeoutError, redis.ConnectionError)):
        _via(redis_proxy, redis_server, timeout=0.5).ping()
    assert redis_proxy.stats["bytes_dropped"] > 0
    redis_proxy.pass_through()
    fresh = _via(redis_proxy, redis_server)
    assert fresh.ping()
    fresh.close()
    client.close()


def test_blackholed_bytes_are_dropped_not_delivered_later(redis_proxy: FaultProxy, redis_server: EmbeddedRedis) -> None:
    with socket.create_connection(("127.0.0.1", redis_proxy.port), timeout=2) as sock:
        redis_proxy.blackhole()
        sock.sendall(b"INCR dropped:counter\r\n")
        time.sleep(0.1)
        redis_proxy.pass_through()
        sock.sendall(b"INCR dropped:counter\r\n")
        assert sock.recv(100) == b":1\r\n"
        sock.settimeout(0.2)
        with pytest.raises(TimeoutError):
            sock.recv(100)


def test_reset_kills_existing_and_new_connections_until_mode_changes(
    redis_proxy: FaultProxy, redis_server: EmbeddedRedis, pg_server: EmbeddedPostgres
) -> None:
    client = _via(redis_proxy, redis_server)
    assert client.ping()
    redis_proxy.reset()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    with pytest.raises(redis.ConnectionError):
        _via(redis_proxy, redis_server).ping()
    assert redis_proxy.stats["resets"] >= 2
    redis_proxy.pass_through()
    fresh = _via(redis_proxy, redis_server)
    assert fresh.ping()
    fresh.close()
    client.close()


def test_reset_refuses_postgres_connections(pg_proxy: FaultProxy, pg_server: EmbeddedPostgres) -> None:
    pg_proxy.reset()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(pg_proxy.url_for(pg_server.url), connect_timeout=2)
    pg_proxy.pass_through()
    with psycopg.connect(pg_proxy.url_for(pg_server.url), connect_timeout=5) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


def test_drop_replies_gives_unknown_outcome(redis_proxy: FaultProxy, redis_server: EmbeddedRedis) -> None:
    direct = _client(redis_server.url)
    direct.delete("unknown:k")
    client = _via(redis_proxy, redis_server, timeout=0.5)
    assert client.ping()
    redis_proxy.drop_replies()
    with pytest.raises(redis.TimeoutError):
        client.set("unknown:k", "v")
    assert direct.get("unknown:k") == b"v"
    client.close()
    direct.close()


def test_cut_breaks_idle_postgres_connection_but_not_new_ones(
    pg_proxy: FaultProxy, pg_server: EmbeddedPostgres
) -> None:
    url = pg_proxy.url_for(pg_server.url)
    with psycopg.connect(url, connect_timeout=5, autocommit=True) as idle:
        assert idle.execute("select 1").fetchone() == (1,)
        pg_proxy.cut()
        assert pg_proxy.mode is Mode.PASS
        assert pg_proxy.stats["resets"] == 1
        with pytest.raises(psycopg.OperationalError):
            idle.execute("select 1")
    with psycopg.connect(url, connect_timeout=5) as conn:
        assert conn.execute("select 2").fetchone() == (2,)


def test_unreachable_upstream_resets_the_client() -> None:
    with FaultProxy("127.0.0.1", free_port()) as proxy, pytest.raises(redis.ConnectionError):
        _client(f"redis://127.0.0.1:{proxy.port}/0").ping()


def test_stop_is_prompt_with_hung_connections_and_restart_works(redis_server: EmbeddedRedis) -> None:
    proxy = FaultProxy("127.0.0.1", redis_server.port).start()
    assert proxy.start() is proxy
    raw = [socket.create_connection(("127.0.0.1", proxy.port), timeout=5) for _ in range(5)]
    proxy.blackhole()
    outcome: list[BaseException] = []

    def hang() -> None:
        try:
            _via(proxy, redis_server, timeout=None).ping()
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=hang, daemon=True)
    waiter.start()
    time.sleep(0.2)
    began = time.monotonic()
    proxy.stop()
    assert time.monotonic() - began < 2.0
    waiter.join(2)
    assert not waiter.is_alive()
    assert outcome
    assert isinstance(outcome[0], redis.ConnectionError)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=1)
    for sock in raw:
        sock.close()
    proxy.stop()
    # a stopped proxy starts again on the same port, keeping its mode
    with proxy:
        assert proxy.mode is Mode.BLACKHOLE
        proxy.pass_through()
        client = _via(proxy, redis_server)
        assert client.ping()
        client.close()
