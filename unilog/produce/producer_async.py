"""Staging records from asyncio code: ``await emit_async(tx, ...)`` on a psycopg ``AsyncConnection`` or a SQLAlchemy
``AsyncSession``/``AsyncConnection``.

A function of its own rather than an ``emit`` that is sometimes awaitable: an un-awaited call would stage nothing
and say nothing, and type checkers can tell the two apart. The guarantees are ``emit``'s: the record is one row in
the caller's transaction, nothing commits, a handle with no open transaction is refused, bad input is refused before
anything is sent (the transaction stays usable), and the active span's trace context is stored with the record.
"""

from __future__ import annotations

from ._async.emitting import emit_async, emit_many_async

__all__ = ["emit_async", "emit_many_async"]
