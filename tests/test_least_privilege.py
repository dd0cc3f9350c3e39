"""The Rocket Rides fleet end to end under least privilege: Postgres over TLS with full verification, every process
under its own role (`unilog grant`, plus the app's own tables), every Redis connection under its ACL user
(`unilog acl`) over TLS where a TLS-capable redis-server exists; the checkpoint consumer and the group agree with the
canonical totals."""

from __future__ import annotations

import os
import random
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

pytest.importorskip("cryptography")

from test_tls import make_ca, make_server_cert, start_tls_redis, verified

from unilog import Settings
from unilog.harness.embedded import EmbeddedPostgres, EmbeddedServerError, ServerNotFound
from unilog.wire import hwm_key, registry_key

TESTS = Path(__file__).parent
PASSWORD = "lp-" + uuid.uuid4().hex[:10]


def with_user(url: str, user: str) -> str:
    parts = urlsplit(url)  # keeps the query: TLS settings stay
    return urlunsplit(parts._replace(netloc=f"{user}:{PASSWORD}@{parts.netloc.rpartition('@')[2]}"))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[EmbeddedPostgres, Path]]:
    ca_path, ca_cert, ca_key = make_ca(tmp_path, "fleet-ca")
    try:
        pg = EmbeddedPostgres(tmp_path / "pg", tls=make_server_cert(tmp_path, ca_cert, ca_key)).start()
    except ServerNotFound as exc:
        pytest.skip(f"no Postgres to start: {exc}")
    yield pg, ca_path
    pg.stop(mode="immediate", cleanup=True)


@pytest.fixture
def redis_tls(tmp_path: Path, settings: Settings) -> Iterator[tuple[str, Any]]:
    """(URL, client) of a Redis with TLS and verification where a TLS build exists; else the test's own Redis."""
    import redis

    folder = tmp_path / "redis-tls"
    folder.mkdir()
    try:
        server, url, _ = start_tls_redis(folder)
    except (ServerNotFound, EmbeddedServerError):  # no TLS build here: the same fleet, Redis in the clear
        client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
        yield settings.redis_url, client
        client.close()
        return
    client = redis.Redis.from_url(url, decode_responses=True)
    yield url, client
    client.close()
    server.stop(cleanup=True)


def run(database_url: str, redis_url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": database_url, "REDIS_URL": redis_url}
    result = subprocess.run([sys.executable, *argv], env=env, cwd=TESTS, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (argv, result.stderr[-2000:])
    return result


def test_the_fleet_agrees_under_roles_acl_users_and_tls(
    server: tuple[EmbeddedPostgres, Path], redis_tls: tuple[str, Any]
) -> None:
    from unilog_demo.fleet import stage_ride
    from unilog_demo.migrate import prepare
    from unilog_demo.rides import STREAM, canonical_totals, consumer_totals

    pg, ca = server
    admin = verified(pg, ca)
    redis_url, rds = redis_tls
    unilog = [sys.executable, "-m", "unilog"]
    run(admin, redis_url, *unilog[1:], "migrate")
    prepare(admin)
    roles = {kind: f"lp_{kind}_{uuid.uuid4().hex[:6]}" for kind in ("producer", "streamer", "consumer")}
    with psycopg.connect(admin, autocommit=True) as conn:
        for role in roles.values():
            conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}'")
        # the application's own tables are the application's to grant
        conn.execute(f"GRANT INSERT, SELECT (id) ON rides TO {roles['producer']}")
        conn.execute(f"GRANT USAGE ON SEQUENCE rides_id_seq TO {roles['producer']}")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE ON consumer_states TO {roles['consumer']}")
    run(admin, redis_url, *unilog[1:], "grant", *[a for k, r in roles.items() for a in (f"--{k}", r)])
    users = f"lp{uuid.uuid4().hex[:6]}-"
    acl = run(admin, redis_url, *unilog[1:], "acl", "--streams", STREAM, "--prefix", users, "--password", PASSWORD)
    try:
        for line in acl.stdout.splitlines():
            rds.execute_command(*shlex.split(line))
    except Exception as exc:  # a Redis given by URL whose user may not manage ACLs
        pytest.skip(f"the test's Redis user may not create ACL users: {exc}")
    db = {kind: with_user(admin, role) for kind, role in roles.items()}
    redis_as = {kind: with_user(redis_url, f"{users}{kind}") for kind in ("streamer", "consumer", "group")}
    try:
        rng = random.Random(7)
        with psycopg.connect(db["producer"]) as conn:
            assert conn.pgconn.ssl_in_use
            for i in range(40):
                stage_ride(conn, f"c{i}", rng, STREAM)
                conn.commit()
        run(db["streamer"], redis_as["streamer"], *unilog[1:], "streamer", "--once", "--default-stream", STREAM)
        run(db["consumer"], redis_as["consumer"], "-m", "unilog_demo.consumer", "consumer0", "--once")
        run(
            db["consumer"],
            redis_as["group"],
            "-m",
            "unilog_demo.consumer",
            "group0",
            "--group",
            "--worker",
            "w",
            "--once",
        )
        with psycopg.connect(admin) as conn:
            canonical, totals = canonical_totals(conn), consumer_totals(conn)
        assert canonical.ride_count == 40
        assert totals["consumer0"] == canonical and totals["group0"] == canonical
    finally:
        for kind in ("streamer", "consumer", "group", "operator"):
            rds.execute_command("ACL", "DELUSER", f"{users}{kind}")
        rds.delete(STREAM, hwm_key(STREAM), registry_key(STREAM))
