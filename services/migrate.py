"""``python -m services.migrate``: unilog's migrations plus the demo's tables and record types (registered in the
schema registry), idempotent (the release step).

With ``--grant-roles`` (the compose file's init service, run as the database's owner) it then gives each kind of
process its own login role: ``unilog grant --create`` for unilog's tables, the demo's own grants on its tables
(the application's to grant: unilog does not know them), and the password ``$APP_DB_PASSWORD``. Run again, it
changes nothing but the passwords.

With ``--capture wal`` (the compose file's: its Postgres runs with ``wal_level=logical``) it finally switches the
database to WAL capture mode (``unilog capture wal``, which needs ``$REDIS_URL`` to settle batches in flight; again:
nothing to do), and gives the streamer's role the ``REPLICATION`` attribute its slot needs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import psycopg
from psycopg import sql
from sqlalchemy import create_engine

from unilog import store
from unilog.cli import main as unilog_main
from unilog.config import postgres_conninfo, sqlalchemy_url
from unilog.errors import UnilogError
from unilog.ops.schema import migrate
from unilog.ops.status import capture_health

from .rides import STREAM, Base

RECORDS = f"{__package__ or 'services'}.records"  # the demo's record types

# kind of unilog process -> the demo's role for it (docker-compose.yml connects each service as one of them)
ROLES = {
    "producer": "rides_api",
    "streamer": "unilog_streamer",
    "consumer": "rides_consumer",
    "operator": "unilog_operator",
}
# what each role may do to the demo's own tables: the API inserts rides (and reads back the new id), consumers keep
# their state rows (DELETE for `--reset-state`), operators read both for `unilog reconcile`
APP_GRANTS = {
    "producer": ["GRANT INSERT, SELECT (id) ON rides TO {}", "GRANT USAGE ON SEQUENCE rides_id_seq TO {}"],
    "consumer": ["GRANT SELECT, INSERT, UPDATE, DELETE ON consumer_states TO {}"],
    "operator": ["GRANT SELECT ON rides, consumer_states TO {}"],
}


def prepare(database_url: str) -> None:
    """Apply unilog's migrations, create the demo's tables if missing and register its record types."""
    migrate(database_url)
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        Base.metadata.create_all(engine)
    finally:
        engine.dispose()
    register_types(database_url)


def register_types(database_url: str) -> list[str]:
    """Register the demo's record types (:mod:`.records`, under the name this package was imported as: ``services``
    or ``unilog_demo``) in the schema registry, as ``unilog schema register`` does, so ``unilog asyncapi`` documents
    them; the tags it registered (none the next time). A change that breaks the registered versions is refused."""
    from unilog.ops.registry import register_types as register

    conninfo = postgres_conninfo(database_url)
    with store.connect(conninfo, application_name="rides-migrate") as conn, conn.transaction():
        return register(conn, [RECORDS], STREAM)


def grant_roles(database_url: str, password: str) -> None:
    """Create :data:`ROLES` with ``unilog grant --create``, add :data:`APP_GRANTS` and set their password."""
    flags = [arg for kind, role in ROLES.items() for arg in (f"--{kind}", role)]
    if unilog_main(["grant", "--create", *flags, "--database-url", database_url]) != 0:
        raise UnilogError("unilog grant failed (its message is above)")
    with psycopg.connect(database_url) as conn, conn.transaction():
        for kind, role in ROLES.items():
            for statement in APP_GRANTS.get(kind, []):
                conn.execute(sql.SQL(statement).format(sql.Identifier(role)))
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(role), sql.Literal(password)))


def capture_wal(database_url: str, roles: bool) -> None:
    """WAL capture mode for the database (``unilog capture wal``, unless it is in it with its slot: a switch refuses
    while streamers run, as they do when the stack is brought up again); the streamer's role may stream from a slot."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        if roles:
            conn.execute(sql.SQL("ALTER ROLE {} REPLICATION").format(sql.Identifier(ROLES["streamer"])))
        capture = capture_health(conn)
    if capture["mode"] == "wal" and capture["exists"] and capture["wal_status"] != "lost":
        return
    if unilog_main(["capture", "wal"]) != 0:
        raise UnilogError("unilog capture wal failed (its message is above)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.migrate")
    parser.add_argument("--grant-roles", action="store_true", help="also create the fleet's roles ($APP_DB_PASSWORD)")
    parser.add_argument(
        "--capture", choices=("table", "wal"), default="table", help="the capture mode to leave the database in"
    )
    args = parser.parse_args(argv)
    url, password = os.environ.get("DATABASE_URL", ""), os.environ.get("APP_DB_PASSWORD", "")
    if args.grant_roles and not password:
        print("migrate: error: --grant-roles needs APP_DB_PASSWORD (the roles' password)", file=sys.stderr)
        return 3
    try:
        prepare(url)
        if args.grant_roles:
            grant_roles(url, password)
        if args.capture == "wal":
            capture_wal(url, args.grant_roles)
    except (UnilogError, psycopg.Error) as exc:
        print(f"migrate: error: {exc}", file=sys.stderr)
        return 3
    roles = f"; roles {', '.join(ROLES.values())}" if args.grant_roles else ""
    print(f"migrate: database ready{roles}; capture mode {args.capture}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
