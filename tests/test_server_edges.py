"""Servers that refuse: Redis that wants a password (NOAUTH) or gets a wrong one (WRONGPASS), a read-only replica
where the primary should be (READONLY), Redis out of memory (OOM), a Postgres role without a privilege, and a
closed Postgres port (libpq's whole message). Each gives one line naming the problem and the fix, with a named exit
code, and nothing staged is lost."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
import redis
import structlog
from cli import one_line, unilog

from unilog import Settings, emit
from unilog.cli import ExitCode
from unilog.harness.embedded import EmbeddedRedis, ServerNotFound, find_redis_servers, free_port


def stage(settings: Settings, n: int = 3) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(n):
            emit(conn, action="create", object="ride", data={"n": i})


def staged(pg: Any) -> int:
    return int(pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0])


@pytest.fixture(params=find_redis_servers(), ids=lambda b: f"redis-{b.version}")
def each_redis(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A throw-away Redis of this test's own, of each version found (Redis 6.2 and 7 word refusals inside a script
    differently)."""
    with EmbeddedRedis(tmp_path / "redis", binary=request.param) as server:
        yield server


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A throw-away Redis of this test's own, to reconfigure freely."""
    try:
        server = EmbeddedRedis(tmp_path / "redis").start()
    except (
        ServerNotFound
    ) as exc:  # no binary and no embedded server (servers given by URL only): nothing to reconfigure
        pytest.skip(f"no Redis server to start: {exc}")
    yield server
    server.stop(cleanup=True)


def test_noauth_and_wrongpass_are_one_line_and_the_right_password_works(
    settings: Settings, pg: Any, own_redis: EmbeddedRedis
) -> None:
    redis.Redis.from_url(own_redis.url).config_set("requirepass", "s3cret")
    stage(settings)
    parts = urlsplit(own_redis.url)
    for password, refusal in ((None, "NOAUTH"), ("wrong", "WRONGPASS")):
        netloc = parts.netloc if password is None else f":{password}@{parts.netloc}"
        url = urlunsplit(parts._replace(netloc=netloc))
        result = unilog(settings, "streamer", "--once", redis_url=url)
        assert result.returncode == ExitCode.CONFIG, result.stderr
        line = one_line(result)
        assert "refused the credentials" in line and "REDIS_URL" in line, line
        assert refusal.lower() in line.lower() or "password" in line.lower(), line
        assert "wrong" not in line.split("refused")[0], "the password is never printed"
    assert staged(pg) == 3, "nothing lost"
    good = urlunsplit(parts._replace(netloc=f":s3cret@{parts.netloc}"))
    done = unilog(settings, "streamer", "--once", redis_url=good)
    assert done.returncode == 0 and "streamed 3 records" in done.stdout, done.stderr


