"""Frozen settings objects, built once at a process entry point.

Library code never reads the environment: entry points call :meth:`Settings.from_env` (or build a
:class:`Settings` by hand, or with :meth:`Settings.from_dsn`) and pass the frozen object down.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any
from urllib.parse import quote, urlsplit

from .errors import ConfigurationError, InvalidName, InvalidStreamName

# the distribution unilog is installed by (`pip install unilog-outbox`), for metadata lookups and install hints; the
# import name and the command stay `unilog`. On the package index, "unilog" is an unrelated project's name.
DISTRIBUTION = "unilog-outbox"
DEFAULT_STREAM = "unilog"
# a stream's schema compatibility modes (Confluent's, in lower case): here, not in unilog.store, so that `unilog
# schema mode`'s parser offers them without importing the Postgres adapter (issue 45)
SCHEMA_MODES = (
    "none",
    "backward",
    "backward_transitive",
    "forward",
    "forward_transitive",
    "full",
    "full_transitive",
)
STREAM_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$")

_PG_SCHEMES = {"postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2", "postgresql+asyncpg"}
_REDIS_SCHEMES = {"redis", "rediss", "unix", "redis+cluster", "rediss+cluster"}


def validate_stream_name(name: object) -> str:
    """Return ``name`` if it is a valid stream name, else raise :class:`InvalidStreamName` naming the problem."""
    if not isinstance(name, str):
        raise InvalidStreamName(f"stream name must be a string, got {type(name).__name__}")
    if not STREAM_NAME_RE.fullmatch(name):  # fullmatch: "$" would also match before a trailing newline
        raise InvalidStreamName(
            f"invalid stream name {name!r}: use 1-200 characters from [A-Za-z0-9_.:-], starting with a letter or digit"
        )
    return name


def _url_from(source: Mapping[str, str], name: str) -> str:
    """``$NAME``, else the contents of the file ``$NAME_FILE`` names (a container secret), else ''."""
    value = source.get(name, "")
    path = source.get(f"{name}_FILE", "")
    if value or not path:
        return value
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError as exc:  # the message names the file, never its contents
        raise ConfigurationError(f"{name}_FILE={path!r} cannot be read: {exc.strerror or exc}") from None


NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")


def validate_name(kind: str, name: object) -> str:
    """Return ``name`` if it may name a consumer, group or worker, else raise :class:`InvalidName`.

    These names become parts of Redis keys (``unilog:attempts:<stream>:<group>``) and values in SQL; ``:`` is
    excluded because stream names may contain it, so no name can make one stream's key address another's."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise InvalidName(
            f"invalid {kind} name {name!r}: use 1-200 characters from [A-Za-z0-9_.-], starting with a letter or digit"
        )
    return name


_KEYWORD_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s']\S*|)")
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*")


def redact_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***``, for logs and error messages.

    Covers every form a database URL takes: ``user:password@`` before one host or a list of them, a ``password=``
    query parameter, and a libpq ``key=value`` conninfo's ``password``."""
    if "://" not in url:  # libpq key=value conninfo (nothing else has a password in it without a scheme)
        return _KEYWORD_PASSWORD.sub(r"\1***", url)
    scheme, netloc, tail = _split(url)
    userinfo, _, hosts = netloc.rpartition("@")
    user, colon, _password = userinfo.partition(":")
    if colon:
        netloc = f"{user}:***@{hosts}"
    return _QUERY_PASSWORD.sub(r"\1***", f"{scheme}://{netloc}{tail}")


def _split(url: str) -> tuple[str, str, str]:
    """``scheme://netloc/tail`` as its three parts, split by hand: ``urlsplit`` refuses some URLs libpq takes
    (and those too need redacting in errors)."""
    scheme, rest = url.split("://", 1)
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    return scheme, rest[:end], rest[end:]


