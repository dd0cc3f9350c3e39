"""Pytest plugin: real, throw-away Postgres and Redis servers for testing unilog and your own consumers.

Installed with unilog (entry point ``pytest11``), so any test can ask for these fixtures:

``unilog_postgres`` / ``unilog_redis`` (session)
    The servers: throw-away ones the plugin starts (local binaries, else the embedded pip packages of the
    ``embedded`` extra), unless you name servers for tests in so many words: ``UNILOG_TEST_DATABASE_URL`` (the
    plugin creates its databases there and drops only those) and ``UNILOG_TEST_REDIS_URL`` (the plugin owns the
    database number in that URL: it must be empty when the session starts; the plugin flushes it before every
    test and at the end, never another database). ``DATABASE_URL`` / ``REDIS_URL`` are never used or written: when
    set, the report header says in one line that the tests run on servers of their own.
``unilog_database_url`` (function)
    A fresh database cloned from a migrated template (fast), dropped after the test.
``unilog_redis_url`` (function)
    The Redis server, its database (only that one) flushed before the test.
``unilog_settings`` (function)
    :class:`~unilog.config.Settings` for both, with the default stream ``test-stream``.

:func:`running` runs a streamer or consumer loop in a thread for the duration of a ``with`` block.

For asyncio tests (with pytest-asyncio, which ``unilog-outbox[testing]`` installs), every fixture above works as it is,
``unilog_async_connection`` is a psycopg ``AsyncConnection`` on the test's database (closed after it), and
:func:`running_async` runs an :class:`~unilog.AsyncConsumer`'s ``run`` as a task for an ``async with`` block.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import pytest
import redis

from unilog.config import Settings
from unilog.ops.schema import migrate, set_producer_id

from .embedded import EmbeddedPostgres, EmbeddedRedis

# unique per session, so the template is never one that exists already (a given server may hold anything)
TEMPLATE_DB = f"unilog_template_{os.getpid()}_{secrets.token_hex(4)}"
_counter = itertools.count()


@dataclass
class PostgresHandle:
    """A Postgres server for tests: ``admin_url`` reaches a database where we may CREATE DATABASE."""

    admin_url: str
    server: EmbeddedPostgres | None = None

    def url_for(self, dbname: str) -> str:
        base, _, _ = self.admin_url.partition("?")
        head, _, _ = base.rpartition("/")
        query = self.admin_url[len(base) :]
        return f"{head}/{dbname}{query}"


@dataclass
class RedisHandle:
    """A Redis server for tests."""

    url: str
    server: EmbeddedRedis | None = None


TEST_DATABASE_ENV = "UNILOG_TEST_DATABASE_URL"
TEST_REDIS_ENV = "UNILOG_TEST_REDIS_URL"
# the application's own variables: the plugin never uses (so never writes) the servers they name
_APP_ENV = {"DATABASE_URL": TEST_DATABASE_ENV, "REDIS_URL": TEST_REDIS_ENV}


def pytest_report_header(config: pytest.Config) -> list[str]:
    """One line per application variable that is set and not used, so nobody believes their server was tested."""
    del config  # the hook's signature
    return [
        f"unilog: {app} is set but not used: tests run on a throw-away server of their own "
        f"(set {test} to test on a server of yours)"
        for app, test in _APP_ENV.items()
        if os.environ.get(app) and not os.environ.get(test)
    ]


@pytest.fixture(scope="session")
def unilog_postgres() -> Iterator[PostgresHandle]:
    """The session's Postgres server: ``UNILOG_TEST_DATABASE_URL`` if set (the plugin creates databases of its own
    there and drops only those), else one it starts and removes."""
    url = os.environ.get(TEST_DATABASE_ENV)
    if url:
        yield PostgresHandle(admin_url=url)
        return
    # not under pytest's basetemp: a concurrent pytest run resets /tmp/pytest-of-<user> to 0700, which would cut the
    # unprivileged Postgres user (when testing as root) off from its data directory mid-run
    server = EmbeddedPostgres().start()
    try:
        yield PostgresHandle(admin_url=server.url, server=server)
    finally:
        server.stop(mode="immediate", cleanup=True)


@pytest.fixture(scope="session")
def unilog_redis(request: pytest.FixtureRequest) -> Iterator[RedisHandle]:
    """The session's Redis server: ``UNILOG_TEST_REDIS_URL`` if set, else one it starts (AOF fsync always) and
    removes.

    On a given server the plugin owns the one database the URL names (``/N``, 0 when absent; under pytest-xdist,
    worker ``gwK`` owns ``N + K`` instead, see :func:`worker_redis_url`): the session refuses
    to start (:func:`pytest.exit`, one line) while it holds keys, since they are not the plugin's to flush, and it
    is flushed after the session. Other databases on that server are never touched."""
    url = os.environ.get(TEST_REDIS_ENV)
    if url:
        # this session's own xdist worker id (a pytest it starts in a subprocess inherits the variable, not the role)
        worker = getattr(request.config, "workerinput", {}).get("workerid", "")
        url = worker_redis_url(url, worker)
        _claim_redis_database(url)
        try:
            yield RedisHandle(url=url)
        finally:
            _flush_database(url)
        return
    server = EmbeddedRedis().start()
    try:
        yield RedisHandle(url=server.url, server=server)
    finally:
        server.stop(cleanup=True)


def worker_redis_url(url: str, worker: str) -> str:
    """The Redis database a pytest-xdist worker owns on a given server: ``gwN`` takes the URL's number plus N (``gw0``
    the URL's own), so parallel workers never flush each other's keys; outside xdist, ``url`` unchanged."""
    if not worker.startswith("gw") or not worker[2:].isdigit():
        return url
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    offset = int(worker[2:])
    if parts.scheme == "unix" or "db" in query:  # a socket's database is a query parameter
        query["db"] = str(int(query.get("db", 0)) + offset)
        return urlunsplit(parts._replace(query=urlencode(query)))
    number = int(parts.path.strip("/") or 0) + offset
    return urlunsplit(parts._replace(path=f"/{number}"))


def _claim_redis_database(url: str) -> None:
    """Stop the session, in one line, unless the database ``url`` names is empty."""
    client = redis.Redis.from_url(url)
    try:
        keys = int(client.dbsize())
        db = client.get_connection_kwargs().get("db", 0)
    finally:
        client.close()
    if keys:
        pytest.exit(
            f"unilog: {TEST_REDIS_ENV} names Redis database {db}, which holds {keys} key{'s' * (keys != 1)}; the "
            "plugin flushes its database before every test, so give it an empty one of its own (another number: "
            ".../15), or empty this one yourself if it is only a previous test run's",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


def _flush_database(url: str) -> None:
    """FLUSHDB (never FLUSHALL) on the database ``url`` names."""
    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()


@pytest.fixture(scope="session")
def unilog_template(unilog_postgres: PostgresHandle) -> Iterator[str]:
    """Name of a migrated template database that per-test databases are cloned from."""
    admin = psycopg.connect(unilog_postgres.admin_url, autocommit=True)
    admin.execute(f'CREATE DATABASE "{TEMPLATE_DB}"')  # before the try: a name that existed is not ours to drop
    try:
        migrate(unilog_postgres.url_for(TEMPLATE_DB))
        yield TEMPLATE_DB
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}" WITH (FORCE)')
        admin.close()


def create_database(handle: PostgresHandle, template: str) -> str:
    """Clone ``template`` into a new database and return its URL."""
    name = f"unilog_test_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(handle.admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    url = handle.url_for(name)
    set_producer_id(url, f"test-{name.removeprefix('unilog_test_')}")
    return url


def drop_database(handle: PostgresHandle, url: str) -> None:
    """Drop the database behind ``url``, disconnecting anyone still on it."""
    name = url.partition("?")[0].rpartition("/")[2]
    with psycopg.connect(handle.admin_url, autocommit=True) as admin:
        # a database with a replication slot (WAL capture) cannot be dropped: end its sessions (a streamer's
        # walsender among them), then drop its slots
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        deadline = time.monotonic() + 10
        while True:
            try:
                admin.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s", (name,)
                )
                break
            except psycopg.errors.ObjectInUse:  # its walsender is still exiting
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def unilog_database_url(unilog_postgres: PostgresHandle, unilog_template: str) -> Iterator[str]:
    """A fresh, migrated database for this test; dropped afterwards."""
    url = create_database(unilog_postgres, unilog_template)
    try:
        yield url
    finally:
        drop_database(unilog_postgres, url)


@pytest.fixture
def unilog_redis_url(unilog_redis: RedisHandle) -> str:
    """The Redis server, the session's database (only that one) flushed for this test."""
    _flush_database(unilog_redis.url)
    return unilog_redis.url


