"""``unilog asyncapi``: the AsyncAPI 3.0.0 document of the log (:mod:`unilog.ops.asyncapi`), as JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError
from .common import ExitCode, connection_args, settings_from


def cmd_asyncapi(args: argparse.Namespace) -> int:
    from ..ops.asyncapi import document

    found = document(settings_from(args), args.module, title=args.title, version=args.api_version)
    text = json.dumps(found, indent=2) + "\n"
    if args.out is None:
        print(text, end="")
        return ExitCode.OK
    try:
        Path(args.out).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot write {args.out}: {exc.strerror or exc}") from None
    print(f"unilog: AsyncAPI document of {len(found['channels'])} streams written to {args.out}")
    return ExitCode.OK


def add(sub: Any) -> None:
    """Add this module's command to the ``unilog`` sub-parsers."""
    p = sub.add_parser(
        "asyncapi",
        help="write the log's AsyncAPI 3.0 document: streams, record types, producers and consumers",
        description=(
            "The AsyncAPI 3.0.0 document of the log, as JSON: a channel per stream with the versions of the record "
            "types registered on it (unilog schema register) as its messages, the streamer's send operation and a "
            "receive operation per consumer and consumer group."
        ),
    )
    p.add_argument("--out", metavar="FILE", help="write the document to FILE (default: print it)")
    p.add_argument(
        "--module",
        action="append",
        default=[],
        metavar="M",
        help="also the record types declared in module M and not registered yet (repeatable)",
    )
    p.add_argument("--title", default="unilog", help="the document's title (default %(default)s)")
    p.add_argument("--api-version", default="1.0.0", help="the document's version (default %(default)s)")
    connection_args(p)
    p.set_defaults(func=cmd_asyncapi)