def postgres_conninfo(url: str) -> str:
    """Validate a Postgres URL and return it in the form psycopg accepts (SQLAlchemy driver suffixes stripped).

    Every form libpq takes is accepted: ``postgresql://`` URLs with one host or a list (``u@h1:p1,h2:p2/db``,
    ``?host=h1,h2&port=p1,p2``, ``?host=/socket/dir``) and ``key=value`` conninfo. libpq parses it here, at the
    entry point, so a URL it cannot use is a :class:`ConfigurationError` naming the problem (password redacted),
    not a failure deep inside a command."""
    if not url:
        raise ConfigurationError("DATABASE_URL is not set: give a Postgres URL such as postgresql://user@host:5432/db")
    if "://" in url:
        scheme, rest = url.split("://", 1)
        if scheme.lower() not in _PG_SCHEMES:
            raise ConfigurationError(
                f"DATABASE_URL {redact_url(url)!r} is not a Postgres URL: it must start with postgresql://"
            )
        conninfo = "postgresql://" + rest
    elif "=" in url:
        conninfo = url
    else:
        raise ConfigurationError(
            f"DATABASE_URL {redact_url(url)!r} is not a Postgres URL: it must start with postgresql:// "
            "(or be libpq's key=value conninfo)"
        )
    problem = _conninfo_problem(conninfo)
    if problem is not None:
        raise ConfigurationError(f"DATABASE_URL {redact_url(url)!r} is malformed: {_scrub(problem, url)}")
    return conninfo


# settings libpq only checks when it connects: checked here so that a typo is refused before anything runs
_CHOICES = {
    "target_session_attrs": ("any", "read-write", "read-only", "primary", "standby", "prefer-standby"),
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "load_balance_hosts": ("disable", "random"),
}


def _conninfo_problem(conninfo: str) -> str | None:
    """What libpq would refuse in ``conninfo`` (its syntax, parameters, ports, host and port counts), or None."""
    from psycopg import ProgrammingError  # here: psycopg is loaded by whatever connects, not by reading settings
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(conninfo)
    except ProgrammingError as exc:
        return " ".join(str(exc).split()) or "libpq cannot parse it"
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isdigit() and 1 <= int(port) <= 65535):
            return f"port {port!r} is not a number from 1 to 65535"
    hosts, ports, addrs = (len(str(params[k]).split(",")) if params.get(k) else 0 for k in ("host", "port", "hostaddr"))
    if hosts and addrs and hosts != addrs:
        return f"{addrs} hostaddr values for {hosts} hosts: give one for each host"
    if ports > 1 and ports != max(hosts, addrs, 1):
        return f"{ports} ports for {max(hosts, addrs, 1)} hosts: give one port, or one for each host"
    for key, choices in _CHOICES.items():
        if key in params and params[key] not in choices:
            return f"{key}={params[key]!r} is not one of {', '.join(choices)}"
    return None


def _scrub(message: str, url: str) -> str:
    """``message`` (libpq's, which may quote the URL or a piece of it) without the URL's password."""
    message = message.replace(url, redact_url(url))
    if "://" not in url:
        return message
    password = _split(url)[1].rpartition("@")[0].partition(":")[2]
    return message.replace(password, "***") if password else message


def sqlalchemy_url(url: str) -> str:
    """Return the SQLAlchemy URL for ``url`` that uses the psycopg 3 driver.

    A URL with one host keeps its form. A host list, or ``key=value`` conninfo, becomes the form SQLAlchemy takes
    host lists in (``postgresql+psycopg://user:password@/db?host=h1,h2&port=p1,p2&...``): its netloc cannot hold
    ``h1:p1,h2:p2`` (SQLAlchemy reads the port as one number), while libpq reads both forms the same, so the result
    is still a libpq URL once the ``+psycopg`` is dropped."""
    conninfo = postgres_conninfo(url)
    if "://" in conninfo and "," not in _split(conninfo)[1].rpartition("@")[2]:
        return "postgresql+psycopg://" + conninfo.split("://", 1)[1]
    from psycopg.conninfo import conninfo_to_dict

    params = {key: str(value) for key, value in conninfo_to_dict(conninfo).items()}
    user, password, dbname = (quote(params.pop(key, ""), safe="") for key in ("user", "password", "dbname"))
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    query = "&".join(f"{key}={quote(value, safe=',/')}" for key, value in params.items())
    return f"postgresql+psycopg://{auth}/{dbname}" + (f"?{query}" if query else "")


def validate_redis_url(url: str) -> str:
    """Validate a Redis URL (``redis://``, ``rediss://`` or ``unix://``) and return it unchanged."""
    if not url:
        raise ConfigurationError("REDIS_URL is not set: give a Redis URL such as redis://localhost:6379/0")
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in _REDIS_SCHEMES:
        raise ConfigurationError(f"REDIS_URL {redact_url(url)!r} is not a Redis URL: it must start with redis://")
    try:
        parts = urlsplit(url)
        hosts = parts.netloc.rpartition("@")[2].split(",") if scheme.endswith("+cluster") else [None]
        for host in hosts:  # a cluster URL may list several nodes: host:port,host:port
            _ = (parts if host is None else urlsplit(f"redis://{host}")).port
    except ValueError as exc:
        raise ConfigurationError(f"REDIS_URL {redact_url(url)!r} is malformed: {exc}") from None
    return url


