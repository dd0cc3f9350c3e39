"""``unilog asyncapi``: the AsyncAPI 3.0.0 document of the log (:mod:`unilog.ops.asyncapi`), as JSON; with
``--validate``, that document or a file checked by the official parser (:mod:`unilog.ops.asyncapi_validate`)."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from .common import ExitCode, connection_args, settings_from

if TYPE_CHECKING:
    from ..ops.asyncapi_validate import Validator


def cmd_asyncapi(args: argparse.Namespace) -> int:
    validator = None
    if args.validate is not None:  # node and the parser first: a missing one is said before anything is done
        from ..ops.asyncapi_validate import prepare

        validator = prepare()
    if args.validate:  # a file: validated as it is, no server needed
        return _validate_file(validator, Path(args.validate))
    from ..ops.asyncapi import document

    found = document(settings_from(args), args.module, title=args.title, version=args.api_version)
    text = json.dumps(found, indent=2) + "\n"
    if args.out is None and validator is None:
        print(text, end="")
        return ExitCode.OK
    if args.out is None:  # --validate alone: the document is checked, not printed
        with tempfile.TemporaryDirectory(prefix="unilog-asyncapi-") as folder:
            path = Path(folder) / "asyncapi.json"
            path.write_text(text, encoding="utf-8")
            return _validate_file(validator, path, "the log's AsyncAPI document")
    try:
        Path(args.out).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot write {args.out}: {exc.strerror or exc}") from None
    print(f"unilog: AsyncAPI document of {len(found['channels'])} streams written to {args.out}")
    return _validate_file(validator, Path(args.out))


def _validate_file(validator: Validator | None, path: Path, name: str | None = None) -> int:
    if validator is None:
        return ExitCode.OK
    if not path.is_file():
        raise ConfigurationError(f"cannot read {path}: no such file")
    validator.validate(path, name)
    return ExitCode.OK


def add(sub: Any) -> None:
    """Add this module's command to the ``unilog`` sub-parsers."""
    p = sub.add_parser(
        "asyncapi",
        help="write the log's AsyncAPI 3.0 document: streams, record types, producers and consumers",
        description=(
            "The AsyncAPI 3.0.0 document of the log, as JSON: a channel per stream with the versions of the record "
            "types registered on it (unilog schema register) as its messages, the streamer's send operation and a "
            "receive operation per consumer and consumer group. --validate checks it (or a file) with the official "
            "AsyncAPI parser."
        ),
    )
    p.add_argument("--out", metavar="FILE", help="write the document to FILE (default: print it)")
    p.add_argument(
        "--validate",
        nargs="?",
        const="",
        metavar="FILE",
        help="check FILE (JSON or YAML; no server needed), or without FILE the log's document, with the official "
        "AsyncAPI parser (@asyncapi/parser 3 on Node.js 18+; installed once into ~/.cache/unilog with npm); exit "
        "code 18 if it has errors",
    )
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