@pytest.fixture
def unilog_settings(unilog_database_url: str, unilog_redis_url: str) -> Settings:
    """Settings pointing at this test's database and Redis, default stream ``test-stream``."""
    return Settings(database_url=unilog_database_url, redis_url=unilog_redis_url, stream="test-stream")


@contextlib.contextmanager
def running(loop: Callable[[threading.Event], Any], *, join_timeout: float = 30.0) -> Iterator[threading.Event]:
    """Run ``loop(stop_event)`` (e.g. ``streamer.run``) in a thread; stop it and re-raise its error on exit."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            loop(stop)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(join_timeout)
        if thread.is_alive():
            raise RuntimeError(f"{loop!r} did not stop within {join_timeout}s")
        if errors:
            raise errors[0]


@contextlib.asynccontextmanager
async def running_async(
    loop: Callable[[asyncio.Event], Coroutine[Any, Any, Any]], *, join_timeout: float = 30.0
) -> AsyncIterator[asyncio.Event]:
    """Run ``loop(stop)`` (e.g. ``async_consumer.run``) as a task; on exit set ``stop``, wait for it, and re-raise
    its error."""
    stop = asyncio.Event()
    task: asyncio.Task[Any] = asyncio.create_task(loop(stop))
    try:
        yield stop
    finally:
        stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), join_timeout)
        except TimeoutError:
            task.cancel()
            raise RuntimeError(f"{loop!r} did not stop within {join_timeout}s") from None


try:  # the asyncio fixture needs pytest-asyncio (unilog-outbox[testing]); without it the sync fixtures still work
    import pytest_asyncio
except ImportError:  # pragma: no cover - depends on the installation
    pass
else:

    @pytest_asyncio.fixture
    async def unilog_async_connection(unilog_database_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A psycopg ``AsyncConnection`` on this test's database (not autocommit), closed after the test."""
        conn = await psycopg.AsyncConnection.connect(unilog_database_url)
        try:
            yield conn
        finally:
            await conn.close()
