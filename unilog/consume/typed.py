"""Handlers that ask for typed records by their annotation: ``def handle(conn, rides: Sequence[RideCreated])``.

A handler whose second parameter is annotated as a sequence (``Sequence``, ``list``, ``Iterable``...) of classes
declared with :func:`unilog.contracts.record_type` (one, or a union of several) is handed, in place of the
:class:`~unilog.consume.records.Batch`, the records of those types as instances, in stream order; records of other
types are left out of what it sees, and the checkpoint moves past them as past any record. Every other handler is
used as it is. Reading each record is :meth:`Record.typed <unilog.consume.records.Record.typed>`: one that cannot be
read raises :class:`~unilog.errors.UnreadableRecord` and the consumer applies its ``on_malformed`` policy to it.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import types
import typing
from typing import Any

from .records import Batch, typed_records

_SEQUENCES = (
    collections.abc.Sequence,
    collections.abc.Iterable,
    collections.abc.Collection,
    list,
    tuple,
)
_TYPED = "__unilog_typed__"


def typed_handler(handler: Any) -> Any:
    """``handler``, or, when its annotation asks for typed records, a handler of the same kind (a coroutine
    function for a coroutine function) that hands it those instead of the batch. Applying it twice is harmless."""
    if getattr(handler, _TYPED, False):
        return handler
    wanted = wanted_types(handler)
    if not wanted:
        return handler
    if inspect.iscoroutinefunction(handler):

        @functools.wraps(handler)
        async def run_async(conn: Any, records: Batch) -> Any:
            return await handler(conn, typed_records(records, wanted))

        setattr(run_async, _TYPED, True)
        return run_async

    @functools.wraps(handler)
    def run(conn: Any, records: Batch) -> Any:
        return handler(conn, typed_records(records, wanted))

    setattr(run, _TYPED, True)
    return run


def wanted_types(handler: Any) -> tuple[type, ...]:
    """The record types ``handler``'s second parameter asks for by its annotation, or ``()``."""
    try:
        params = list(inspect.signature(handler).parameters.values())
        hints = typing.get_type_hints(handler)
    except (TypeError, ValueError, NameError, AttributeError):  # no signature, or an annotation that is not resolvable
        return ()
    if len(params) < 2 or params[1].name not in hints:
        return ()
    annotation = hints[params[1].name]
    origin = typing.get_origin(annotation)
    if origin not in _SEQUENCES:
        return ()
    args = typing.get_args(annotation)
    if not args:
        return ()
    inner = args[0]
    members = typing.get_args(inner) if typing.get_origin(inner) in (typing.Union, types.UnionType) else (inner,)
    if members and all(isinstance(m, type) and "__unilog_contract__" in m.__dict__ for m in members):
        return tuple(members)
    return ()
