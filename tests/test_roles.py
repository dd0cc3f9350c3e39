"""Least-privilege Postgres roles (`unilog grant`): each kind of process works under its role, and is refused,
in one line naming the privilege, outside it; nothing is lost or applied twice because of a refusal."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from cli import unilog

from unilog import Settings, emit
from unilog.cli import ExitCode

KINDS = ("producer", "streamer", "consumer", "operator")


def as_role(settings: Settings, database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return unilog(settings, *args, database_url=database_url)


def refused(result: subprocess.CompletedProcess[str], table: str) -> None:
    assert result.returncode == ExitCode.CONFIG, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"permission denied for table {table}" in lines[0] and "GRANT" in lines[0], lines


@pytest.fixture
def roles(settings: Settings, pg: Any) -> Iterator[dict[str, str]]:
    """A login role per kind (password ``pw``), granted with ``unilog grant``; their URLs by kind."""
    suffix = uuid.uuid4().hex[:6]
    names = {kind: f"unilog_{kind}_{suffix}" for kind in KINDS}
    try:
        for name in names.values():
            pg.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'pw'")
    except psycopg.errors.InsufficientPrivilege:
        pytest.skip("the test database's user may not create roles")
    flags = [arg for kind, name in names.items() for arg in (f"--{kind}", name)]
    # no REDIS_URL: a release step granting Postgres roles (the compose file's migrate) has no Redis to name
    result = unilog(settings, "grant", *flags, database_url=settings.database_url, redis_url="")
    assert result.returncode == 0, result.stderr
    pg.execute(f"GRANT INSERT ON applied TO {names['consumer']}")  # the handler's own table: the app grants it
    parts = urlsplit(settings.database_url)
    host = parts.netloc.rpartition("@")[2]
    yield {kind: urlunsplit(parts._replace(netloc=f"{name}:pw@{host}")) for kind, name in names.items()}
    for name in names.values():
        pg.execute(f"DROP OWNED BY {name}")
        pg.execute(f"DROP ROLE {name}")


def test_each_process_works_under_its_role_and_is_refused_outside_it(
    settings: Settings, pg: Any, rds: Any, roles: dict[str, str]
) -> None:
    with psycopg.connect(roles["producer"]) as conn:
        for n in range(10):
            emit(conn, action="create", object="ride", data={"n": n})
    with psycopg.connect(roles["producer"]) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT data FROM staged_log_records")
    with psycopg.connect(roles["producer"]) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("DELETE FROM staged_log_records")
    refused(as_role(settings, roles["consumer"], "streamer", "--once"), "unilog_producer")
    refused(as_role(settings, roles["producer"], "streamer", "--once"), "unilog_alembic_version")
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone() == (10,), "nothing lost"

    streamed = as_role(settings, roles["streamer"], "streamer", "--once")
    assert streamed.returncode == 0 and "streamed 10 records" in streamed.stdout, streamed.stderr
    assert rds.xlen(settings.stream) == 10

    refused(
        as_role(settings, roles["streamer"], "consume", "handlers:cli_handler", "--name", "cli", "--once"),
        "unilog_checkpoints",
    )
    consumed = as_role(settings, roles["consumer"], "consume", "handlers:cli_handler", "--name", "cli", "--once")
    assert consumed.returncode == 0, consumed.stderr
    grouped = as_role(settings, roles["consumer"], "consume", "handlers:group_handler", "--group", "g", "--once")
    assert grouped.returncode == 0, grouped.stderr
    counts = dict(pg.execute("SELECT consumer, count(*) FROM applied GROUP BY consumer").fetchall())
    assert counts == {"cli": 10, "group": 10}, "each record once, under the consumer's role"

    refused(as_role(settings, roles["consumer"], "status"), "staged_log_records")
    status = as_role(settings, roles["operator"], "status", "--json")
    assert status.returncode == 0, status.stderr
    reset = as_role(settings, roles["operator"], "consumer", "reset", "cli", "--to", "end")
    assert reset.returncode == 0, reset.stderr


def test_grant_names_a_missing_role_and_quotes_names(settings: Settings, pg: Any) -> None:
    missing = as_role(settings, settings.database_url, "grant", "--producer", 'x"; DROP TABLE applied; --')
    assert missing.returncode == ExitCode.CONFIG and "does not exist" in missing.stderr, missing.stderr
    assert pg.execute("SELECT to_regclass('applied') IS NOT NULL").fetchone() == (True,)


def test_a_producer_role_emits_a_registered_type_from_sql_and_an_operator_reads_the_registry(
    settings: Settings, pg: Any, roles: dict[str, str]
) -> None:
    """``unilog_emit`` with a record type reads ``unilog_schemas`` as its caller; ``unilog schema list`` and
    ``export`` (and ``unilog asyncapi``, the dashboard) read it as an operator."""
    pg.execute(
        "INSERT INTO unilog_schemas (name, version, stream, object, action, schema, fingerprint) "
        """VALUES ('Paid', 1, '', 'payment', 'paid', '{"required": ["amount"]}', 'sha256:00')"""
    )
    with psycopg.connect(roles["producer"]) as conn:
        conn.execute(
            "SELECT unilog_emit(NULL, NULL, 'paid', 'payment', '{\"amount\": \"1.00\"}', record_type => 'Paid', "
            "record_version => 1)"
        )
        conn.commit()
    assert pg.execute("SELECT record_type FROM staged_log_records").fetchall() == [("Paid@1",)]
    listed = as_role(settings, roles["operator"], "schema", "list")
    assert listed.returncode == 0 and listed.stdout.startswith("Paid v1"), listed.stderr
    assert as_role(settings, roles["operator"], "schema", "export").returncode == 0
