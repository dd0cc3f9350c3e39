"""Applying unilog's Alembic migrations.

``unilog migrate`` calls :func:`migrate`. The revisions live in the top-level ``migrations/`` folder, shipped as the
package ``unilog.migrations``, on their own Alembic branch (label ``unilog``) with their own version table, so an
application can either let unilog migrate its tables or include them in its own Alembic environment (README).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import structlog
from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, pool, text

from .config import redact_url, sqlalchemy_url
from .errors import ServerUnreachable

log = structlog.get_logger(__name__)

_MIGRATE_LOCK = 0x756E696C6F67  # "unilog": serializes concurrent `unilog migrate` runs


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
    engine = create_engine(sqlalchemy_url(database_url), poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATE_LOCK})
            cfg = alembic_config()
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
            if producer_id is not None:
                conn.execute(text("UPDATE unilog_producer SET producer_id = :p"), {"p": producer_id})
    except Exception as exc:
        if type(exc).__name__ == "OperationalError":
            reason = str(getattr(exc, "orig", exc)).strip().splitlines()[-1]
            raise ServerUnreachable(
                f"cannot connect to Postgres at {redact_url(database_url)}: {reason} "
                "(is the server running and DATABASE_URL right?)"
            ) from None
        raise
    finally:
        engine.dispose()
    log.info("migrated", database=redact_url(database_url), revision=revision)
