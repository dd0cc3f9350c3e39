"""Issue 47, item 3: every long-running process rides out a restart of Postgres and of Redis, at start and while
running, with no traceback.

Each process runs as users run it, through the installed ``unilog`` console script from a folder of the user's own
(its handler module there), against a Postgres and a Redis of this module's own: the suite's shared servers are
never restarted. For each process kind and each server, the test starts the process while that server is down and
brings it up a few seconds later, then restarts the server under the running process (Postgres: a fast shutdown,
which ends every session with ``AdminShutdown``, and then ``pg_terminate_backend`` of unilog's sessions). After each
event the process must be alive, answer (its ``/readyz``, ``/metrics`` or ``/api/status``) and do its work correctly:
new records published or applied exactly once, a backfill staging every row once. Its log must hold no traceback.

A Redis Cluster master failover under a running process is the slow case at the end.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from handlers import APPLIED_DDL

from unilog import Settings, Streamer, emit
from unilog.engine import RedisStreams, connect
from unilog.harness.embedded import EmbeddedPostgres, EmbeddedRedis, EmbeddedRedisCluster, ServerNotFound
from unilog.harness.embedded.process import free_port
from unilog.ops.schema import migrate
from unilog.routing import partition_stream

SCRIPT = Path(sys.executable).parent / "unilog"
DOWN_AT_START = 2.5  # seconds a server stays down after the process started
ROWS = 160  # the backfill's table
HANDLER = '''
import os


def apply(conn, records):
    """One row per application: a record applied twice shows as a duplicate."""
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO applied (consumer, producer, seq, entry_id, n) VALUES (%s, %s, %s, %s, %s)",
            [(os.environ["APPLIED_AS"], r.producer, r.seq, r.id, r.data["n"]) for r in records],
        )
'''
TABLE = "restart_rows"


@dataclass
class Servers:
    pg: EmbeddedPostgres
    redis: EmbeddedRedis
    held: dict[str, socket.socket] = field(default_factory=dict)

    def ensure_up(self) -> None:
        for which in list(self.held):
            self.held.pop(which).close()
        if self.pg.pid is None:
            self.pg.start()
        if self.redis.pid is None:
            self.redis.start()

    def down(self, which: str) -> None:
        server = self.pg if which == "postgres" else self.redis
        server.stop()
        # the port stays this test's while its server is down: another worker's new server took it once, and the
        # server's start failed ("Address already in use"). Bound and never listening, it refuses connections as a
        # stopped server's port does
        held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", server.port))
        self.held[which] = held

    def up(self, which: str) -> None:
        if which in self.held:
            self.held.pop(which).close()
        (self.pg if which == "postgres" else self.redis).start()

    def restart(self, which: str) -> None:
        if which == "postgres":
            self.pg.restart("fast")  # every session ends with AdminShutdown
        else:
            self.redis.restart()


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    """A Postgres and a Redis of this module's own, to stop and start at will."""
    try:
        rds = EmbeddedRedis().start()
    except ServerNotFound as exc:
        pytest.skip(f"no Redis server to start: {exc}")
    try:
        with EmbeddedPostgres() as pg:
            migrate(pg.url)
            with psycopg.connect(pg.url, autocommit=True) as conn:
                conn.execute(APPLIED_DDL)
                conn.execute(f"CREATE TABLE {TABLE} (id int PRIMARY KEY, label text NOT NULL)")
                conn.execute(f"INSERT INTO {TABLE} SELECT n, 'row ' || n FROM generate_series(1, {ROWS}) n")
            yield Servers(pg, rds)
    finally:
        rds.stop(cleanup=True)


@pytest.fixture
def app(servers: Servers, tmp_path: Path) -> Iterator[Settings]:
    """Both servers up, a stream of this test's own, and the user's folder with the handler module."""
    servers.ensure_up()
    (tmp_path / "restart_handlers.py").write_text(HANDLER)
    yield Settings(database_url=servers.pg.url, redis_url=servers.redis.url, stream=f"r{uuid.uuid4().hex[:8]}")
    servers.ensure_up()


# -- the process and what it must do -------------------------------------------------------------------------------


