"""Applying unilog's Alembic migrations.

``unilog migrate`` calls :func:`migrate`. The revisions live in the top-level ``migrations/`` folder, shipped as the
package ``unilog.migrations``, on their own Alembic branch (label ``unilog``) with their own version table, so an
application can either let unilog migrate its tables or include them in its own Alembic environment
(docs/guides/operations.md).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import psycopg
import structlog
from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, pool
from sqlalchemy.exc import DBAPIError

from .. import store
from ..config import postgres_conninfo, redact_url
from ..errors import MigrationFailed

log = structlog.get_logger(__name__)


def migrations_path() -> Path:
    """The folder holding unilog's Alembic environment (``env.py`` and ``versions/``)."""
    return Path(str(resources.files("unilog.migrations")))


def alembic_config() -> Config:
    """An Alembic config pointing at unilog's migrations."""
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_path()))
    return cfg


def migrate(database_url: str, *, revision: str = "heads", producer_id: str | None = None) -> None:
    """Upgrade the database to ``revision``; optionally set this database's producer id. Idempotent."""
    conninfo = postgres_conninfo(database_url)
    # SQLAlchemy (for Alembic) gets its connection from the store: one place opens connections, with keepalives
    # and a one-line ServerUnreachable when the server is not there. The URL names only the dialect: libpq alone
    # reads DATABASE_URL, so every form it takes works (host lists, key=value conninfo) and SQLAlchemy parses none
    engine = create_engine(
        "postgresql+psycopg://",
        poolclass=pool.NullPool,
        creator=lambda: store.connect(conninfo, application_name="unilog-migrate"),
    )
    try:
        with engine.begin() as conn:
            pg = conn.connection.driver_connection  # the same session and transaction Alembic runs in
            assert pg is not None
            store.take_migration_lock(pg)
            cfg = alembic_config()
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
            if producer_id is not None:
                store.set_producer_id(pg, producer_id)
    except DBAPIError as exc:  # what Postgres refused, in one line: no traceback for a failed migration
        original = exc.orig
        if isinstance(original, psycopg.OperationalError) and original.sqlstate is None:
            raise store.unreachable(conninfo, original) from None
        raise MigrationFailed(f"unilog migrate failed: {_first_line(original)}{_hint(original)}") from None
    finally:
        engine.dispose()
    log.info("migrated", database=redact_url(database_url), revision=revision)


def _first_line(exc: BaseException | None) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _hint(exc: BaseException | None) -> str:
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return " (the role needs CREATE on the database's schema, or run the migration as the table owner)"
    return ""


def set_producer_id(database_url: str, producer_id: str) -> None:
    """Make the database a distinct producer ``producer_id`` in epoch 1, as if freshly migrated: for a database
    copied from another (a test database cloned from a migrated template), whose identity would otherwise be the
    original's, or be taken for a restore and start a new epoch."""
    with store.connect(postgres_conninfo(database_url), application_name="unilog-schema") as conn:
        store.adopt_identity(conn, producer_id)
