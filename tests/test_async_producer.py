"""``await emit_async(...)`` on each async handle (psycopg ``AsyncConnection``, SQLAlchemy ``AsyncSession`` and
``AsyncConnection``) on a real Postgres: a commit stages the record, a rollback or a rolled-back savepoint does not,
bad input is refused before anything is sent and leaves the transaction usable, and a handle with no open
transaction is refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest

from unilog import InvalidRecord, NotInTransaction, PayloadNotSerializable, Settings, emit_async, emit_many_async
from unilog.config import sqlalchemy_url

pytest.importorskip("greenlet")

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

Handle = Callable[[Settings], Any]


@asynccontextmanager
async def psycopg_conn(settings: Settings) -> AsyncIterator[Any]:
    conn = await psycopg.AsyncConnection.connect(settings.conninfo)
    try:
        yield conn
    finally:
        await conn.close()


@asynccontextmanager
async def sa_session(settings: Settings) -> AsyncIterator[Any]:
    engine = create_async_engine(sqlalchemy_url(settings.database_url))
    try:
        async with AsyncSession(engine) as session:
            yield session
    finally:
        await engine.dispose()


@asynccontextmanager
async def sa_connection(settings: Settings) -> AsyncIterator[Any]:
    engine = create_async_engine(sqlalchemy_url(settings.database_url))
    try:
        async with engine.connect() as conn:
            yield conn
    finally:
        await engine.dispose()


HANDLES = {"psycopg": psycopg_conn, "sqlalchemy-session": sa_session, "sqlalchemy-connection": sa_connection}


async def _sql(tx: Any, statement: str) -> None:
    if isinstance(tx, psycopg.AsyncConnection):
        await tx.execute(statement)
    else:
        await tx.execute(text(statement))


def staged(pg: Any) -> list[Any]:
    return [r[0] for r in pg.execute("SELECT data->>'n' FROM staged_log_records ORDER BY id")]


def run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro())


@pytest.mark.parametrize("handle", HANDLES)
def test_commit_rollback_and_bad_input(settings: Settings, pg: Any, handle: str) -> None:
    async def scenario() -> None:
        async with HANDLES[handle](settings) as tx:
            await emit_async(tx, action="create", object="ride", data={"n": "1"})
            with pytest.raises(InvalidRecord):
                await emit_async(tx, action="", object="ride", data={"n": "bad"})
            await emit_async(tx, action="create", object="ride", data={"n": "2"})  # still usable
            await tx.commit()
            await emit_async(tx, action="create", object="ride", data={"n": "rolled back"})
            await tx.rollback()

    run(scenario)
    assert staged(pg) == ["1", "2"]


@pytest.mark.parametrize("handle", ["psycopg", "sqlalchemy-session"])
def test_a_rolled_back_savepoint_is_never_staged(settings: Settings, pg: Any, handle: str) -> None:
    async def scenario() -> None:
        async with HANDLES[handle](settings) as tx:
            await emit_async(tx, action="create", object="ride", data={"n": "kept"})
            if isinstance(tx, psycopg.AsyncConnection):
                with pytest.raises(RuntimeError):
                    async with tx.transaction():
                        await emit_async(tx, action="create", object="ride", data={"n": "savepoint"})
                        raise RuntimeError("roll the savepoint back")
            else:
                nested = await tx.begin_nested()
                await emit_async(tx, action="create", object="ride", data={"n": "savepoint"})
                await nested.rollback()
            await tx.commit()

    run(scenario)
    assert staged(pg) == ["kept"]


def test_a_handle_without_a_transaction_is_refused(settings: Settings, pg: Any) -> None:
    async def scenario() -> None:
        conn = await psycopg.AsyncConnection.connect(settings.conninfo, autocommit=True)
        try:
            with pytest.raises(NotInTransaction, match=r"^emit_async\(\) needs an open transaction") as refused:
                await emit_async(conn, action="create", object="ride", data={})
            assert "emit()" not in str(refused.value) and "async with conn.transaction()" in str(refused.value)
        finally:
            await conn.close()
        engine = create_async_engine(sqlalchemy_url(settings.database_url), isolation_level="AUTOCOMMIT")
        try:
            async with engine.connect() as sa_conn:
                with pytest.raises(NotInTransaction, match=r"^emit_async\(\) needs") as refused:
                    await emit_async(sa_conn, action="create", object="ride", data={})
                assert "emit()" not in str(refused.value)
        finally:
            await engine.dispose()
        with pytest.raises(TypeError, match="emit_async"):
            await emit_async(object(), action="create", object="ride", data={})

    run(scenario)
    assert staged(pg) == []


@pytest.mark.parametrize("handle", HANDLES)
def test_emit_many_async_stages_in_order_and_refuses_a_bad_record(settings: Settings, pg: Any, handle: str) -> None:
    def records(*ns: str) -> list[dict[str, Any]]:
        return [{"action": "create", "object": "ride", "data": {"n": n}} for n in ns]

    async def scenario() -> None:
        async with HANDLES[handle](settings) as tx:
            assert await emit_many_async(tx, []) == []
            ids = await emit_many_async(tx, records("3", "1", "2"))
            assert len(ids) == 3 and ids == sorted(ids)
            with pytest.raises(PayloadNotSerializable, match=r"^records\[1\]: data\['n'\] is nan") as refused:
                await emit_many_async(tx, [*records("bad"), {**records("x")[0], "data": {"n": float("nan")}}])
            assert refused.value.index == 1
            await emit_many_async(tx, records("4"))  # still usable
            await tx.commit()
            await emit_many_async(tx, records("rolled back"))
            await tx.rollback()
        if handle == "psycopg":
            conn = await psycopg.AsyncConnection.connect(settings.conninfo, autocommit=True)
            try:
                with pytest.raises(NotInTransaction, match=r"^emit_many_async\(\) needs an open transaction"):
                    await emit_many_async(conn, records("no transaction"))
            finally:
                await conn.close()
            with pytest.raises(TypeError, match=r"use emit_many\(\) for synchronous handles"):
                await emit_many_async(object(), records("x"))

    run(scenario)
    assert staged(pg) == ["3", "1", "2", "4"]
