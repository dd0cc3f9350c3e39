"""Connecting to Redis, written once for both faces: :func:`connect_async` opens every client the library uses (a
single server or a Redis Cluster, redis-py's retries off, no ``CLIENT`` commands of its own); ``ping``
(:mod:`unilog.engine._async.server`) checks the server answers, accepts the credentials and is recent enough, with
the refusals here.

Part of the Redis adapter (``unilog.engine``): the library reaches these through ``engine.connect`` and
``engine.ping``, or ``engine.aio``'s. Telling Redis's refusals apart is :mod:`unilog.engine.refusals`'s.
"""

from __future__ import annotations

import inspect
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.connection import parse_url

from ...config import redact_url
from ...errors import RedisAuthFailed, ServerUnreachable, UnsupportedServer
from ..commands import issues

# A Redis Cluster is named by its own scheme: the client must know before it connects (it discovers the nodes).
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def _no_client_commands() -> dict[str, Any]:
    """Client options that stop redis-py sending ``CLIENT`` commands of its own on each new connection: ``CLIENT
    SETINFO`` (the library's name and version) and, on RESP3 since redis-py 7, ``CLIENT MAINT_NOTIFICATIONS`` (a
    managed service's maintenance events; refused by open-source Redis anyway). A user of ``unilog acl`` may not run
    ``CLIENT``: Redis refuses them, redis-py ignores the refusal, and ``ACL LOG`` records a denial per connection,
    which hides real ones. unilog needs neither: it retries whole batches itself."""
    parameters = inspect.signature(redis.Redis.__init__).parameters
    if "driver_info" in parameters:
        options: dict[str, Any] = {"driver_info": None}
    else:
        options = {"lib_name": None, "lib_version": None}
    if "maint_notifications_config" in parameters:
        from redis.maint_notifications import MaintNotificationsConfig

        options["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
    return options


QUIET = _no_client_commands()


@issues("ping")  # redis-py's health check of a connection idle for 30 s
def connect_async(url: str, *, socket_timeout: float | None = 10.0) -> Redis:
    """A redis-py client with retries off (see the module docstring) and bytes responses (decoded lazily).

    ``redis+cluster://host:port`` (or ``rediss+cluster://``) names any node of a Redis Cluster: the client is then
    redis-py's cluster client, which follows MOVED/ASK itself; a failed command is not retried by it either (unilog
    retries whole passes, which are idempotent)."""
    scheme = url.split("://", 1)[0].lower()
    if scheme in CLUSTER_SCHEMES:
        return _cluster(url, scheme, socket_timeout)  # type: ignore[return-value]  # the adapter treats both alike
    return Redis.from_url(
        url,
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
        socket_timeout=socket_timeout,
        socket_connect_timeout=10.0,
        health_check_interval=30,
        decode_responses=False,
        **QUIET,
    )


def cluster_options(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """``redis+cluster://[user:pass@]host:port[,host:port...]/db``: every listed node (each a starting point, so a
    client still starts while one of them is down, a master mid-failover) and the client options (credentials,
    TLS) the URL gives."""
    scheme = url.split("://", 1)[0].lower()
    plain = CLUSTER_SCHEMES[scheme] + url[len(scheme) :]
    parts = urlsplit(plain)
    auth, _, hosts = parts.netloc.rpartition("@")
    nodes = [(host, int(port or 6379)) for host, _, port in (h.rpartition(":") for h in hosts.split(","))]
    first = urlunsplit(parts._replace(netloc=(f"{auth}@" if auth else "") + hosts.split(",")[0]))
    options = parse_url(first)  # credentials and TLS settings; the nodes come from the whole list
    for name in ("host", "port", "db", "connection_class"):
        options.pop(name, None)
    if first.startswith("rediss://"):
        options["ssl"] = True
    return nodes, options


def _cluster(url: str, scheme: str, socket_timeout: float | None) -> RedisCluster:
    """The cluster client for a ``redis+cluster://`` URL (see :func:`cluster_options`)."""
    nodes, options = cluster_options(url)
    try:
        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in nodes],
            retry=Retry(NoBackoff(), 0),
            socket_timeout=socket_timeout,
            socket_connect_timeout=10.0,
            decode_responses=False,
            **QUIET,
            **options,
        )
    except (redis.RedisError, redis.exceptions.RedisClusterException, OSError) as exc:  # the latter: no node answered
        raise ServerUnreachable(
            f"cannot reach the Redis Cluster at {redact_url(url)}: {exc} (are its nodes up and REDIS_URL right?)"
        ) from None


def ping_refusal(exc: BaseException, url: str) -> Exception:
    """The one-line error for a server that failed ``ping``: wrong credentials,
    still loading its data, or unreachable; naming the server (password redacted) and the fix."""
    where = redact_url(url)
    if isinstance(exc, redis.AuthenticationError):  # before ConnectionError: it is one
        return RedisAuthFailed(
            f"Redis at {where} refused the credentials ({exc}): put the user and password in REDIS_URL, "
            "redis://USER:PASSWORD@HOST:PORT (redis://:PASSWORD@HOST:PORT for requirepass)"
        )
    if isinstance(exc, redis.BusyLoadingError):
        return ServerUnreachable(
            f"Redis at {where} is still loading its data set into memory (it just restarted): start again once it "
            "answers"
        )
    return ServerUnreachable(f"cannot connect to Redis at {where}: {exc} (is the server running and REDIS_URL right?)")


def version_refusal(version: str, url: str) -> Exception | None:
    """The one-line error if Redis ``version`` is older than unilog supports, else None."""
    if not _too_old(version):
        return None
    return UnsupportedServer(
        f"Redis at {redact_url(url)} is version {version}; unilog needs Redis 6.2 or later: upgrade it"
    )


MIN_SERVER_VERSION = (6, 2)  # XAUTOCLAIM, XADD MINID, GETDEL


def _too_old(version: str) -> bool:
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return False  # a fork that reports something else: let the commands themselves tell
    return (major, minor) < MIN_SERVER_VERSION
