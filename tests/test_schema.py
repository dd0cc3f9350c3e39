"""unilog's migrations: standalone (`unilog migrate`) and inside an application's own Alembic environment."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psycopg
import pytest

from unilog.config import sqlalchemy_url
from unilog.harness.pytest_plugin import PostgresHandle
from unilog.store import SCHEMA_HEAD


def test_app_alembic_env_can_include_unilog_branch(unilog_postgres: PostgresHandle, tmp_path: Path) -> None:
    """The docs' recipe (docs/guides/operations.md, Schema and migrations): add `unilog.migrations:versions` to
    version_locations, then `alembic upgrade heads`."""
    with psycopg.connect(unilog_postgres.admin_url, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS app_alembic WITH (FORCE)")
        admin.execute("CREATE DATABASE app_alembic")
    url = unilog_postgres.url_for("app_alembic")
    versions = tmp_path / "alembic" / "versions"
    versions.mkdir(parents=True)
    (tmp_path / "alembic.ini").write_text(
        textwrap.dedent(
            f"""
            [alembic]
            script_location = %(here)s/alembic
            version_locations = %(here)s/alembic/versions unilog.migrations:versions
            sqlalchemy.url = {sqlalchemy_url(url)}
            """
        )
    )
    (tmp_path / "alembic" / "env.py").write_text(
        textwrap.dedent(
            """
            from alembic import context
            from sqlalchemy import create_engine
            engine = create_engine(context.config.get_main_option("sqlalchemy.url"))
            with engine.connect() as conn:
                context.configure(connection=conn, target_metadata=None)
                with context.begin_transaction():
                    context.run_migrations()
            """
        )
    )
    (tmp_path / "alembic" / "script.py.mako").write_text("")
    (versions / "a1_rides.py").write_text(
        textwrap.dedent(
            """
            from alembic import op
            revision = "a1"
            down_revision = None
            branch_labels = ("app",)
            def upgrade():
                op.execute("CREATE TABLE rides (id bigserial primary key, distance float8 not null)")
            """
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "alembic", "upgrade", "heads"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    with psycopg.connect(url) as conn:
        tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        heads = {r[0] for r in conn.execute("SELECT version_num FROM alembic_version")}
    assert {"rides", "staged_log_records", "unilog_checkpoints", "unilog_producer"} <= tables
    assert heads == {"a1", SCHEMA_HEAD}


def test_migrate_twice_is_idempotent(settings: Any) -> None:
    from unilog.ops.schema import migrate

    migrate(settings.database_url)
    migrate(settings.database_url)
    with psycopg.connect(settings.conninfo) as conn:
        assert conn.execute("SELECT count(*) FROM unilog_producer").fetchone() == (1,)


def test_unilog_0010_downgrades_to_0009s_unilog_stage_and_back(unilog_postgres: PostgresHandle) -> None:
    """unilog_0010 replaces unilog_stage's body; its downgrade runs unilog_0009's definition (loaded from that
    migration's file, not copied), and both bodies stage rows and messages alike."""
    from alembic import command
    from sqlalchemy import create_engine, pool

    from unilog.ops.schema import alembic_config, migrate

    with psycopg.connect(unilog_postgres.admin_url, autocommit=True) as admin:
        level = admin.execute("SHOW wal_level").fetchone()[0]  # type: ignore[index]
        if level != "logical":
            pytest.skip(f"the Postgres given by DATABASE_URL has wal_level={level}; a logical message needs logical")
        admin.execute("DROP DATABASE IF EXISTS stage_down WITH (FORCE)")
        admin.execute("CREATE DATABASE stage_down")
    url = unilog_postgres.url_for("stage_down")
    migrate(url)
    source = "SELECT prosrc FROM pg_proc WHERE proname = 'unilog_stage'"
    stage = "SELECT unilog_stage('create', 'ride', '{\"n\": 1}', '', 'k', NULL, NULL)"

    def stages(conn: psycopg.Connection[Any]) -> list[Any]:
        out = []
        for mode in (0, 1):
            conn.execute("SELECT setval('unilog_emit_mode', %s)", (mode,))
            out.append(conn.execute(stage).fetchone()[0])  # type: ignore[index]
        conn.rollback()
        return out

    with psycopg.connect(url) as conn:
        assert "pg_sequence_last_value" in conn.execute(source).fetchone()[0]  # type: ignore[index]
        row_id, message = stages(conn)
        assert isinstance(row_id, int) and message is None
    engine = create_engine(sqlalchemy_url(url), poolclass=pool.NullPool)
    with engine.begin() as sa:
        cfg = alembic_config()
        cfg.attributes["connection"] = sa
        command.downgrade(cfg, "unilog_0009")
    engine.dispose()
    with psycopg.connect(url) as conn:
        assert "SELECT last_value FROM unilog_emit_mode" in conn.execute(source).fetchone()[0]  # type: ignore[index]
        row_id, message = stages(conn)
        assert isinstance(row_id, int) and message is None
    migrate(url)
    with psycopg.connect(url) as conn:
        assert "pg_sequence_last_value" in conn.execute(source).fetchone()[0]  # type: ignore[index]


def test_unilog_0011_downgrades_without_its_claims_and_index_and_back(unilog_postgres: PostgresHandle) -> None:
    """unilog_0011 adds table mode's claims and its (stream, id) read index; its downgrade removes both."""
    from alembic import command
    from sqlalchemy import create_engine, pool

    from unilog.ops.schema import alembic_config, migrate

    with psycopg.connect(unilog_postgres.admin_url, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS claims_down WITH (FORCE)")
        admin.execute("CREATE DATABASE claims_down")
    url = unilog_postgres.url_for("claims_down")
    migrate(url)
    present = "SELECT to_regclass('unilog_claims') IS NOT NULL, to_regclass('staged_log_records_stream_id') IS NOT NULL"
    with psycopg.connect(url) as conn:
        assert conn.execute(present).fetchone() == (True, True)
    engine = create_engine(sqlalchemy_url(url), poolclass=pool.NullPool)
    with engine.begin() as sa:
        cfg = alembic_config()
        cfg.attributes["connection"] = sa
        command.downgrade(cfg, "unilog_0010")
    engine.dispose()
    with psycopg.connect(url) as conn:
        assert conn.execute(present).fetchone() == (False, False)
    migrate(url)
    with psycopg.connect(url) as conn:
        assert conn.execute(present).fetchone() == (True, True)
    with psycopg.connect(unilog_postgres.admin_url, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS claims_down WITH (FORCE)")
