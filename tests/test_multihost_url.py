"""Every command takes the database URLs libpq takes (issue 36): a multi-host URL whose first host is down and whose
second is the primary (``target_session_attrs=read-write``) reaches the primary, as after a failover; a URL libpq
cannot use is one line and the configuration exit code, never a traceback."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from cli import one_line, unilog
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import create_async_engine

from unilog import Settings, emit, emit_async
from unilog.cli import ExitCode
from unilog.config import redact_url, sqlalchemy_url
from unilog.harness.embedded import free_port
from unilog.harness.pytest_plugin import PostgresHandle, drop_database
from unilog.store import SCHEMA_HEAD


def multi_host(url: str, form: str = "netloc") -> str:
    """``url``'s server as the second of two hosts, the first a port nothing listens on, read-write wanted.

    ``form``: ``netloc`` (``u@h1:p1,h2:p2/db``), ``query`` (``u@/db?host=h1,h2&port=p1,p2``) or ``keywords``
    (``host=h1,h2 port=p1,p2 dbname=db``)."""
    params = conninfo_to_dict(url)
    host, port, dead = params.pop("host"), params.pop("port", "5432"), free_port()
    assert host and not str(host).startswith("/"), "these tests need the test server over TCP"
    if form == "keywords":
        hosts = {"host": f"127.0.0.1,{host}", "port": f"{dead},{port}"}
        return make_conninfo(**params, **hosts, target_session_attrs="read-write")
    user, password, dbname = (quote(str(params.pop(k, "")), safe="") for k in ("user", "password", "dbname"))
    auth = f"{user}:{password}@" if password else f"{user}@"
    rest = "".join(f"&{k}={quote(str(v), safe='')}" for k, v in params.items())
    if form == "query":
        return f"postgresql://{auth}/{dbname}?host=127.0.0.1,{host}&port={dead},{port}&target_session_attrs=read-write{rest}"
    return f"postgresql://{auth}127.0.0.1:{dead},{host}:{port}/{dbname}?target_session_attrs=read-write{rest}"


@pytest.fixture
def empty_database(unilog_postgres: PostgresHandle) -> Iterator[str]:
    """A new database with nothing in it (not cloned from the migrated template), on the test's own server."""
    name = f"unilog_mh_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(unilog_postgres.admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = unilog_postgres.url_for(name)
    try:
        yield url
    finally:
        drop_database(unilog_postgres, url)


@pytest.mark.parametrize("form", ["netloc", "query", "keywords"])
def test_migrate_reaches_the_primary_past_a_dead_first_host(
    empty_database: str, unilog_redis_url: str, form: str
) -> None:
    settings = Settings(database_url=empty_database, redis_url=unilog_redis_url)
    result = unilog(settings, "migrate", database_url=multi_host(empty_database, form))
    assert result.returncode == ExitCode.OK, result.stderr
    assert "unilog: database migrated" in result.stdout
    with psycopg.connect(empty_database) as conn:
        (revision,) = conn.execute("SELECT version_num FROM unilog_alembic_version").fetchone() or (None,)
        assert revision is not None and revision >= SCHEMA_HEAD
        assert conn.execute("SELECT to_regclass('staged_log_records') IS NOT NULL").fetchone() == (True,)


def test_unilogs_alembic_env_alone_takes_a_libpq_host_list(empty_database: str) -> None:
    """``alembic upgrade`` on unilog's own environment with ``sqlalchemy.url`` set, no connection handed in."""
    from alembic import command

    from unilog.ops.schema import alembic_config

    cfg = alembic_config()
    cfg.set_main_option("sqlalchemy.url", multi_host(empty_database).replace("%", "%%"))  # ConfigParser's escape
    command.upgrade(cfg, "heads")
    with psycopg.connect(empty_database) as conn:
        assert conn.execute("SELECT to_regclass('staged_log_records') IS NOT NULL").fetchone() == (True,)


@pytest.fixture
def mh(settings: Settings) -> Settings:
    """The test's settings, the database reached through a dead first host and ``target_session_attrs``."""
    return settings.with_(database_url=multi_host(settings.database_url))


def test_status_and_capture_modes_through_a_host_list(mh: Settings, pg: Any) -> None:
    status = unilog(mh, "status", "--json")
    assert status.returncode == ExitCode.OK, status.stderr
    assert isinstance(json.loads(status.stdout), dict)
    if pg.execute("SHOW wal_level").fetchone()[0] != "logical":
        pytest.skip("the Postgres given by DATABASE_URL has no wal_level=logical for `unilog capture wal`")
    wal = unilog(mh, "capture", "wal")
    assert wal.returncode == ExitCode.OK, wal.stderr
    assert pg.execute("SELECT count(*) FROM pg_replication_slots WHERE database = current_database()").fetchone()[0]
    assert "wal" in unilog(mh, "capture", "status").stdout.lower()
    table = unilog(mh, "capture", "table")
    assert table.returncode == ExitCode.OK, table.stderr
    assert not pg.execute("SELECT count(*) FROM pg_replication_slots WHERE database = current_database()").fetchone()[0]


def test_grant_through_a_host_list(mh: Settings, pg: Any) -> None:
    role = f"mh_producer_{uuid.uuid4().hex[:8]}"
    try:
        result = unilog(mh, "grant", "--producer", role, "--create")
        assert result.returncode == ExitCode.OK, result.stderr
        assert f"{role} may now run unilog's producer" in result.stdout
        row = pg.execute("SELECT has_table_privilege(%s, 'staged_log_records', 'INSERT')", (role,)).fetchone()
        assert row == (True,)
    finally:  # roles belong to the whole (test) server, not to the test's database
        if pg.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
            pg.execute(f'DROP OWNED BY "{role}"')
            pg.execute(f'DROP ROLE "{role}"')


