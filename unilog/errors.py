"""The one error hierarchy of unilog.

Everything unilog raises on purpose derives from :class:`UnilogError`, so callers can catch the framework's errors
in one place. Injected crashes are the exception to that rule on purpose: :class:`InjectedCrash` derives from
``BaseException`` so that an ``except Exception`` anywhere (in user code, in a retry loop) cannot swallow a
simulated crash and turn it into a silent success.
"""

from __future__ import annotations


class UnilogError(Exception):
    """Base class of every error unilog raises deliberately."""


# -- producer input ---------------------------------------------------------------------------------------------------


class InvalidRecord(UnilogError, ValueError):
    """A record handed to ``emit`` is malformed; nothing was written and the caller's transaction is still usable.

    From ``emit_many``, ``index`` is the position of the first bad record in the list (its message starts with
    ``records[index]``); None from ``emit``."""

    index: int | None = None


class PayloadNotSerializable(InvalidRecord):
    """The record's data cannot be represented as JSON (unsupported type, NaN/Infinity, NUL character)."""


class PayloadTooLarge(InvalidRecord):
    """The record's JSON encoding exceeds the configured size limit."""


class InvalidStreamName(InvalidRecord):
    """A stream name is empty, too long or has characters outside ``[A-Za-z0-9_.:-]``."""


class RecordContractViolation(InvalidRecord):
    """A typed record does not satisfy its declared type (``unilog.contracts.record_type``): a field fails its rule,
    a float is NaN or Infinity, a string holds a NUL character (jsonb stores neither), or the object is not an
    instance of the declared class. Nothing was written and the caller's transaction is still usable.

    ``field`` is the path of the offending value (``"amount"``, ``"items[0].price"``; ``""`` for the record as a
    whole) and ``rule`` the rule it broke (pydantic's error type, e.g. ``"decimal_parsing"``, or unilog's own:
    ``"finite_number"``, ``"no_nul_character"``); the message is one line naming both."""

    def __init__(self, message: str, field: str = "", rule: str = "") -> None:
        super().__init__(message)
        self.field, self.rule = field, rule


class NotInTransaction(UnilogError):
    """``emit`` was given a connection in autocommit mode with no transaction open.

    Staging outside a transaction would make the record real even if the caller's business change later failed,
    which defeats the outbox; unilog refuses instead of guessing.
    """


# -- configuration and environment -------------------------------------------------------------------------------------


class ConfigurationError(UnilogError):
    """A setting is missing or malformed (for example a database URL that is not a Postgres URL)."""


class InvalidSetting(ConfigurationError, ValueError):
    """A consumer setting is out of range or does not apply to the kind of consumer it was given to."""


class InvalidName(ConfigurationError, ValueError):
    """A consumer, group or worker name has characters outside ``[A-Za-z0-9_.-]`` (it becomes part of Redis keys)."""


class WrongKeyType(ConfigurationError):
    """A Redis key unilog needs holds another type (another application uses the name)."""


class RedisPermissionDenied(ConfigurationError):
    """The Redis user (ACL) may not run a command unilog needs."""


class RedisReadOnly(ConfigurationError):
    """The Redis server refuses writes: ``REDIS_URL`` names a replica (or a primary demoted by a failover)."""


class RedisAuthFailed(ConfigurationError):
    """Redis refused the credentials in ``REDIS_URL`` (``NOAUTH``: none given where one is required; ``WRONGPASS``)."""


class PostgresPermissionDenied(ConfigurationError):
    """The Postgres role in ``DATABASE_URL`` lacks a privilege unilog needs; the message names what was refused."""


class InvalidUsage(ConfigurationError):
    """Command-line options that contradict each other (``--partitioned --group``), or one that does not apply to
    what it is given for (``--from`` for a consumer that already has a checkpoint); nothing was started."""


class MissingExtra(ConfigurationError):
    """A command needs an optional package that is not installed; the message names the package and the extra that
    installs it (``pip install 'unilog-outbox[dashboard]'``), and nothing was started."""


