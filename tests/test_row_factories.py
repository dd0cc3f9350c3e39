"""emit and emit_many work whatever row factory the application's connection uses (issue 34, item 4).

An application that opened its psycopg connection with ``row_factory=dict_row`` (FastAPI tutorials do) got
``KeyError: 0`` from ``emit``: unilog read its own ``RETURNING`` row by position through the caller's factory.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg.rows import class_row, dict_row, namedtuple_row
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session

from unilog import Settings, emit, emit_async, emit_many, emit_many_async
from unilog.config import sqlalchemy_url


@dataclass
class Anything:
    """A class_row target that accepts no column unilog's statements return: only the app's own queries fit it."""

    name: str


FACTORIES = {"dict_row": dict_row, "namedtuple_row": namedtuple_row, "class_row": class_row(Anything)}


def _staged(pg: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return pg.execute("SELECT id, object, key FROM staged_log_records ORDER BY id").fetchall()


@pytest.mark.parametrize("factory", list(FACTORIES))
def test_psycopg_connection_with_any_row_factory(settings: Settings, pg: psycopg.Connection[Any], factory: str) -> None:
    with psycopg.connect(settings.conninfo, row_factory=FACTORIES[factory]) as conn:
        one = emit(conn, action="create", object="ride", data={"n": 1}, key="a")
        many = emit_many(conn, [{"action": "create", "object": "ride", "data": {"n": i}, "key": "b"} for i in (2, 3)])
        conn.commit()
        assert conn.row_factory is FACTORIES[factory], "the application's factory is left as it was"
    rows = _staged(pg)
    assert [one, *many] == [r[0] for r in rows]
    assert [r[2] for r in rows] == ["a", "b", "b"]


@pytest.mark.parametrize("factory", list(FACTORIES))
def test_async_psycopg_connection_with_any_row_factory(
    settings: Settings, pg: psycopg.Connection[Any], factory: str
) -> None:
    async def run() -> list[int | None]:
        conn = await psycopg.AsyncConnection.connect(settings.conninfo, row_factory=FACTORIES[factory])
        async with conn:
            one = await emit_async(conn, action="create", object="ride", data={"n": 1})
            many = await emit_many_async(conn, [{"action": "create", "object": "ride", "data": {"n": 2}}])
            await conn.commit()
        return [one, *many]

    ids = asyncio.run(run())
    assert ids == [r[0] for r in _staged(pg)]


def test_sqlalchemy_rows_are_read_by_position_too(settings: Settings, pg: psycopg.Connection[Any]) -> None:
    """SQLAlchemy hands back its own ``Row`` objects whatever the app maps them to (SQLAlchemy itself cannot run on a
    psycopg connection whose default factory is ``dict_row``: its dialect reads the server version by position)."""
    url = sqlalchemy_url(settings.database_url)
    engine = create_engine(url)
    with Session(engine) as session:
        ids = [emit(session, action="create", object="ride", data={"via": "session"})]
        ids += emit_many(session, [{"action": "create", "object": "ride", "data": {"via": "session-many"}}])
        session.commit()
    engine.dispose()

    async def run() -> int | None:
        aengine = create_async_engine(url)
        async with aengine.begin() as conn:
            staged_id = await emit_async(conn, action="create", object="ride", data={"via": "async"})
        await aengine.dispose()
        return staged_id

    ids.append(asyncio.run(run()))
    assert ids == [r[0] for r in _staged(pg)]