def test_backfill_through_a_host_list(mh: Settings, pg: Any) -> None:
    pg.execute("CREATE TABLE mh_accounts (id int PRIMARY KEY, balance int NOT NULL)")
    pg.execute("INSERT INTO mh_accounts SELECT i, i * 10 FROM generate_series(1, 25) i")
    result = unilog(mh, "backfill", "mh_accounts", "--key", "id")
    assert result.returncode == ExitCode.OK, result.stderr
    staged = pg.execute("SELECT count(DISTINCT key) FROM staged_log_records WHERE action = 'backfill'").fetchone()
    assert staged == (25,)


def test_sqlalchemy_url_of_a_host_list_stages_records(mh: Settings, pg: Any) -> None:
    url = sqlalchemy_url(mh.database_url)
    assert "host=127.0.0.1," in url and "target_session_attrs=read-write" in url  # SQLAlchemy's host-list form
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            assert conn.execute(text("SELECT NOT pg_is_in_recovery()")).scalar() is True
            emit(conn, action="create", object="ride", data={"via": "sync"})
    finally:
        engine.dispose()

    async def stage_async() -> None:
        async_engine = create_async_engine(url)
        try:
            async with async_engine.begin() as conn:
                await emit_async(conn, action="create", object="ride", data={"via": "async"})
        finally:
            await async_engine.dispose()

    asyncio.run(stage_async())
    rows = pg.execute("SELECT data->>'via' FROM staged_log_records ORDER BY id").fetchall()
    assert rows == [("sync",), ("async",)]


DJANGO_URL = """
import django, json, sys
from django.conf import settings
settings.configure(DATABASES={"default": json.loads(sys.argv[1])}, INSTALLED_APPS=[])
django.setup()
from unilog.django import database_url
print(database_url())
"""


def test_the_django_helpers_url_keeps_the_host_list_and_libpq_options(mh: Settings, pg: Any) -> None:
    pytest.importorskip("django")
    params = conninfo_to_dict(mh.database_url)
    database = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": params["dbname"],
        "USER": params.get("user", ""),
        "PASSWORD": params.get("password", ""),
        "HOST": params["host"],
        "PORT": params["port"],
        "OPTIONS": {"target_session_attrs": "read-write", "pool": False},  # pool: Django's own, not libpq's
    }
    argv = [sys.executable, "-c", textwrap.dedent(DJANGO_URL), json.dumps(database)]
    made = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert conninfo_to_dict(made)["host"] == params["host"] and "target_session_attrs=read-write" in made
    assert "pool" not in made
    result = unilog(mh, "status", "--json", database_url=made)
    assert result.returncode == ExitCode.OK, result.stderr


BAD_URLS = {
    "port": ("postgresql://u:hunter2@127.0.0.1:notaport/db", "port 'notaport'"),
    "port in a list": ("postgresql://u:hunter2@127.0.0.1:5432,127.0.0.1:99999/db", "port '99999'"),
    "parameter": ("postgresql://u:hunter2@127.0.0.1:1,127.0.0.1:2/db?no_such_option=1", '"no_such_option"'),
    "syntax": ("postgresql://u:hunter2@[::1/db", "IPv6"),
    "percent": ("postgresql://u:hunter2%zz@h/db", "percent-encoded"),
    "counts": ("postgresql://u:hunter2@/db?host=a,b&port=1,2,3", "3 ports for 2 hosts"),
    "session attrs": ("postgresql://u:hunter2@a:1,b:2/db?target_session_attrs=readwrite", "target_session_attrs"),
    "keywords": ("host=a,b port=1,2 dbname='x password=hunter2", "unterminated quoted string"),
}
COMMANDS = {
    "migrate": ["migrate"],
    "status": ["status"],
    "capture": ["capture", "wal"],
    "grant": ["grant", "--producer", "nobody"],
    "backfill": ["backfill", "t", "--key", "id"],
    "streamer": ["streamer", "--once"],
}


# every problem through two commands, and one problem through every command (each a process start: not all pairs)
PAIRS = [(case, command) for case in BAD_URLS for command in ("migrate", "status")]
PAIRS += [("port in a list", command) for command in COMMANDS if command not in ("migrate", "status")]


@pytest.mark.parametrize(("case", "command"), PAIRS)
def test_a_url_libpq_cannot_use_is_one_line_and_the_config_exit_code(
    unilog_redis_url: str, case: str, command: str
) -> None:
    url, problem = BAD_URLS[case]
    settings = Settings(database_url="postgresql://u@127.0.0.1/db", redis_url=unilog_redis_url)
    result = unilog(settings, *COMMANDS[command], database_url=url, timeout=30)
    assert result.returncode == ExitCode.CONFIG, result.stderr
    line = one_line(result)
    assert "DATABASE_URL" in line and "malformed" in line and problem in line, line
    assert "hunter2" not in line


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:pw@h1:1,h2:2/db?target_session_attrs=read-write", "postgresql://u:***@h1:1,h2:2/db?"),
        ("postgresql://u@/db?host=h1,h2&password=pw&port=1,2", "postgresql://u@/db?host=h1,h2&password=***&port"),
        ("host=h1,h2 port=1,2 password=pw dbname=db", "host=h1,h2 port=1,2 password=*** dbname=db"),
        ("host=h1 password='p w' dbname=db", "host=h1 password=*** dbname=db"),
        ("postgresql://u:pw@[::1/db", "postgresql://u:***@[::1/db"),
    ],
)
def test_redact_url_hides_the_password_of_every_form(url: str, shown: str) -> None:
    assert redact_url(url).startswith(shown) and "pw" not in redact_url(url).replace("password", "")
