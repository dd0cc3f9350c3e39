"""The work of ``unilog schema``'s commands (:mod:`unilog.cli.schema` builds their parsers): imported when one runs,
since it needs the Postgres adapter and the registry's verdicts."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import psycopg

from .. import store
from ..config import DEFAULT_STREAM, postgres_conninfo, validate_stream_name
from ..errors import ConfigurationError
from ..ops import registry
from ..ops.registry import Verdict
from .common import ExitCode


@contextlib.contextmanager
def _registry(args: argparse.Namespace) -> Iterator[psycopg.Connection[Any]]:
    """A connection to the migrated database, in one transaction committed at the end of the block."""
    conninfo = postgres_conninfo(args.database_url or os.environ.get("DATABASE_URL", ""))
    with store.connect(conninfo, application_name="unilog-schema") as conn:
        store.check_schema(conn)
        with conn.transaction():
            yield conn


def _default_stream(args: argparse.Namespace) -> str:
    return validate_stream_name(args.default_stream or os.environ.get("UNILOG_STREAM") or DEFAULT_STREAM)


def _report(found: list[Verdict]) -> bool:
    """Print each breaking change on stderr; True if there was any."""
    breaks = [line for verdict in found for line in verdict.breaks]
    for line in breaks:
        print(f"unilog: error: {line}", file=sys.stderr)
    return bool(breaks)


def cmd_check(args: argparse.Namespace) -> int:
    contracts = registry.contracts_of(args.modules)
    if args.against is not None:
        found = registry.verdicts_offline(registry.load_snapshot(args.against), contracts, _default_stream(args))
    else:
        with _registry(args) as conn:
            found = registry.verdicts(conn, contracts, _default_stream(args))
    for verdict in found:
        if not verdict.breaks:
            print(f"unilog: {verdict.summary}")
    return ExitCode.SCHEMA_INCOMPATIBLE if _report(found) else ExitCode.OK


def cmd_register(args: argparse.Namespace) -> int:
    contracts = registry.contracts_of(args.modules)
    with _registry(args) as conn:
        store.lock_registry(conn)
        found = registry.verdicts(conn, contracts, _default_stream(args))
        if _report(found):
            return ExitCode.SCHEMA_INCOMPATIBLE
        for verdict in found:
            if verdict.new_row is not None and not args.dry_run:
                store.register(conn, verdict.new_row)
    for verdict in found:
        if verdict.new_row is None:
            print(f"unilog: {verdict.summary}")
        else:
            done = "would register" if args.dry_run else "registered"
            print(f"unilog: {done} {verdict.tag} on {verdict.stream}: {verdict.summary.split(': ', 1)[1]}")
    return ExitCode.OK


def _when(value: Any) -> str:
    return "" if value is None else value.isoformat(timespec="seconds")


def _as_dict(row: store.SchemaRow) -> dict[str, Any]:
    return {
        "name": row.name,
        "version": row.version,
        "stream": row.stream,
        "object": row.object,
        "action": row.action,
        "fingerprint": row.fingerprint,
        "registered_at": _when(row.registered_at) or None,
        "retired_at": _when(row.retired_at) or None,
    }


def cmd_list(args: argparse.Namespace) -> int:
    with _registry(args) as conn:
        rows = store.registered(conn)
    if args.json:
        print(json.dumps([_as_dict(row) for row in rows], indent=2))
        return ExitCode.OK
    if not rows:
        print("unilog: no record types registered")
    for row in rows:
        retired = f", retired {_when(row.retired_at)}" if row.retired_at else ""
        print(
            f"{row.name} v{row.version}  stream {row.stream or '(default)'}  {row.object}.{row.action}  "
            f"{row.fingerprint[:19]}  registered {_when(row.registered_at)}{retired}"
        )
    return ExitCode.OK


def cmd_export(args: argparse.Namespace) -> int:
    """The registry (schemas included) and the streams' modes as JSON: what ``check --against`` reads."""
    with _registry(args) as conn:
        rows, modes = store.registered(conn), store.stream_modes(conn)
    snapshot = {"modes": modes, "schemas": [{**_as_dict(row), "schema": row.schema} for row in rows]}
    text = json.dumps(snapshot, indent=2, sort_keys=True) + "\n"
    if args.out:
        try:
            with open(args.out, "w", encoding="utf-8") as file:
                file.write(text)
        except OSError as exc:
            raise ConfigurationError(f"--out {args.out}: cannot write it ({exc.strerror or exc})") from None
        print(f"unilog: wrote {len(rows)} registered versions to {args.out}")
    else:
        sys.stdout.write(text)
    return ExitCode.OK


def cmd_show(args: argparse.Namespace) -> int:
    with _registry(args) as conn:
        rows = store.registered(conn, args.name)
    if args.version is not None:
        rows = [row for row in rows if row.version == args.version]
    if not rows:
        which = f"{args.name} v{args.version}" if args.version is not None else args.name
        raise ConfigurationError(f"{which} is not registered (`unilog schema list` lists what is)")
    print(json.dumps(rows[-1].schema, indent=2, sort_keys=True))
    return ExitCode.OK


def cmd_mode(args: argparse.Namespace) -> int:
    stream = validate_stream_name(args.stream)
    with _registry(args) as conn:
        was = store.stream_mode(conn, stream)
        if args.mode is not None:
            store.set_stream_mode(conn, stream, args.mode)
    if args.mode is None:
        print(f"unilog: stream {stream}: compatibility mode {was}")
    else:
        print(f"unilog: stream {stream}: compatibility mode {args.mode} (was {was})")
    return ExitCode.OK


def cmd_retire(args: argparse.Namespace) -> int:
    with _registry(args) as conn:
        before = next((r for r in store.registered(conn, args.name) if r.version == args.version), None)
        row = store.retire(conn, args.name, args.version)
    if row is None or before is None:
        raise ConfigurationError(f"{args.name} v{args.version} is not registered (`unilog schema list` lists what is)")
    if before.retired_at is not None:
        print(f"unilog: {row.name} v{row.version} was retired already, at {_when(row.retired_at)}")
    else:
        print(f"unilog: {row.name} v{row.version} retired: compatibility checks no longer compare with it")
    return ExitCode.OK
