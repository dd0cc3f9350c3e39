"""``unilog consumer register|unregister|reset|rebuild``: manage checkpoint consumers."""

from __future__ import annotations

import argparse
from typing import Any, cast

from .. import store
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
    return store.checkpoint_stream(conn, name) or default


def cmd_consumer_reset(args: argparse.Namespace) -> int:
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


def add(sub: Any) -> None:
    """Add this module's commands to the ``unilog`` sub-parsers."""
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
