"""One settings object for the three consumer kinds, validated at construction, and the command line built from it.

:class:`ConsumeSettings` holds what every kind honours (the stream, batch size, blocking read, Postgres deadline,
back-off, malformed-entry policy); :class:`CheckpointSettings` adds what checkpoints honour (registration, strict
start, poison policy, rewind grace), shared by :class:`ConsumerConfig` and :class:`PartitionConfig`, whose
per-partition consumers get every one of them; :class:`GroupConfig` adds the group's claims and dead letters. Each
field's ``metadata`` carries its command-line help, so ``unilog consume`` offers exactly these settings
(:func:`add_arguments`) and builds the config of the kind it runs from them (:func:`from_arguments`). A value out of
range raises :class:`~unilog.errors.InvalidSetting` naming the setting, in one line.
"""

from __future__ import annotations

import argparse
import os
import socket
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from ..config import STREAM_NAME_RE, validate_name, validate_stream_name
from ..errors import InvalidSetting

# how Record.data reads a JSON number with a fraction or an exponent (here, not in .records: building `unilog
# consume`'s parser reads it, and .records imports psycopg)
NUMBERS = ("float", "decimal")

MALFORMED_POLICIES = ("dead-letter", "stop")
POISON_POLICIES = ("stop", "dead-letter")
CHECKPOINTS = "checkpoint and partitioned"  # the kinds that keep checkpoints
STREAM_PREFIX_RE = STREAM_NAME_RE  # a prefix is spelled as a stream name is (so it cannot hold a glob character)


