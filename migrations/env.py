"""Alembic environment for unilog's own tables.

``unilog migrate`` runs this with a connection in ``config.attributes["connection"]``. unilog keeps its revision in
its own version table (``unilog_alembic_version``) so it never collides with the application's ``alembic_version``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from unilog.config import sqlalchemy_url

VERSION_TABLE = "unilog_alembic_version"

config = context.config


def _run(connection: object) -> None:
    context.configure(connection=connection, target_metadata=None, version_table=VERSION_TABLE)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no connection and no sqlalchemy.url given to unilog's migrations")
    # through sqlalchemy_url: a libpq URL with a host list (or key=value conninfo) becomes one SQLAlchemy can read
    engine = create_engine(sqlalchemy_url(url), poolclass=pool.NullPool)
    with engine.connect() as conn:
        _run(conn)


def run_migrations_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True, version_table=VERSION_TABLE)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