@contextmanager
def replica_of(primary: EmbeddedRedis, tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A Redis replica of ``primary``, synced, stopped after the block."""
    replica = EmbeddedRedis(tmp_path / "replica", binary=primary.binary).start()
    try:
        client = redis.Redis.from_url(replica.url)
        client.replicaof("127.0.0.1", primary.port)
        deadline = time.monotonic() + 20
        while client.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.05)
        yield replica
    finally:
        replica.stop(cleanup=True)


def test_a_read_only_replica_stops_the_streamer_and_a_consumer_in_one_line(
    settings: Settings, pg: Any, own_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    with replica_of(own_redis, tmp_path) as replica:
        stage(settings)
        result = unilog(settings, "streamer", "--once", redis_url=replica.url)
        assert result.returncode == ExitCode.CONFIG, result.stderr
        line = one_line(result)
        assert "read-only replica" in line and "point REDIS_URL at the primary" in line, line
        assert staged(pg) == 3, "nothing deleted"
        # the long-running mode stops too, instead of retrying forever
        consumer = unilog(settings, "consume", "handlers:cli_handler", "--name", "cli", redis_url=replica.url)
        assert consumer.returncode == ExitCode.CONFIG, consumer.stderr
        assert "read-only replica" in one_line(consumer)


@pytest.mark.parametrize("wait", ["0", "1"], ids=["no-wait", "wait-replicas"])
@pytest.mark.parametrize("streams", [1, 40], ids=["one-stream", "across-streams"])
def test_a_read_only_replica_is_named_over_many_streams_and_though_the_streamer_waits_for_replicas(
    settings: Settings, pg: Any, each_redis: EmbeddedRedis, tmp_path: Path, streams: int, wait: str
) -> None:
    """A replica where the primary should be stops ``--once`` with the one line that names it, whatever the number
    of streams (across streams the script quotes READONLY as a plain error: it was a retried "did not confirm"
    exit 1) and with ``--wait-replicas`` (Redis refuses the script calls, then the WAIT after them, a replica
    taking none: the WAIT's refusal, read last, was reported instead)."""
    from unilog import emit_many

    with replica_of(each_redis, tmp_path) as replica:
        with psycopg.connect(settings.conninfo) as conn:
            emit_many(conn, [{"action": "a", "object": "o", "data": {}, "stream": f"s-{k}"} for k in range(streams)])
        result = unilog(settings, "streamer", "--once", "--wait-replicas", wait, redis_url=replica.url)
        assert result.returncode == ExitCode.CONFIG, result.stderr
        line = one_line(result)
        assert "read-only replica" in line and "point REDIS_URL at the primary" in line, line
        assert staged(pg) == streams, "nothing deleted"


@pytest.mark.parametrize("streams", [1, 40], ids=["one-stream", "across-streams"])
def test_a_user_refused_a_command_inside_the_publish_script_is_named_over_one_stream_or_many(
    settings: Settings, pg: Any, each_redis: EmbeddedRedis, streams: int
) -> None:
    """A Redis user allowed the script but not ``XADD`` is refused inside it: Redis 6.2 says "the user executing the
    script can't run this command", 7 "ACL failure in script"; the second was a retried "did not confirm" (exit 1).
    Either is the NOPERM line, without the script's internals, and nothing staged is deleted."""
    from unilog import emit_many

    admin = redis.Redis.from_url(each_redis.url)
    admin.acl_setuser("no-xadd", enabled=True, passwords=["+pw"], commands=["+@all", "-xadd"], keys=["*"])
    admin.close()
    parts = urlsplit(each_redis.url)
    url = urlunsplit(parts._replace(netloc=f"no-xadd:pw@{parts.hostname}:{parts.port}"))
    with psycopg.connect(settings.conninfo) as conn:
        emit_many(conn, [{"action": "a", "object": "o", "data": {}, "stream": f"s-{k}"} for k in range(streams)])
    result = unilog(settings, "streamer", "--once", redis_url=url)
    assert result.returncode == ExitCode.CONFIG, result.stderr
    line = one_line(result)
    assert "NOPERM" in line and "unilog acl" in line and "user_script" not in line, line
    assert staged(pg) == streams, "nothing deleted"


def test_redis_out_of_memory_is_retried_with_a_hint_and_loses_nothing(
    settings: Settings, pg: Any, own_redis: EmbeddedRedis
) -> None:
    client = redis.Redis.from_url(own_redis.url)
    client.config_set("maxmemory", "1")  # every write is refused with OOM
    stage(settings)
    proc = subprocess.Popen(
        # the back-pressure pause off: this is about the refusal itself (tests/test_backpressure.py has the pause)
        [
            sys.executable,
            "-m",
            "unilog",
            "--log-json",
            "streamer",
            "--poll-interval",
            "0.2",
            "--redis-memory-limit",
            "0",
        ],
        env={
            **os.environ,
            "DATABASE_URL": settings.database_url,
            "REDIS_URL": own_redis.url,
            "UNILOG_STREAM": settings.stream,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "connection failed; retrying" in line:
                assert "out of memory (maxmemory reached)" in line and "stay staged" in line, line
                assert "user_script" not in line, "no Lua internals"
                break
        assert staged(pg) == 3
        client.config_set("maxmemory", "0")
        deadline = time.monotonic() + 30
        while staged(pg):
            assert time.monotonic() < deadline, "the streamer never resumed"
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert client.xlen(settings.stream) == 3


@pytest.fixture
def limited_url(settings: Settings, pg: Any) -> Iterator[str]:
    """The test database's URL with a role that may connect and read unilog's schema version, nothing else."""
    role = f"limited_{uuid.uuid4().hex[:8]}"
    try:
        pg.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
    except psycopg.errors.InsufficientPrivilege:
        pytest.skip("the test database's user may not create roles")
    pg.execute(f"GRANT SELECT ON unilog_alembic_version TO {role}")
    parts = urlsplit(settings.database_url)
    host = parts.netloc.rpartition("@")[2]
    yield urlunsplit(parts._replace(netloc=f"{role}:pw@{host}"))
    pg.execute(f"REVOKE ALL ON unilog_alembic_version FROM {role}")
    pg.execute(f"DROP ROLE {role}")


def test_a_postgres_role_without_a_privilege_stops_each_process_in_one_line(
    settings: Settings, pg: Any, rds: Any, limited_url: str
) -> None:
    def refused(*args: str) -> None:
        result = unilog(settings, *args, database_url=limited_url, timeout=30)
        assert result.returncode == ExitCode.CONFIG, (args, result.stderr)
        line = one_line(result)
        assert "permission denied for table" in line and "GRANT" in line, line
        assert ":pw@" not in line

    stage(settings)
    refused("streamer", "--once")
    assert staged(pg) == 3, "nothing lost"
    assert unilog(settings, "streamer", "--once").returncode == 0  # published by a role that may
    refused("consume", "handlers:cli_handler", "--name", "cli", "--once")
    refused("consume", "handlers:cli_handler", "--name", "cli")  # long-running: stops instead of retrying forever
    refused("consume", "handlers:cli_handler", "--group", "g", "--once")
    assert rds.xlen(settings.stream) == 3
    assert pg.execute("SELECT count(*) FROM applied").fetchone() == (0,)


@pytest.mark.parametrize(
    ("server", "command"),
    [("postgres", ["streamer", "--once"]), ("postgres", ["migrate"]), ("redis", ["streamer", "--once"])],
)
def test_a_server_older_than_supported_is_one_line_and_exit_code_3(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    server: str,
    command: list[str],
) -> None:
    """No older server is installable here, so the real one is made "too old" by raising the minimum in-process."""
    from unilog.cli import main
    from unilog.engine._sync import connection as redis_connection  # where the threaded face reads its minimum
    from unilog.store._sync import connection

    if server == "postgres":
        monkeypatch.setattr(connection, "MIN_SERVER_VERSION", 990000)
    else:
        monkeypatch.setattr(redis_connection, "MIN_SERVER_VERSION", (99, 0))
    monkeypatch.setenv("DATABASE_URL", settings.database_url)
    monkeypatch.setenv("REDIS_URL", settings.redis_url)
    saved = structlog.get_config()  # main() configures logging onto this test's captured stdout: put it back
    try:
        assert main(["--log-json", *command]) == ExitCode.CONFIG
    finally:
        structlog.configure(**saved)
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    wanted = "unilog needs Postgres 15 or later" if server == "postgres" else "unilog needs Redis 6.2 or later"
    assert wanted in err and "is version" in err, err


def _loading_redis(server: EmbeddedRedis) -> subprocess.Popen[bytes]:
    """Restart ``server`` by hand with 20 MB of data loaded slowly (``key-load-delay``): it answers ``LOADING`` for
    some seconds (the harness itself would wait for the loading to end)."""
    client = redis.Redis.from_url(server.url)
    fill = client.pipeline(transaction=False)
    for i in range(20_000):
        fill.set(f"k{i}", os.urandom(1000))  # incompressible: Redis answers clients between 2 MB chunks of loading
    fill.execute()
    client.bgrewriteaof()  # an RDB preamble, loaded key by key
    while client.info("persistence")["aof_rewrite_in_progress"]:
        time.sleep(0.05)
    time.sleep(0.2)
    server.stop()
    server.conf_path.write_text(server.conf_path.read_text() + "\nkey-load-delay 150\n")
    proc = subprocess.Popen(
        [str(server.binary.path), str(server.conf_path)],
        cwd=server.base_dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            if redis.Redis.from_url(server.url, socket_timeout=5).info("persistence")["loading"]:
                return proc
        except redis.ConnectionError:
            pass
        assert time.monotonic() < deadline, "Redis never started loading"
        time.sleep(0.01)


def test_redis_loading_its_data_is_exit_4_in_burst_mode_and_waited_out_by_a_running_streamer(
    settings: Settings, pg: Any, own_redis: EmbeddedRedis
) -> None:
    env = {**os.environ, "DATABASE_URL": settings.database_url, "REDIS_URL": own_redis.url}
    running = subprocess.Popen(
        [sys.executable, "-m", "unilog", "--log-json", "streamer", "--poll-interval", "0.2"],
        env={**env, "UNILOG_STREAM": settings.stream},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert running.stdout is not None
    server = None
    try:
        assert "streamer started" in running.stdout.readline() or "streamer started" in running.stdout.readline()
        server = _loading_redis(own_redis)  # the running streamer loses Redis, then finds it loading
        stage(settings)
        burst = unilog(settings, "streamer", "--once", "--name", "burst", redis_url=own_redis.url)
        assert burst.returncode == ExitCode.UNREACHABLE, burst.stderr
        assert "still loading its data set" in one_line(burst)
        lines = []
        for line in running.stdout:
            lines.append(line)
            if "batch streamed" in line:
                break
        retries = [line for line in lines if "connection failed; retrying" in line]
        assert any("loading" in line.lower() for line in retries), lines
        assert staged(pg) == 0 and redis.Redis.from_url(own_redis.url).xlen(settings.stream) == 3
    finally:
        running.terminate()
        running.wait(timeout=30)
        if server is not None:
            server.terminate()
            server.wait(timeout=30)


@pytest.mark.parametrize("command", [["streamer", "--once"], ["migrate"]])
def test_a_closed_postgres_port_shows_libpqs_whole_message_on_one_line(settings: Settings, command: list[str]) -> None:
    closed = f"postgresql://unilog:secret@127.0.0.1:{free_port()}/unilog"
    result = unilog(settings, *command, database_url=closed)
    assert result.returncode == ExitCode.UNREACHABLE, result.stderr
    line = one_line(result)
    assert "Connection refused" in line and "Is the server running" in line, line
    assert "\t" not in line and "secret" not in line, line