def default_worker_name() -> str:
    """``host-pid``: unique per process, stable for its life."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _opt(help: str, *, kinds: str = "all", choices: tuple[str, ...] = (), flag: str = "") -> dict[str, Any]:
    """A setting offered on the command line: its help, the kinds it applies to, its choices, its flag."""
    return {"help": help, "kinds": kinds, "choices": choices, "flag": flag}


def _at_least(name: str, value: float | None, low: float, *, strict: bool = False, optional: bool = False) -> None:
    if value is None and optional:
        return
    if value is None or value < low or (strict and value == low):
        bound = f"more than {low:g}" if strict else f"at least {low:g}"
        raise InvalidSetting(f"{name} must be {bound}, not {value!r}")


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise InvalidSetting(f"{name} must be one of {', '.join(allowed)}, not {value!r}")


@dataclass(frozen=True, kw_only=True)
class ConsumeSettings:
    """What every consumer kind honours.

    ``stream`` None means ``Settings.stream``. ``numbers``: how records' ``data`` reads a number with a fraction
    or an exponent, ``"float"`` (the default, as ``json.loads``) or ``"decimal"`` (``Decimal``: exact; see
    :class:`~unilog.Record`). ``block_ms`` is how long one read waits for new entries, so an idle
    consumer reacts within milliseconds of an ``XADD``. A batch transaction (handler included) that takes longer
    than ``pg_timeout`` seconds has its connection broken: it rolls back and is retried, so a silent Postgres never
    hangs the consumer. ``on_malformed``: what to do with an entry that is not a unilog record (``data`` not JSON,
    position fields not integers): ``"dead-letter"`` moves it to ``unilog:dlq:{<stream>}`` with the reason and goes
    on past it in the same transaction as the rest of its batch; ``"stop"`` raises
    :class:`~unilog.errors.MalformedEntry`. Entries with JSON ``data`` but no unilog position (another service's
    ``XADD``) are records: applied in stream order, but never deduplicated by position.

    ``wait_replicas``: how many replicas must acknowledge a dead letter (``WAIT``, on the connection that wrote it,
    to the node that owns the dead-letter stream's slot) before the consumer moves past its record; None (the
    default) means 1 on a Redis Cluster (a ``redis+cluster://`` URL: its primaries have replicas to fail over to)
    and 0 on a single Redis. A checkpoint consumer whose letter too few replicas acknowledged within
    ``wait_timeout_ms`` rolls back (checkpoint and held row) and retries the record, so a failover cannot lose a
    letter whose record it passed; a group's letter and acknowledgement are one MULTI, which a replica keeps whole
    or not at all (a lost pair is delivered again), so a group only logs and counts the shortfall.
    """

    stream: str | None = field(default=None, metadata=_opt("stream to read (default: $UNILOG_STREAM)"))
    batch_size: int = field(default=1000, metadata=_opt("entries read and applied per transaction"))
    block_ms: int = field(default=1000, metadata=_opt("milliseconds one read waits for new entries"))
    pg_timeout: float | None = field(
        default=60.0, metadata=_opt("seconds a batch's transaction may take before its connection is broken (0: none)")
    )
    max_backoff: float = field(default=10.0, metadata=_opt("longest back-off, in seconds, between failed passes"))
    restart_after_crash: bool = True  # the command line's --exit-on-crash
    wait_replicas: int | None = field(
        default=None,
        metadata=_opt(
            "replicas that must acknowledge a dead letter before the consumer moves past its record (default: 1 on a "
            "Redis Cluster, 0 on a single Redis)"
        ),
    )
    wait_timeout_ms: int = field(
        default=1000, metadata=_opt("milliseconds a dead letter waits for --wait-replicas replicas")
    )
    numbers: str = field(
        default="float",
        metadata=_opt(
            "how a record's data reads numbers with a fraction or exponent: float, or decimal (Decimal, every digit)",
            choices=NUMBERS,
        ),
    )
    on_malformed: str = field(
        default="dead-letter",
        metadata=_opt(
            "an entry that is not a unilog record (data not JSON): dead-letter it and go on, or stop with exit code 10",
            choices=MALFORMED_POLICIES,
        ),
    )

    def __post_init__(self) -> None:
        if self.stream is not None:
            validate_stream_name(self.stream)
        _at_least("batch_size", self.batch_size, 1)
        _at_least("block_ms", self.block_ms, 1)
        _at_least("pg_timeout", self.pg_timeout, 0, optional=True)
        _at_least("max_backoff", self.max_backoff, 0, strict=True)
        _one_of("on_malformed", self.on_malformed, MALFORMED_POLICIES)
        _one_of("numbers", self.numbers, NUMBERS)
        _at_least("wait_replicas", self.wait_replicas, 0, optional=True)
        _at_least("wait_timeout_ms", self.wait_timeout_ms, 1)  # WAIT's 0 would block for ever


@dataclass(frozen=True, kw_only=True)
class CheckpointSettings(ConsumeSettings):
    """What checkpoint consumers honour, and with them every partition of a partitioned consumer.

    With ``register`` the consumer records its checkpoint in the stream's registry after a commit, at most every
    ``register_interval`` seconds (an older value only holds back more of the stream), and trimming never passes
    it. With ``strict_start`` (rebuilds) a producer whose first record in the stream is not its position 1 stops
    the consumer: its history was trimmed. ``max_attempts`` and ``on_poison``: after a handler fails one batch
    ``max_attempts`` times, the batch is applied one record per transaction to find the failing record; then
    ``"stop"`` raises :class:`~unilog.errors.PoisonRecord` (the records before it are applied, it and those after
    are not), and ``"dead-letter"`` moves it to ``unilog:dlq:{<stream>}`` with the error (``attempts``: the batch's
    failures and its own), advances the checkpoint past it in the same transaction and goes on; a replay of it
    (``unilog dlq replay``) is then applied once. ``rewind_grace``: how long a stream that ends below the checkpoint
    may take to be re-sent before :class:`~unilog.errors.StreamRewound` (only with streamers run with
    ``--wait-replicas``).
    """

    register: bool = field(
        default=True,
        metadata=_opt("do not register the checkpoint for retention", kinds=CHECKPOINTS, flag="--no-register"),
    )
    register_interval: float = field(
        default=0.0, metadata=_opt("seconds between registrations of the checkpoint", kinds=CHECKPOINTS)
    )
    strict_start: bool = field(
        default=False,
        metadata=_opt("stop if a producer's first record in the stream is not its position 1", kinds=CHECKPOINTS),
    )
    max_attempts: int = field(
        default=3,
        metadata=_opt(
            "failures of one batch before it is applied record by record to find the poison", kinds=CHECKPOINTS
        ),
    )
    on_poison: str = field(
        default="stop",
        metadata=_opt(
            "a record that fails alone stops the consumer with exit code 11, or is dead-lettered and passed",
            kinds=CHECKPOINTS,
            choices=POISON_POLICIES,
        ),
    )
    rewind_grace: float = field(
        default=0.0,
        metadata=_opt(
            "seconds to wait for a stream that ends below the checkpoint to be re-sent before exit code 8 (only with "
            "streamers run with --wait-replicas; 0: stop at once)",
            kinds=CHECKPOINTS,
        ),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        _at_least("register_interval", self.register_interval, 0)
        _at_least("max_attempts", self.max_attempts, 1)
        _one_of("on_poison", self.on_poison, POISON_POLICIES)
        _at_least("rewind_grace", self.rewind_grace, 0)


MULTI = "checkpoint, group"  # the kinds that read several streams: --streams, --stream-prefix


@dataclass(frozen=True, kw_only=True)
class SeveralStreams:
    """What a consumer over several streams adds (a checkpoint consumer, :class:`~unilog.MultiConsumer`, or a group
    worker): ``streams``, a tuple of stream names (a comma-separated string is split), and/or ``stream_prefix``, every
    stream whose name starts with it, looked for again every ``discover_interval`` seconds so streams created later
    are read too, up to ``max_streams`` streams in all. ``stream`` and ``streams`` cannot both be given."""

    streams: tuple[str, ...] = field(
        default=(),
        metadata=_opt(
            "several streams to read, comma-separated (a checkpoint consumer keeps a checkpoint each)", kinds=MULTI
        ),
    )
    stream_prefix: str | None = field(
        default=None,
        metadata=_opt("read every stream whose name starts with this, new ones included", kinds=MULTI),
    )
    discover_interval: float = field(
        default=5.0, metadata=_opt("seconds between looks for new streams of --stream-prefix", kinds=MULTI)
    )
    max_streams: int = field(default=10_000, metadata=_opt("most streams one consumer reads", kinds=MULTI))

    def _check_streams(self, stream: str | None) -> None:
        streams = self.streams
        if isinstance(streams, str):  # the command line's --streams a,b
            streams = tuple(part.strip() for part in streams.split(","))
        streams = tuple(streams)
        object.__setattr__(self, "streams", streams)
        for name in streams:
            if not name:
                raise InvalidSetting("streams: an empty stream name (give names separated by commas)")
            validate_stream_name(name)
        if len(set(streams)) != len(streams):
            raise InvalidSetting(f"streams: a stream is named twice in {','.join(streams)!r}")
        if streams and stream is not None:
            raise InvalidSetting("give stream (one stream) or streams (several), not both")
        if self.stream_prefix is not None and stream is not None:
            raise InvalidSetting("give stream (one stream) or stream_prefix (several), not both")
        if self.stream_prefix is not None and not STREAM_PREFIX_RE.fullmatch(self.stream_prefix):
            raise InvalidSetting(
                f"stream_prefix {self.stream_prefix!r}: use 1-200 characters from [A-Za-z0-9_.:-], starting with a "
                "letter or digit (a prefix, not a pattern: no '*')"
            )
        _at_least("discover_interval", self.discover_interval, 0, strict=True)
        _at_least("max_streams", self.max_streams, 1)
        if len(streams) > self.max_streams:
            raise InvalidSetting(f"streams: {len(streams)} streams, more than max_streams ({self.max_streams})")

    @property
    def several(self) -> bool:
        """Whether this consumer reads several streams (``streams`` or ``stream_prefix``)."""
        return bool(self.streams) or self.stream_prefix is not None


@dataclass(frozen=True)
class ConsumerConfig(CheckpointSettings, SeveralStreams):
    """A checkpoint consumer: ``name`` keys its checkpoint; every other setting is :class:`CheckpointSettings`'s.

    Several streams (:class:`~unilog.MultiConsumer`, see :class:`SeveralStreams`): each stream keeps a checkpoint row
    of its own, named ``<name>:<stream>`` (see :func:`~unilog.consume.lanes.checkpoint_name`)."""

    name: str

    def __post_init__(self) -> None:
        validate_name("consumer", self.name)
        super().__post_init__()
        self._check_streams(self.stream)


@dataclass(frozen=True)
class PartitionConfig(CheckpointSettings):
    """A partitioned consumer: ``name`` prefixes its per-partition checkpoints (``<name>.p<i>``), each consumed with
    every :class:`CheckpointSettings` given here; ``worker`` names this worker (default ``host-pid``); workers
    re-balance partitions every ``rebalance_interval`` seconds and a worker whose heartbeat is older than
    ``heartbeat_ttl`` seconds counts as gone."""

    name: str
    worker: str = field(default="", kw_only=True)
    batch_size: int = field(default=500, kw_only=True, metadata=_opt("entries read and applied per transaction"))
    block_ms: int = field(default=500, kw_only=True, metadata=_opt("milliseconds one read waits for new entries"))
    rebalance_interval: float = field(
        default=1.0, kw_only=True, metadata=_opt("seconds between re-balances of partitions", kinds="partitioned")
    )
    heartbeat_ttl: float = field(
        default=5.0, kw_only=True, metadata=_opt("seconds a worker's heartbeat lives", kinds="partitioned")
    )

    def __post_init__(self) -> None:
        validate_name("partitioned consumer", self.name)
        super().__post_init__()
        _at_least("rebalance_interval", self.rebalance_interval, 0, strict=True)
        _at_least("heartbeat_ttl", self.heartbeat_ttl, 0, strict=True)

    def partition(self, index: int, stream: str) -> ConsumerConfig:
        """The config of partition ``index``'s consumer on ``stream``: this config's every checkpoint setting."""
        shared = {f.name: getattr(self, f.name) for f in fields(CheckpointSettings)}
        return ConsumerConfig(**{**shared, "stream": stream}, name=f"{self.name}.p{index}")


@dataclass(frozen=True)
class GroupConfig(ConsumeSettings, SeveralStreams):
    """A group worker: ``group`` names the group (and its state in ``unilog_processed``), ``worker`` this worker in
    Redis; over several streams (:class:`SeveralStreams`) the group is created on each, at its beginning.
    ``claim_idle_ms`` is how long an entry must sit unacknowledged before another worker claims it (and the back-off
    between attempts at a failing record), looked for every ``claim_interval`` seconds; ``max_deliveries`` failed
    attempts send a record to the dead letters; processed identities are pruned behind the watermark every
    ``prune_interval`` seconds."""

    group: str
    worker: str = field(default="", kw_only=True)
    batch_size: int = field(default=500, kw_only=True, metadata=_opt("entries read and applied per transaction"))
    claim_idle_ms: int = field(
        default=30_000, kw_only=True, metadata=_opt("claim entries idle this long (milliseconds)", kinds="group")
    )
    claim_interval: float = field(
        default=5.0, kw_only=True, metadata=_opt("seconds between looks for idle entries", kinds="group")
    )
    max_deliveries: int = field(
        default=5, kw_only=True, metadata=_opt("failed attempts before a record is dead-lettered", kinds="group")
    )
    prune_interval: float = field(
        default=10.0, kw_only=True, metadata=_opt("seconds between prunes of processed identities", kinds="group")
    )

    def __post_init__(self) -> None:
        validate_name("group", self.group)
        super().__post_init__()
        self._check_streams(self.stream)
        _at_least("claim_idle_ms", self.claim_idle_ms, 0)
        _at_least("claim_interval", self.claim_interval, 0)
        _at_least("max_deliveries", self.max_deliveries, 1)
        _at_least("prune_interval", self.prune_interval, 0)


KINDS: dict[str, type[ConsumeSettings]] = {
    "checkpoint": ConsumerConfig,
    "partitioned": PartitionConfig,
    "group": GroupConfig,
}


def _cli_fields() -> dict[str, Any]:
    """Every setting offered on the command line (the first declaration of each name), by name."""
    found: dict[str, Any] = {}
    for kind in KINDS.values():
        for f in fields(kind):
            if f.metadata and f.name not in found:
                found[f.name] = f
    return found


def _type(f: Any) -> Any:
    types = {"int": int, "int | None": int, "float": float, "float | None": float, "str": str, "str | None": str}
    return types.get(str(f.type), str)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One option per consumer setting (``--batch-size`` for ``batch_size``...). The command line's default is the
    setting's first declaration's (so ``--batch-size`` is 1000 for every kind, as it always was on the command line,
    where the Python API's group and partitioned configs default to 500)."""
    for name, f in _cli_fields().items():
        meta = f.metadata
        flag = meta["flag"] or "--" + name.replace("_", "-")
        scope = "" if meta["kinds"] == "all" else f"{meta['kinds']}: "
        if str(f.type) == "bool":
            action = "store_false" if f.default else "store_true"
            parser.add_argument(flag, dest=name, action=action, default=None, help=f"{scope}{meta['help']}")
            continue
        shown = "" if f.default in (None, ()) else f" (default {f.default})"  # a None default is said in the help
        parser.add_argument(
            flag,
            dest=name,
            type=_type(f),
            choices=meta["choices"] or None,
            default=None,
            help=f"{scope}{meta['help']}{shown}",
        )


def from_arguments(kind: str, args: argparse.Namespace, **identity: Any) -> Any:
    """The config of ``kind`` ("checkpoint", "partitioned", "group") from the options given; an option that does
    not apply to that kind is refused in one line."""
    cls = KINDS[kind]
    own = {f.name for f in fields(cls)}
    offered = _cli_fields()
    given = {name: value for name in offered if (value := getattr(args, name, None)) is not None}
    foreign = sorted(name for name in given if name not in own)
    if foreign:
        flags = ", ".join(offered[n].metadata["flag"] or "--" + n.replace("_", "-") for n in foreign)
        raise InvalidSetting(f"{flags}: not a setting of a {kind} consumer")
    values = {name: f.default for name, f in offered.items() if name in own and f.default is not MISSING}
    values.update(given)
    if values.get("pg_timeout") == 0:
        values["pg_timeout"] = None
    return cls(**values, **identity)