class MissingTool(ConfigurationError):
    """A command needs a program that is not a Python package (``node`` or ``npm`` for ``unilog asyncapi
    --validate``) and did not find it, or could not install what it needs with it; the one-line message names the
    program and how to install it, and nothing was validated."""


class AsyncAPIInvalid(UnilogError):
    """``unilog asyncapi --validate``: the official AsyncAPI parser found errors in the document (printed above the
    message, one line each: severity, rule, path, message)."""


class UnsupportedServer(ConfigurationError):
    """The server is older than unilog supports (Postgres 15, Redis 6.2)."""


class ServerUnreachable(UnilogError):
    """Postgres or Redis could not be reached; the message names the server (password redacted) and the cause."""


class ReadOnlyServer(ServerUnreachable):
    """The server reached is a read-only standby (in recovery): a worker waits for a primary as for an unreachable
    server, retrying with back-off (a multi-host ``DATABASE_URL`` with ``target_session_attrs=read-write`` or a
    virtual IP then reaches the promoted one); a command stops with this one line."""


class SchemaMissing(UnilogError):
    """The database lacks unilog's tables or is behind the migrations; run ``unilog migrate``."""


class MigrationFailed(UnilogError):
    """``unilog migrate`` could not apply the migrations; the message says what Postgres refused and why."""


class IncompatibleTable(MigrationFailed):
    """An existing ``staged_log_records`` cannot be adopted; the message names the column and the fix."""


class SchemaIncompatible(UnilogError):
    """A record type's schema cannot be registered: it breaks the registered versions under its stream's
    compatibility mode, or it differs from the schema already registered under the same name and version (bump the
    version). Nothing was registered; the message names the type and the change."""


# -- runtime -----------------------------------------------------------------------------------------------------------


class HandlerNotFound(ConfigurationError):
    """A ``module:function`` handler reference cannot be imported."""


class ConsumerRunning(UnilogError):
    """A consumer or group cannot be deleted while a process of it is connected (its Postgres session, or a group's
    worker, shows it); nothing was deleted."""


class DataLoss(UnilogError):
    """Records a consumer needs are gone from the stream; it stops rather than skip them silently.

    Recovery: rebuild or repair the consumer from the canonical source (``unilog reconcile``) or the archive, then
    reset its checkpoint (docs/guides/delivery-guarantees.md, "Lost or rewound Redis").
    """


class ClaimIncomplete(DataLoss):
    """A table-mode claim saved before its send lost some of its staged rows before it was deleted (a manual delete,
    a restore): re-sent, the rest would take positions Redis already has, and the records after them would be
    skipped. The streamer stops; the claim, its remaining rows and Redis's entries say what was sent."""


class StreamGap(DataLoss):
    """A producer's positions jump: entries after the consumer's checkpoint were trimmed or lost."""


class StreamRewound(DataLoss):
    """The stream's last id is below a consumer's checkpoint: Redis lost entries it had confirmed."""


class ConcurrentConsumer(UnilogError):
    """Another copy of a consumer keeps moving its checkpoint while this one applies a batch."""


class NotReplicated(UnilogError):
    """Too few replicas acknowledged a dead letter in time (``wait_replicas``, ``WAIT``): a failover now could lose
    it, so the checkpoint consumer rolled back the transaction that would have moved past its record. The process
    loop retries it after a back-off; the record stays ahead of the checkpoint until a replica acknowledges."""


class HorizonHeld(UnilogError):
    """Retired: nothing raises it since table mode stopped reading below the visibility horizon (issue 33, migration
    unilog_0011), so no record waits for another transaction. Kept so that code importing it keeps working."""


class CaptureRecreated(UnilogError):
    """The WAL capture slot was lost at no cost (producers had been held to rows, every record message before
    published or rescued as a row) and the streamer replaced it; it reconnects, and publishes the rows staged
    meanwhile from the table first. Retried, never an exit."""


class CaptureLost(UnilogError):
    """WAL capture cannot go on: its replication slot was dropped, or invalidated because the WAL it needed was
    removed (``max_slot_wal_keep_size``). Nothing is lost (a staged row is deleted only after its record was
    published); ``unilog capture wal --recreate`` makes a new slot and the streamer publishes the rest from the table.
    """


