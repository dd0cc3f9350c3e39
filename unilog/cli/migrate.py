"""``unilog migrate``: apply unilog's migrations."""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import Any

from .common import ExitCode


def cmd_migrate(args: argparse.Namespace) -> int:
    import psycopg

    from ..ops.schema import migrate

    url = args.database_url or os.environ.get("DATABASE_URL", "")
    from ..config import postgres_conninfo

    postgres_conninfo(url)
    migrate(url, producer_id=args.producer_id)
    print("unilog: database migrated")
    from ..errors import UnilogError
    from ..ops.status import capture_mode_line

    # the mode is news, not the command's result: migrated is what counts
    with contextlib.suppress(UnilogError, psycopg.Error):
        print(f"unilog: {capture_mode_line(url)}")
    return ExitCode.OK


def add(sub: Any) -> None:
    """Add this module's commands to the ``unilog`` sub-parsers."""
    p = sub.add_parser("migrate", help="apply unilog's migrations to DATABASE_URL")
    p.add_argument("--database-url", help="default: $DATABASE_URL")
    p.add_argument("--producer-id", help="set this database's producer id (default: a random one at first migrate)")
    p.set_defaults(func=cmd_migrate)
