"""``unilog grant`` and ``unilog acl``: least-privilege Postgres roles and Redis ACL users for each kind of process."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..config import postgres_conninfo
from ..errors import ConfigurationError
from .common import ExitCode


def cmd_grant(args: argparse.Namespace) -> int:
    from .. import store
    from ..store import roles

    wanted = [(kind, getattr(args, kind)) for kind in roles.KINDS if getattr(args, kind)]
    if not wanted:
        raise ConfigurationError("name at least one role: --producer, --streamer, --consumer or --operator ROLE")
    # Postgres only: a release step granting roles has no Redis to name (DATABASE_URL as `unilog migrate` reads it)
    conninfo = postgres_conninfo(args.database_url or os.environ.get("DATABASE_URL", ""))
    with store.connect(conninfo, application_name="unilog-grant") as conn, conn.transaction():
        store.check_schema(conn)
        for kind, role in wanted:
            if not roles.role_exists(conn, role):
                if not args.create:
                    raise ConfigurationError(f"role {role!r} does not exist: create it, or pass --create")
                roles.create_role(conn, role)
                print(f"unilog: created role {role} (LOGIN, no password: set one with ALTER ROLE)")
            for statement in roles.grant(conn, kind, role):
                if args.verbose:
                    print(f"  {statement};")
            print(f"unilog: {role} may now run unilog's {kind} and nothing more")
    return ExitCode.OK


def cmd_acl(args: argparse.Namespace) -> int:
    from ..config import validate_stream_name
    from ..ops import acl

    streams = [validate_stream_name(s) for s in args.streams.split(",")] if args.streams else []
    if not streams:
        raise ConfigurationError("name the streams: --streams orders,payments (partitions are included)")
    users = {kind: getattr(args, f"{kind}_user") or f"{args.prefix}{kind}" for kind in acl.KINDS}
    if args.admin_password and not args.aclfile:
        raise ConfigurationError("--admin-password is for --aclfile (the default user's line of an ACL file)")
    for line in acl.acl_lines(users, streams, args.password, aclfile=args.aclfile, admin_password=args.admin_password):
        print(line)
    return ExitCode.OK


def add(sub: Any) -> None:
    """Add this module's commands to the ``unilog`` sub-parsers."""
    p = sub.add_parser("grant", help="give Postgres roles exactly what each kind of unilog process needs")
    p.add_argument("--producer", metavar="ROLE", help="may only insert staged records")
    p.add_argument("--streamer", metavar="ROLE", help="reads and deletes staged records, advances positions")
    p.add_argument("--consumer", metavar="ROLE", help="its checkpoints and the groups' processed records")
    p.add_argument("--operator", metavar="ROLE", help="status, reset, rebuild, dead letters")
    p.add_argument("--create", action="store_true", help="create roles that do not exist (LOGIN, no password)")
    p.add_argument("--verbose", "-v", action="store_true", help="print every GRANT")
    p.add_argument("--database-url", help="default: $DATABASE_URL")
    p.set_defaults(func=cmd_grant)
    a = sub.add_parser("acl", help="print ACL SETUSER lines: a Redis user per kind of process, its commands and keys")
    a.add_argument("--streams", help="comma-separated streams the users may touch (with their partitions)")
    a.add_argument("--prefix", default="unilog-", help="user names are PREFIX + kind (default %(default)s)")
    a.add_argument("--password", default="<password>", help="the password to put in the lines (default a placeholder)")
    a.add_argument(
        "--aclfile",
        action="store_true",
        help="print an ACL file for redis-server --aclfile: password hashes, and the default user off",
    )
    a.add_argument("--admin-password", help="with --aclfile: the default user keeps every right, under this password")
    for kind in ("streamer", "consumer", "group", "operator"):
        a.add_argument(f"--{kind}-user", metavar="USER", help=f"the {kind}'s user name")
    a.set_defaults(func=cmd_acl)
