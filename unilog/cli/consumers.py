"""``unilog consumer register|unregister|reset|rebuild|delete``: manage checkpoint consumers; ``unilog group delete``:
remove a consumer group."""

from __future__ import annotations

import argparse
from typing import Any, cast

from .common import ExitCode, connection_args, redis_api, settings_from


def cmd_consumer_register(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    stream = args.stream or settings.stream
    api = redis_api(settings)
    try:
        current = api.registered(stream).get(args.name)
        if current is None:
            api.register(stream, args.name, "0-0")
    finally:
        api.close()
    print(f"unilog: consumer {args.name} registered on {stream} at {current or 'the beginning'}")
    return ExitCode.OK


def cmd_consumer_unregister(args: argparse.Namespace) -> int:

    settings = settings_from(args)
    stream = args.stream or settings.stream
    api = redis_api(settings)
    try:
        found = api.unregister(stream, args.name)
    finally:
        api.close()
    print(f"unilog: consumer {args.name} {'unregistered from' if found else 'was not registered on'} {stream}")
    return ExitCode.OK


def _checkpoint_stream(conn: Any, name: str, default: str) -> str:
    from .. import store

    return store.checkpoint_stream(conn, name) or default


def cmd_consumer_reset(args: argparse.Namespace) -> int:
    from .. import store
    from ..consume.resets import reset_checkpoint

    settings = settings_from(args)
    api = redis_api(settings)
    with store.connect(settings.conninfo) as conn:
        store.check_schema(conn)
        stream = args.stream or _checkpoint_stream(conn, args.name, settings.stream)
        cp = reset_checkpoint(conn, api, args.name, stream, args.to)
    api.close()
    print(f"unilog: consumer {args.name} on {stream} reset to {args.to} (last id {cp.last_id})")
    return ExitCode.OK


def cmd_consumer_rebuild(args: argparse.Namespace) -> int:
    from .. import store
    from ..consume.consumer import Consumer, ConsumerConfig, load_handler
    from ..consume.resets import reset_checkpoint

    handler, reset_state = load_handler(args.handler), cast(Any, load_handler(args.reset_state))
    settings = settings_from(args)
    api = redis_api(settings)
    with store.connect(settings.conninfo) as conn:
        store.check_schema(conn)
        stream = args.stream or _checkpoint_stream(conn, args.name, settings.stream)
        reset_checkpoint(conn, api, args.name, stream, "beginning", reset_state=reset_state)
    api.close()
    config = ConsumerConfig(name=args.name, stream=stream, strict_start=True)
    with Consumer(settings, config, handler) as consumer:
        count = consumer.drain()
    print(f"unilog: consumer {args.name} rebuilt from the retained log of {stream}: {count} records applied")
    return ExitCode.OK


def cmd_delete(args: argparse.Namespace) -> int:
    from ..ops.admin import delete_consumer, delete_group

    settings = settings_from(args)
    if args.kind == "group":
        done = delete_group(settings, args.name, args.stream)
        redis_part = "the Redis group" if done.registered else "no Redis group"
        what = f"{done.applied} rows of applied records, {redis_part}"
    else:
        done = delete_consumer(settings, args.name, args.stream)
        redis_part = "its registration" if done.registered else "no registration"
        what = f"{done.applied} held records, {redis_part}"
    at = f" (it was at {done.position})" if done.position else ""
    print(f"unilog: {done.kind} {done.name} deleted from {done.stream}{at}: {what}, {done.letters} dead letters")
    return ExitCode.OK


def _delete_parser(parent: Any, kind: str, removes: str) -> None:
    q = parent.add_parser("delete", help=f"remove a {kind} for good: {removes} (refused while it runs)")
    q.add_argument("name")
    default = "the checkpoint's stream, else $UNILOG_STREAM" if kind == "consumer" else "$UNILOG_STREAM"
    q.add_argument("--stream", help=f"default: {default}")
    connection_args(q)
    q.set_defaults(func=cmd_delete, kind=kind)


def add(sub: Any) -> None:
    """Add this module's commands to the ``unilog`` sub-parsers."""
    g = sub.add_parser("group", help="manage consumer groups")
    group_sub = g.add_subparsers(dest="group_command", required=True)
    _delete_parser(group_sub, "group", "the Redis group, what it applied, its attempt counts and dead letters")
    p = sub.add_parser("consumer", help="manage checkpoint consumers")
    consumer_sub = p.add_subparsers(dest="consumer_command", required=True)
    q = consumer_sub.add_parser("reset", help="move a consumer's checkpoint (it re-applies or skips from there)")
    q.add_argument("name")
    q.add_argument("--to", required=True, help="beginning, end, or a stream entry id")
    q.add_argument("--stream", help="default: the checkpoint's stream, else $UNILOG_STREAM")
    connection_args(q)
    q.set_defaults(func=cmd_consumer_reset)
    q = consumer_sub.add_parser("rebuild", help="clear a consumer's state and replay the retained log into it")
    q.add_argument("name")
    q.add_argument("handler", help="package.module:function, the consumer's handler")
    q.add_argument("--reset-state", required=True, help="package.module:function(conn, name) clearing its state")
    q.add_argument("--stream", help="default: the checkpoint's stream, else $UNILOG_STREAM")
    connection_args(q)
    q.set_defaults(func=cmd_consumer_rebuild)
    q = consumer_sub.add_parser("register", help="declare a consumer before it first runs, so retention waits for it")
    q.add_argument("name")
    q.add_argument("--stream", help="default: $UNILOG_STREAM")
    connection_args(q)
    q.set_defaults(func=cmd_consumer_register)
    q = consumer_sub.add_parser("unregister", help="stop a consumer from holding back trimming")
    q.add_argument("name")
    q.add_argument("--stream", help="default: $UNILOG_STREAM")
    connection_args(q)
    q.set_defaults(func=cmd_consumer_unregister)
    _delete_parser(consumer_sub, "consumer", "its checkpoint, held records, registration and dead letters")
