"""``unilog schema register|list|show|check|mode|retire``: the schema registry of record types in Postgres.

``check`` and ``register`` compare each record type a module declares with the versions registered under its name,
under the compatibility mode of the type's stream (``unilog schema mode``; default ``backward``): a ``*_transitive``
mode compares with every registered version below the new one that is not retired, the others with the newest such
version only. A backward check against a version the type has an upcaster chain from is satisfied by the chain
(``v1 read through upcaster``). Each breaking change is one line on stderr and the exit code is
:attr:`~unilog.cli.common.ExitCode.SCHEMA_INCOMPATIBLE`; ``register`` then registers nothing.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..config import SCHEMA_MODES
from .common import runs


def _connection_args(p: argparse.ArgumentParser, *, stream: bool = False) -> None:
    p.add_argument("--database-url", help="default: $DATABASE_URL")
    if stream:
        p.add_argument(
            "--default-stream", help="the stream of types declared without one (default: $UNILOG_STREAM or 'unilog')"
        )


def add(sub: Any) -> None:
    """Add this module's commands to the ``unilog`` sub-parsers."""
    p = sub.add_parser("schema", help="the schema registry of record types (versions, compatibility)")
    schema_sub = p.add_subparsers(dest="schema_command", required=True)
    q = schema_sub.add_parser("register", help="check a module's record types, then register their new versions")
    q.add_argument("modules", nargs="+", metavar="MODULE", help="a module (or package) declaring record types")
    q.add_argument("--dry-run", action="store_true", help="check and say what would be registered; register nothing")
    _connection_args(q, stream=True)
    q.set_defaults(func=runs("registry:cmd_register"))
    q = schema_sub.add_parser("list", help="every registered type and version")
    q.add_argument("--json", action="store_true")
    _connection_args(q)
    q.set_defaults(func=runs("registry:cmd_list"))
    q = schema_sub.add_parser("show", help="print a registered type's JSON Schema")
    q.add_argument("name")
    q.add_argument("--version", type=int, help="default: the newest registered")
    _connection_args(q)
    q.set_defaults(func=runs("registry:cmd_show"))
    q = schema_sub.add_parser(
        "check", help="compare a module's record types with the registered versions (exit 17 on a breaking change)"
    )
    q.add_argument("modules", nargs="+", metavar="MODULE", help="a module (or package) declaring record types")
    q.add_argument(
        "--against",
        metavar="FILE",
        help="compare with a registry `unilog schema export` wrote, not the database's (a CI job without one)",
    )
    _connection_args(q, stream=True)
    q.set_defaults(func=runs("registry:cmd_check"))
    q = schema_sub.add_parser("export", help="the registry and the streams' modes as JSON, for `check --against`")
    q.add_argument("--out", metavar="FILE", help="default: standard output")
    _connection_args(q)
    q.set_defaults(func=runs("registry:cmd_export"))
    q = schema_sub.add_parser("mode", help="show or set a stream's compatibility mode (default backward)")
    q.add_argument("stream")
    q.add_argument("mode", nargs="?", choices=SCHEMA_MODES)
    _connection_args(q)
    q.set_defaults(func=runs("registry:cmd_mode"))
    q = schema_sub.add_parser("retire", help="retire a registered version: checks no longer compare with it")
    q.add_argument("name")
    q.add_argument("version", type=int)
    _connection_args(q)
    q.set_defaults(func=runs("registry:cmd_retire"))