@dataclass
class Process:
    """``unilog ARGS`` through the console script in ``folder``, its stdout and stderr in one log file."""

    args: list[str]
    app: Settings
    folder: Path
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)

    def __post_init__(self) -> None:
        if not SCRIPT.exists():
            pytest.skip(f"the unilog console script is not installed beside this interpreter ({SCRIPT})")
        self.log = self.folder / "process.log"
        environ = {**os.environ, "DATABASE_URL": self.app.database_url, "REDIS_URL": self.app.redis_url}
        environ.update(UNILOG_STREAM=self.app.stream, APPLIED_AS=self.app.stream, **self.env)
        environ.pop("PYTHONPATH", None)  # the user's folder alone: the console script as installed
        with self.log.open("w") as out:
            argv = [
                str(SCRIPT),
                "--log-json",
                *[a.replace("{port}", str(self.port)).replace("{name}", self.app.stream) for a in self.args],
            ]
            self.popen = subprocess.Popen(argv, cwd=self.folder, env=environ, stdout=out, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text()

    def assert_alive(self, when: str) -> None:
        assert self.popen.poll() is None, f"the process died {when} (exit {self.popen.returncode}):\n{self.text()}"

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError as exc:
            return 0, str(exc)

    def stop(self) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            raise AssertionError(f"the process did not stop on SIGTERM:\n{self.text()}") from None

    def assert_no_traceback(self) -> None:
        text = self.text()
        assert "Traceback" not in text, text


def wait_for(check: Callable[[], Any], what: str, timeout: float = 45.0, process: Process | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if process is not None:
            process.assert_alive(f"while waiting for {what}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}" + (
            f":\n{process.text()}" if process else ""
        )
        time.sleep(0.2)


FANOUT = 12  # streamer-many's streams: a pass over 10 or more claims them in two shares, one in the side session


def streams_of(app: Settings, fanout: int) -> list[str]:
    return [app.stream] if fanout == 1 else [f"{app.stream}.{k:02d}" for k in range(fanout)]


def stage(app: Settings, numbers: range, fanout: int = 1) -> None:
    """Stage ``numbers`` in one transaction, each on every one of the ``fanout`` streams of :func:`streams_of`."""
    with psycopg.connect(app.conninfo) as conn:
        for n in numbers:
            for stream in streams_of(app, fanout):
                emit(conn, action="create", object="ride", data={"n": n}, key=str(n), stream=stream)


def publish(app: Settings, numbers: range) -> None:
    """Stage ``numbers`` and publish them with a streamer of the test's own (for the consumers' tests)."""
    stage(app, numbers)
    with Streamer(app, name="test-publisher") as streamer:
        streamer.drain(timeout=30)


def published(app: Settings, fanout: int = 1) -> list[int]:
    """The records' numbers in the streams (each partition's too), sorted: a double send shows twice."""
    client = connect(app.redis_url)  # a cluster's URL too
    try:
        keys = [
            *streams_of(app, fanout),
            *(partition_stream(app.stream, i) for i in range(RedisStreams(client).partitions(app.stream))),
        ]
        found = []
        for key in keys:
            for _, fields in client.xrange(key):
                for value in fields.values():
                    if value.startswith(b"{") and b'"n"' in value:
                        found.append(json.loads(value)["n"])
        return sorted(found)
    finally:
        client.close()


def applied(app: Settings, name: str) -> list[int]:
    with psycopg.connect(app.conninfo, autocommit=True) as conn:
        return sorted(r[0] for r in conn.execute("SELECT n FROM applied WHERE consumer = %s", (name,)))


def ready(process: Process) -> bool:
    return process.get("/readyz")[0] == 200


def system_up(process: Process) -> bool:
    status, body = process.get("/metrics")
    return status == 200 and "unilog_system_up 1.0" in body


def dashboard_sampled(process: Process) -> bool:
    status, body = process.get("/api/status")
    return status == 200 and json.loads(body)["error"] is None and json.loads(body)["status"] is not None


@dataclass
class Kind:
    """A process kind: its arguments (``{port}``: its HTTP port), what to set up before it starts, and a check
    that it did its work for records ``numbers`` (published or applied exactly once, served)."""

    args: list[str]
    setup: Callable[[Settings], None] = lambda app: None
    worker: bool = True  # consumes or publishes records (else it serves a report)
    fanout: int = 1  # a streamer's: the streams each record is staged on
    teardown: Callable[[Settings], None] = lambda app: None  # after the process stopped, both servers up


def _partitioned(app: Settings) -> None:
    client = connect(app.redis_url)  # a cluster's URL too
    RedisStreams(client).set_partitions(app.stream, 2)
    client.close()


def _wal_mode(app: Settings) -> None:
    from unilog.stream.modes import enable_wal

    enable_wal(app)  # the module's database: back to table mode in the test's teardown


def _table_mode(app: Settings) -> None:
    from unilog.stream.modes import disable_wal

    disable_wal(app)


KINDS = {
    "streamer": Kind(["streamer", "--poll-interval", "0.2", "--metrics-port", "{port}"]),
    # WAL capture: the slot's replication session too is ended by each restart (and by pg_terminate_backend)
    "streamer-wal": Kind(
        ["streamer", "--poll-interval", "0.2", "--metrics-port", "{port}"], setup=_wal_mode, teardown=_table_mode
    ),
    # over many streams: the side session that reads a share's batch is ended by each restart too, and reopened
    "streamer-many": Kind(["streamer", "--poll-interval", "0.2", "--metrics-port", "{port}"], fanout=FANOUT),
    "checkpoint": Kind(["consume", "restart_handlers:apply", "--name", "{name}", "--metrics-port", "{port}"]),
    "group": Kind(
        ["consume", "restart_handlers:apply", "--group", "{name}", "--worker", "w1", "--metrics-port", "{port}"],
    ),
    "partition": Kind(
        ["consume", "restart_handlers:apply", "--name", "{name}", "--partitioned", "--metrics-port", "{port}"],
        setup=_partitioned,
    ),
    "exporter": Kind(["metrics", "--port", "{port}"], worker=False),
    "dashboard": Kind(["dashboard", "--port", "{port}", "--interval", "0.5", "--read-only"], worker=False),
}


def works(kind: str, process: Process, app: Settings, numbers: range, when: str) -> None:
    """The process does its work for ``numbers`` and answers, ``when`` (for the messages)."""
    spec = KINDS[kind]
    if kind.startswith("streamer"):
        stage(app, numbers, spec.fanout)
        expected = sorted(list(range(numbers.stop)) * spec.fanout)
        wait_for(
            lambda: published(app, spec.fanout) == expected,
            f"the streamer to publish {numbers} once, {when}",
            process=process,
        )
    elif spec.worker:
        publish(app, numbers)
        expected = list(range(numbers.stop))
        name = app.stream
        wait_for(lambda: applied(app, name) == expected, f"{kind} to apply {numbers} once, {when}", process=process)
    elif kind == "exporter":
        wait_for(lambda: system_up(process), f"the exporter to read both servers, {when}", process=process)
    else:
        wait_for(lambda: dashboard_sampled(process), f"the dashboard to sample both servers, {when}", process=process)
    wait_for(lambda: ready(process), f"/readyz to answer 200, {when}", process=process)


def terminate_sessions(app: Settings) -> int:
    """``pg_terminate_backend`` of every unilog session (what a pooler's restart or a DBA does)."""
    with psycopg.connect(app.conninfo, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE 'unilog%%' "
            "AND pid <> pg_backend_pid()"
        ).fetchall()
    return len(rows)


def side_sessions(app: Settings) -> int:
    """Open side sessions of streamers (``unilog-<name>-side``) on the module's Postgres."""
    with psycopg.connect(app.conninfo, autocommit=True) as conn:
        sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'unilog-%%-side'"
        row = conn.execute(sql).fetchone()
        return int(row[0]) if row else 0


# the side session is Postgres's alone: a Redis restart of the many-stream streamer would repeat the streamer's
CASES = [(k, s) for k in KINDS for s in ("postgres", "redis") if (k, s) != ("streamer-many", "redis")]


@pytest.mark.parametrize(("kind", "server"), CASES)
def test_a_process_started_while_a_server_is_down_waits_and_rides_out_its_restarts(
    kind: str, server: str, servers: Servers, app: Settings, tmp_path: Path
) -> None:
    spec = KINDS[kind]
    spec.setup(app)
    servers.down(server)
    process = Process(spec.args, app, tmp_path)
    try:
        time.sleep(DOWN_AT_START)
        # started and serving while the server is still down (how soon depends on the machine's load, not a sleep)
        answered = wait_for(
            lambda: process.get("/readyz")[0] or None,
            f"/readyz to answer while {server} is down",
            timeout=60.0,
            process=process,
        )
        process.assert_alive(f"while {server} was down at its start")
        assert answered == 503, f"/readyz while {server} is down: {process.get('/readyz')}"
        servers.up(server)
        works(kind, process, app, range(0, 3), f"after {server} came up")
        servers.restart(server)
        works(kind, process, app, range(3, 6), f"after {server} restarted under it")
        if server == "postgres":
            terminate_sessions(app)
            works(kind, process, app, range(6, 9), "after its Postgres sessions were terminated")
        process.assert_alive("at the end")
        if kind == "streamer-many":
            assert side_sessions(app) >= 1, "the side session was reopened and read the last share"
            assert "side session" not in process.text(), "a side session ended while idle is reopened without a line"
        if kind == "streamer-wal":
            assert "streaming from the WAL" in process.text(), "the streamer read the slot, not the table"
    finally:
        code = process.stop()
        servers.ensure_up()
        spec.teardown(app)
    assert code == 0, process.text()
    process.assert_no_traceback()


def staged_rows(app: Settings) -> list[int]:
    with psycopg.connect(app.conninfo, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT (data->>'id')::int FROM staged_log_records WHERE object = %s AND stream = %s", (TABLE, app.stream)
        ).fetchall()
    return sorted(r[0] for r in rows)


def test_a_backfill_started_while_postgres_is_down_waits_and_rides_out_its_restart(
    servers: Servers, app: Settings, tmp_path: Path
) -> None:
    """The backfill needs Postgres alone: started while it is down, it waits; restarted under it mid-run, it goes on
    from its cursor; it stages every row once and ends by itself."""
    servers.down("postgres")
    args = ["backfill", TABLE, "--key", "id", "--stream", app.stream, "--rate", "40", "--name", app.stream]
    process = Process([*args, "--metrics-port", "{port}"], app, tmp_path)
    try:
        time.sleep(DOWN_AT_START)
        process.assert_alive("while Postgres was down at its start")
        servers.up("postgres")
        wait_for(lambda: len(staged_rows(app)) >= 40, "the first pages", process=process)
        servers.restart("postgres")
        wait_for(lambda: len(staged_rows(app)) > 80, "pages after the restart", process=process)
        terminate_sessions(app)
        assert process.popen.wait(60) == 0, process.text()
    finally:
        process.stop()
    assert staged_rows(app) == list(range(1, ROWS + 1)), "every row staged once"
    assert f"backfill {app.stream} done" in process.text()
    process.assert_no_traceback()


# -- a Redis Cluster master failing over ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedRedisCluster]:
    from clusters import embedded_cluster

    yield from embedded_cluster()


CLUSTER_KINDS = ["streamer", "checkpoint", "group", "partition", "exporter", "dashboard"]


def serving_master(cluster: EmbeddedRedisCluster, kind: str, app: Settings) -> EmbeddedRedis:
    """The master serving the process's stream (a partitioned consumer's: its first partition)."""
    return cluster.master_of(partition_stream(app.stream, 0) if kind == "partition" else app.stream)


def rejoined(cluster: EmbeddedRedisCluster, master: EmbeddedRedis) -> None:
    """The killed master started again and back as a replica (the next test needs the whole cluster)."""
    if master.pid is None:
        master.start()
    cluster.wait_replica_online(master)


@pytest.mark.slow
@pytest.mark.parametrize("kind", CLUSTER_KINDS)
def test_a_process_rides_out_a_cluster_master_failing_over(
    kind: str, servers: Servers, app: Settings, cluster: EmbeddedRedisCluster, tmp_path: Path
) -> None:
    """The master serving the stream (a partitioned consumer's: its first partition) is killed (SIGKILL) under the
    running process, its replica promoted, and the old master restarted (it rejoins as a replica): the process goes
    on, with no traceback."""
    on_cluster = app.with_(redis_url=cluster.cluster_url)
    spec = KINDS[kind]
    spec.setup(on_cluster)
    process = Process(spec.args, on_cluster, tmp_path)
    try:
        works(kind, process, on_cluster, range(0, 3), "on the cluster")
        master = serving_master(cluster, kind, on_cluster)
        replicas = cluster.replicas_of(master)
        master.kill()
        cluster.wait_failover(replicas)
        works(kind, process, on_cluster, range(3, 6), "after the master failed over")
        rejoined(cluster, master)
        works(kind, process, on_cluster, range(6, 9), "after the old master rejoined")
    finally:
        code = process.stop()
    assert code == 0, process.text()
    process.assert_no_traceback()


@pytest.mark.slow
@pytest.mark.parametrize("kind", CLUSTER_KINDS)
def test_a_process_started_while_a_cluster_master_is_down_waits_for_the_failover(
    kind: str, servers: Servers, app: Settings, cluster: EmbeddedRedisCluster, tmp_path: Path
) -> None:
    """The master serving the stream (a partitioned consumer's: its first partition) is killed before the process
    starts: the process waits (its first commands on those slots fail until the replica is promoted), then works;
    the old master rejoins as a replica under it. No traceback."""
    on_cluster = app.with_(redis_url=cluster.cluster_url)
    spec = KINDS[kind]
    spec.setup(on_cluster)
    master = serving_master(cluster, kind, on_cluster)
    replicas = cluster.replicas_of(master)
    master.kill()
    process = Process(spec.args, on_cluster, tmp_path)
    try:
        time.sleep(DOWN_AT_START)
        process.assert_alive("while a master was down at its start")
        cluster.wait_failover(replicas)
        works(kind, process, on_cluster, range(0, 3), "after the failover")
        rejoined(cluster, master)
        works(kind, process, on_cluster, range(3, 6), "after the old master rejoined")
    finally:
        code = process.stop()
        if master.pid is None:  # failed while it was down
            rejoined(cluster, master)
    assert code == 0, process.text()
    process.assert_no_traceback()