@dataclass(frozen=True)
class Settings:
    """Where unilog's servers are and which stream is the default.

    ``stream`` is where records staged without a stream name go (the reference design's raw ``INSERT`` lands
    there), and the stream consumers read unless told otherwise.
    """

    database_url: str
    redis_url: str
    stream: str = DEFAULT_STREAM
    extra: Mapping[str, Any] = field(default_factory=dict)
    # Postgres standbys to read the WAL capture slot's copies on, besides the hosts of database_url (for a
    # database_url that is a virtual IP): ``UNILOG_STANDBY_URLS``, separated by spaces
    standby_urls: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        postgres_conninfo(self.database_url)
        validate_redis_url(self.redis_url)
        validate_stream_name(self.stream)
        for url in self.standby_urls:
            try:
                postgres_conninfo(url)
            except ConfigurationError as exc:
                raise ConfigurationError(f"UNILOG_STANDBY_URLS: {exc}") from None

    @property
    def conninfo(self) -> str:
        """The Postgres URL in psycopg's form."""
        return postgres_conninfo(self.database_url)

    @property
    def standby_conninfos(self) -> tuple[str, ...]:
        """Where the WAL capture slot's copies are read: :attr:`conninfo` (its standby hosts) and each of
        :attr:`standby_urls`, in psycopg's form."""
        return (self.conninfo, *(postgres_conninfo(url) for url in self.standby_urls))

    @classmethod
    def from_dsn(cls, database_url: str, redis_url: str, stream: str = DEFAULT_STREAM) -> Settings:
        """Build settings from explicit URLs."""
        return cls(database_url=database_url, redis_url=redis_url, stream=stream)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Build settings from ``DATABASE_URL``, ``REDIS_URL`` and ``UNILOG_STREAM``; ``overrides`` win if not None."""
        source = os.environ if env is None else env
        values: dict[str, Any] = {
            "database_url": _url_from(source, "DATABASE_URL"),
            "redis_url": _url_from(source, "REDIS_URL"),
            "stream": source.get("UNILOG_STREAM") or DEFAULT_STREAM,
            "standby_urls": tuple(source.get("UNILOG_STANDBY_URLS", "").split()),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def with_(self, **changes: Any) -> Settings:
        """Return a copy with ``changes`` applied (settings are frozen)."""
        return replace(self, **changes)

    def describe(self) -> dict[str, str]:
        """Settings as a dict safe to log: passwords are redacted."""
        return {
            "database_url": redact_url(self.database_url),
            "redis_url": redact_url(self.redis_url),
            "default_stream": self.stream,  # a process's own stream, when it has one, is its "stream"
        }


@contextmanager
def hidden(*names: str) -> Iterator[None]:
    """Import with the packages ``names`` hidden, unless they are imported already (then nothing changes): an import of
    one fails in this block as if it were not installed (what an optional import then does), and works after it.

    For what a dependency imports only in case it is wanted, at a cost to every process start (issue 45): the callers
    say why hiding it changes nothing they use."""
    hiding = [name for name in names if name not in sys.modules]
    for name in hiding:
        sys.modules[name] = None  # type: ignore[assignment]  # the import system's "not importable"
    try:
        yield
    finally:
        for name in hiding:
            if sys.modules.get(name, False) is None:
                del sys.modules[name]


def import_user_module(module_name: str, search: Sequence[str] | None = None) -> ModuleType:
    """``importlib.import_module``, with a top-level package or module that is not importable looked for in
    ``search`` (default: the working directory, as ``python -m`` finds it) without changing ``sys.path``: how every
    command finds the user's code (handlers, record types, backfill types), through the ``unilog`` console script
    as through ``python -m unilog``. Modules it imports by their own top-level names must then be importable (the
    ``unilog`` command has its working directory on the path, as ``python -m`` has)."""
    top = module_name.partition(".")[0]
    if top not in sys.modules and importlib.util.find_spec(top) is None:
        spec = importlib.machinery.PathFinder.find_spec(top, [os.getcwd()] if search is None else list(search))
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            sys.modules[top] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[top]
                raise
    return importlib.import_module(module_name)
