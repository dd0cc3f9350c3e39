"""``unilog dlq list|show|replay|drop``: the dead letters of consumer groups and checkpoint consumers."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import ConfigurationError
from .common import ExitCode, connection_args, redis_api, settings_from


def cmd_dlq(args: argparse.Namespace) -> int:
    from .. import store
    from ..ops import dlq

    settings = settings_from(args)
    stream = args.stream or settings.stream
    api = redis_api(settings)
    try:
        if args.dlq_command == "list":
            letters = [d.summary() for d in dlq.list_letters(api, stream, args.group, args.consumer)]
            print(json.dumps(letters, indent=2) if args.json else _letters_table(letters))
        elif args.dlq_command == "show":
            letter = dlq.get_letter(api, stream, args.id)
            print(json.dumps({**letter.summary(), "at_ms": letter.at_ms, "fields": letter.fields}, indent=2))
        elif args.dlq_command == "replay":
            if not args.id and not args.all:
                raise ConfigurationError("give a dead letter id, or --all")
            if args.all:
                targets = dlq.list_letters(api, stream, args.group, args.consumer)
            else:
                targets = [dlq.get_letter(api, stream, args.id)]
            for letter in targets:
                print(f"unilog: dead letter {letter.id} replayed as {dlq.replay(api, stream, letter)}")
        else:
            letter = dlq.get_letter(api, stream, args.id)
            with store.connect(settings.conninfo) as conn:
                dlq.drop(api, conn, stream, letter)
            print(f"unilog: dead letter {letter.id} dropped")
    finally:
        api.close()
    return ExitCode.OK


def _letters_table(letters: list[dict[str, Any]]) -> str:
    from ..ops.status import table

    rows = [[d["id"], d["original_id"], d["owner"], d["position"], d["attempts"], d["error"][:60]] for d in letters]
    return "\n".join(table(["id", "original id", "owner", "position", "attempts", "error"], rows or [["(none)"] * 6]))


def add(sub: Any) -> None:
    """Add this module's commands to the ``unilog`` sub-parsers."""
    p = sub.add_parser("dlq", help="dead letters of groups and checkpoint consumers: list, show, replay, drop")
    dlq_sub = p.add_subparsers(dest="dlq_command", required=True)
    for verb, text in (
        ("list", "list dead letters"),
        ("show", "show one"),
        ("replay", "re-append to the stream"),
        ("drop", "give up on it for good"),
    ):
        q = dlq_sub.add_parser(verb, help=text)
        if verb != "list":
            q.add_argument("id", nargs="?" if verb == "replay" else None, help="dead letter id")
        if verb == "replay":
            q.add_argument("--all", action="store_true", help="replay every dead letter (of --group or --consumer)")
        who = q.add_mutually_exclusive_group()
        who.add_argument("--group", help="only this group's dead letters")
        who.add_argument("--consumer", help="only this checkpoint consumer's dead letters")
        q.add_argument("--stream", help="default: $UNILOG_STREAM")
        q.add_argument("--json", action="store_true")
        connection_args(q)
        q.set_defaults(func=cmd_dlq)
