"""unilog for Django: stage records on Django's own connection inside ``transaction.atomic()``, create unilog's
tables with Django's migrations, and run consumers whose handlers write through the ORM in unilog's transaction.

Add ``"unilog.django"`` to ``INSTALLED_APPS`` (its tables then come with ``python manage.py migrate``; ``unilog
migrate`` works as well), then:

* :func:`emit` stages a record in the current ``atomic()`` block: it commits with the block, and a block or savepoint
  rolled back takes it with it. Outside ``atomic()`` it is refused (Django would commit it on its own, before the
  rest of the request). :func:`emit_many` stages many records so, in one statement.
* :class:`DjangoConsumer` (or ``python manage.py unilog_consume app.module:handler --name NAME``) runs a checkpoint
  consumer whose transaction is Django's: the handler gets the psycopg connection and may use the ORM freely; its
  writes, the checkpoint and nothing else commit together.

Django must use its ``psycopg`` (3) backend, the one it picks when psycopg is installed, as it is with unilog.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

try:
    from django.db import DEFAULT_DB_ALIAS, connections, transaction
except ModuleNotFoundError as exc:  # imported outside a Django project: say which extra installs it
    if (exc.name or "").partition(".")[0] != "django":
        raise
    raise ModuleNotFoundError(
        "unilog.django needs Django, which is not installed: pip install 'unilog-outbox[django]'", name="django"
    ) from None

from ..config import Settings
from ..consume.consumer import Consumer, ConsumerConfig
from ..consume.records import Handler
from ..errors import ConfigurationError, NotInTransaction
from ..faults import NO_FAULTS, Faults
from ..produce.encoding import Encoder
from ..produce.handles import raise_if_schema_missing
from ..produce.producer import Producer
from ..produce.records import DEFAULT_RULES, RecordFields
from ..runtime import Links
from ..store import INSERT_STAGED, INSERT_STAGED_MANY, staged_columns

__all__ = ["DjangoConsumer", "database_url", "emit", "emit_many"]


def emit(
    *,
    action: str,
    object: str,
    data: Any,
    stream: str | None = None,
    key: str | None = None,
    using: str = DEFAULT_DB_ALIAS,
    producer: Producer | None = None,
    default: Encoder | None = None,
) -> int | None:
    """Stage one record in the current ``transaction.atomic()`` block of database ``using``; return its staged id
    (None in WAL capture mode, where the record is a logical message: see :func:`unilog.emit`).

    The arguments, validation, encoding of ``data`` (a model's ``DecimalField``, ``UUIDField``, ``DateTimeField``
    and ``BinaryField`` values included; ``default`` for other types) and errors are :func:`unilog.emit`'s: bad
    input raises before anything is sent, so the block stays usable."""
    connection = _atomic(using, "emit()")
    settings = producer or DEFAULT_RULES
    params = settings.prepare(action=action, object=object, data=data, stream=stream, key=key, default=default)
    rows = _run(connection, INSERT_STAGED, params)
    return None if rows[0][0] is None else int(rows[0][0])


def emit_many(
    records: Iterable[RecordFields],
    *,
    using: str = DEFAULT_DB_ALIAS,
    producer: Producer | None = None,
    default: Encoder | None = None,
) -> list[int | None]:
    """Stage many records in the current ``transaction.atomic()`` block of database ``using`` with one statement,
    in the order given; return their staged ids (None each in WAL capture mode). The records (mappings of
    :func:`emit`'s arguments), checks and errors are :func:`unilog.emit_many`'s; an empty list sends nothing."""
    connection = _atomic(using, "emit_many()")
    params = (producer or DEFAULT_RULES).prepare_many(records, default=default)
    if not params:
        return []
    return [
        None if row[0] is None else int(row[0]) for row in _run(connection, INSERT_STAGED_MANY, staged_columns(params))
    ]


def _atomic(using: str, caller: str) -> Any:
    """Database ``using``'s connection, refused outside ``transaction.atomic()``."""
    connection = connections[using]
    if not connection.in_atomic_block:
        raise NotInTransaction(
            f"unilog.django.{caller} needs transaction.atomic(): outside it Django commits every statement at once, "
            "so the record would be published even if the rest of the work failed"
        )
    return connection


def _run(connection: Any, statement: str, params: tuple[Any, ...]) -> list[Any]:
    try:
        with connection.cursor() as cursor:
            cursor.execute(statement, params)
            return list(cursor.fetchall())
    except Exception as exc:
        raise_if_schema_missing(exc)
        raise


def migrate_schema(apps: Any, schema_editor: Any) -> None:
    """What each of this app's Django migrations runs: unilog's own migrations up to the installed head, on a
    connection of their own (idempotent, so a failure before Django records the migration is repaired by re-running)."""
    from ..ops.schema import migrate

    migrate(database_url(schema_editor.connection.alias))


def database_url(using: str = DEFAULT_DB_ALIAS) -> str:
    """A ``postgresql://`` URL for Django database ``using`` (for ``unilog`` commands and :class:`Settings`).

    ``HOST`` and ``PORT`` may be lists (``"db1,db2"``, ``"5432,5433"``), as libpq takes them; the ``OPTIONS`` that
    are libpq's (``target_session_attrs``, ``sslmode``, ...) come along, so unilog's own connections find the same
    primary after a failover as Django's. Django's own options (``pool``, ``isolation_level``...) are left out."""
    params = connections[using].settings_dict
    user, password = quote(params.get("USER") or ""), quote(params.get("PASSWORD") or "")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    libpq = _libpq_keywords()
    options = [(k, v) for k, v in (params.get("OPTIONS") or {}).items() if k in libpq and v is not None]
    query = "&".join(
        f"{name}={quote(str(value), safe=',/')}"
        for name, value in (("host", params.get("HOST")), ("port", params.get("PORT")), *options)
        if value
    )
    return f"postgresql://{auth}/{quote(params['NAME'])}" + (f"?{query}" if query else "")


def _libpq_keywords() -> set[str]:
    """The connection parameters the installed libpq knows."""
    from psycopg.pq import Conninfo

    return {option.keyword.decode() for option in Conninfo.get_defaults()}


class _DjangoLinks(Links):
    """A consumer's Postgres connection is Django's own (``using``): the ORM in a handler writes in its transaction.

    The links' own code checks the schema of each new session and runs the consumer's callback
    (:class:`unilog.runtime.Links`); only where the session comes from and where it goes differ."""

    def __init__(self, settings: Settings, using: str, **kw: Any) -> None:
        # Django's session commits itself: outside ``atomic()`` each statement, inside one the block
        super().__init__(settings, autocommit=True, **kw)
        self.using = using

    def session(self) -> Any:
        """Django's connection of ``using`` (opened if it is not)."""
        wrapper = connections[self.using]
        wrapper.ensure_connection()
        raw = wrapper.connection
        if raw is not self._pg and (wrapper.vendor != "postgresql" or not hasattr(raw, "pgconn")):
            raise ConfigurationError(
                f"Django database {self.using!r} is not PostgreSQL on psycopg 3 (Django's 'psycopg' backend): "
                "unilog's consumer needs it"
            )
        return raw

    def end_session(self, conn: Any) -> None:
        """Give Django's connection back: closed unless inside ``atomic()`` (Django opens it again on next use)."""
        if not connections[self.using].in_atomic_block:
            connections[self.using].close()


class DjangoConsumer(Consumer):
    """A checkpoint consumer (see :class:`unilog.Consumer`) whose every pass runs in ``transaction.atomic()`` on
    Django database ``using``: the handler's ORM writes and the checkpoint commit together, or neither does.
    ``redis_url`` and ``stream`` complete the settings (the database is Django's)."""

    def __init__(
        self,
        config: ConsumerConfig,
        handler: Handler,
        *,
        redis_url: str,
        stream: str | None = None,
        using: str = DEFAULT_DB_ALIAS,
        faults: Faults = NO_FAULTS,
    ) -> None:
        settings = Settings(database_url=database_url(using), redis_url=redis_url)
        settings = settings.with_(stream=stream) if stream else settings
        super().__init__(settings, config, handler, faults=faults)
        self.using = using
        self.links = _DjangoLinks(
            settings,
            using,
            app_name=f"unilog-consumer-{config.name}",
            pg_timeout=config.pg_timeout,
            redis_timeout=config.block_ms / 1000 + 10,
            on_pg_connect=self._forget_checkpoint,
        )

    def run_once(self, block_ms: int | None = None) -> Any:
        with transaction.atomic(using=self.using):
            return super().run_once(block_ms)