class PolicyStop(UnilogError):
    """A worker's own policy says stop here (``on_malformed="stop"``, ``on_poison="stop"``): the process loop never
    retries it, and nothing after the entry it names was applied."""


class PoisonRecord(PolicyStop):
    """A record keeps failing its handler, alone in its transaction, after ``max_attempts`` failures of its batch,
    and the consumer's poison policy is ``stop``. The message names the consumer, the entry id, the record's position
    and the handler's error."""

    def __init__(self, message: str, entry_id: str) -> None:
        super().__init__(message)
        self.entry_id = entry_id


class MalformedEntry(PolicyStop):
    """A stream entry is not a unilog record (another writer's, or damaged): its ``data`` is not JSON, or its
    position fields are not integers. By default consumers dead-letter it and go on; with ``on_malformed="stop"``
    they stop with this error, which names the entry."""

    def __init__(self, stream: str, entry_id: str, reason: str) -> None:
        super().__init__(f"entry {entry_id} of stream {stream!r} is not a unilog record: {reason}")
        self.stream, self.entry_id, self.reason = stream, entry_id, reason


class UnreadableRecord(MalformedEntry):
    """A record cannot be read as the type a consumer asked for (:meth:`unilog.Record.typed`): it is of another
    type, its version is newer than the consumer's class knows (:class:`UnknownRecordVersion`), or its data breaks
    the type's rules. ``reason`` says which, naming the field and the rule. A :class:`MalformedEntry`, so a consumer
    applies its ``on_malformed`` policy to the record: dead-letter it with this reason (the default; replay it once
    the consumer is upgraded) or stop (exit 10)."""

    def __init__(self, reason: str, stream: str = "", entry_id: str = "") -> None:
        UnilogError.__init__(self, reason)
        self.stream, self.entry_id, self.reason = stream, entry_id, reason
        if entry_id:
            self.at(stream, entry_id)

    def at(self, stream: str, entry_id: str) -> UnreadableRecord:
        """This error, naming the stream entry it was met in (its message then starts with the entry)."""
        self.stream, self.entry_id = stream, entry_id
        self.args = (f"entry {entry_id} of stream {stream!r} cannot be read typed: {self.reason}",)
        return self


class UnknownRecordVersion(UnreadableRecord):
    """A record was written with a newer version of its type than the consumer's class (``version`` > ``newest``):
    upgrade the consumer; the record waits in the dead letters for a replay."""

    def __init__(self, name: str, version: int, newest: int) -> None:
        super().__init__(
            f"{name} v{version} is newer than v{newest}, the newest this consumer knows: upgrade it (the record stays "
            "in the dead letters for a replay)"
        )
        self.name, self.version, self.newest = name, version, newest


class BackfillRefused(UnilogError):
    """A backfill cannot start or go on: its table or key column does not exist, the key is not unique or has no
    order, ``--where`` does not parse, a column's type cannot be encoded, or no backfill has the name given. Nothing
    of the refused page was staged; the message names the problem."""


class PublishError(UnilogError):
    """Redis rejected or did not confirm a batch; the staged records were kept and will be re-sent."""


class RowsHeld(PublishError):
    """A published batch's staged rows are held locked by another session past the streamer's wait: its claim stays
    saved (re-sent under the same positions, deduplicated) and its stream waits while the pass goes on with the
    others."""

    def __init__(self, stream: str) -> None:
        super().__init__(f"the staged rows of {stream} are held locked by another session; its records wait")
        self.stream = stream
        self.published = 0  # records of the stream published (deleted) in the same pass before it


class RedisOutOfMemory(PublishError):
    """Redis refused a batch because it reached ``maxmemory``, or the streamer paused before it would (back-pressure):
    the records stay staged in Postgres and are published once Redis has room."""


class InjectedCrash(BaseException):
    """A crash injected by :mod:`unilog.faults` at a named step.

    Derives from ``BaseException`` so that ``except Exception`` cannot hide it: it must unwind to the process loop
    exactly as a real crash would abort the transaction that was open.
    """

    def __init__(self, point: str) -> None:
        super().__init__(f"injected crash at {point}")
        self.point = point
