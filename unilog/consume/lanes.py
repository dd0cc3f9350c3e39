"""A consumer over several streams, with no I/O: each stream's lane (its checkpoint row, its rules, its rewind
watch, its retries) and how one read over many streams becomes one bounded batch.

:class:`~unilog.MultiConsumer` and :class:`~unilog.AsyncMultiConsumer` keep one checkpoint row per stream, named
``<consumer>:<stream>`` (:func:`checkpoint_name`): a consumer name holds no ``:`` (``validate_name``), so the
name splits back at its first ``:`` (:func:`split_checkpoint_name`) and a stream's row is an ordinary checkpoint row
that every per-stream tool (status lag, retention registration, ``unilog consumer reset``, dead-letter replays)
already understands.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import engine
from ..config import STREAM_NAME_RE
from ..errors import ConfigurationError
from ..store import Checkpoint
from .base import ConsumerConfig
from .progress import RewindWatch, Rules
from .records import replay_owner

SEPARATOR = ":"
MIN_PER_STREAM = 10  # entries one read asks of each stream, at least: a busy stream among many idle ones still moves


def checkpoint_name(consumer: str, stream: str) -> str:
    """The name of consumer ``consumer``'s checkpoint row on ``stream``: ``<consumer>:<stream>``."""
    return f"{consumer}{SEPARATOR}{stream}"


def split_checkpoint_name(name: str) -> tuple[str, str] | None:
    """(consumer, stream) of a row :func:`checkpoint_name` named, or None for a single-stream consumer's row."""
    consumer, sep, stream = name.partition(SEPARATOR)
    return (consumer, stream) if sep and consumer and stream else None


def moved_refusal(kind: str, single: Checkpoint, row: str) -> ConfigurationError:
    """The one-line refusal of a consumer that ran over ``single.stream`` alone and now runs over several streams
    before its checkpoint was carried over to ``row`` (its row for that stream): the command that carries it over."""
    return ConfigurationError(
        f"{kind} {single.name!r} ran over stream {single.stream!r} alone (checkpoint at {single.last_id}); over "
        f"several streams its checkpoint there is {row!r}, which does not exist yet and would start at the stream's "
        f"beginning, applying those entries again. Stop the single-stream consumer, then carry it over: unilog "
        f"consumer reset {row} --stream {single.stream} --to {single.last_id}"
    )


@dataclass
class Lane:
    """One stream of a consumer over several: its checkpoint row's name (``row``), the rules that sort its
    entries, its rewind watch, and what a retry of it must remember (entries a handler found malformed, handler
    failures at one checkpoint id, dead letters too few replicas acknowledged)."""

    stream: str
    row: str
    rules: Rules
    rewind: RewindWatch
    checkpoint: Checkpoint | None = None
    malformed: dict[bytes, str] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    unconfirmed: dict[bytes, str] = field(default_factory=dict)

    def failed(self) -> None:
        """A batch holding this stream's entries after its checkpoint failed its handler: count it."""
        last_id = self.checkpoint.last_id if self.checkpoint is not None else "0-0"
        self.failures = {last_id: self.failures.get(last_id, 0) + 1}

    def poisoned(self, max_attempts: int) -> bool:
        """Whether batches holding this stream's entries after its checkpoint failed ``max_attempts`` times."""
        last_id = self.checkpoint.last_id if self.checkpoint is not None else "0-0"
        return self.failures.get(last_id, 0) >= max_attempts


def make_lane(config: ConsumerConfig, stream: str) -> Lane:
    """``stream``'s lane of the consumer ``config`` configures: the rules a single-stream consumer named after the
    row would have (so a replay of a dead letter it wrote is addressed to that row)."""
    row = checkpoint_name(config.name, stream)
    owner = replay_owner("consumer", row).encode()
    rules = Rules(row, stream, owner, config.on_malformed, config.strict_start, config.numbers)
    return Lane(stream, row, rules, RewindWatch(row, stream, config.rewind_grace))


def per_stream_count(batch_size: int, streams: int) -> int:
    """How many entries one read asks of each of ``streams`` streams: the batch shared out, at least
    :data:`MIN_PER_STREAM`, at most the batch."""
    return min(batch_size, max(MIN_PER_STREAM, batch_size // max(1, streams)))


def rewind_interval(streams: int) -> float:
    """Seconds between looks for rewound streams (one ``XINFO STREAM`` each, pipelined): once a second, as the
    single-stream consumer does, up to 250 streams; beyond, longer, so the look costs a bounded share of the
    consumer's time (1,000 streams: every 4 s)."""
    return max(1.0, streams / 250)


def fair_cut(read: Mapping[str, list[engine.Entry]], limit: int, turn: int = 0) -> dict[str, list[engine.Entry]]:
    """At most ``limit`` entries of ``read`` (stream -> entries in stream order): whole streams' reads, starting at
    the ``turn``-th stream (the caller turns it every pass, so no stream starves the others), the last one taken
    cut short. Each stream keeps a prefix of what was read (its order holds, and its checkpoint moves only past what
    is kept); taking streams whole rather than a few entries of every one keeps the rows a batch saves few."""
    streams = [stream for stream, entries in read.items() if entries]
    if sum(len(read[stream]) for stream in streams) <= limit:
        return {stream: read[stream] for stream in streams}
    start = turn % len(streams)
    kept: dict[str, list[engine.Entry]] = {}
    room = limit
    for stream in streams[start:] + streams[:start]:
        if room <= 0:
            break
        kept[stream] = read[stream][:room]
        room -= len(kept[stream])
    return kept


def admit(names: list[str], known: Collection[str], max_streams: int, log: Any, **who: Any) -> list[str]:
    """The streams of ``names`` (found by a prefix, in name order) not in ``known`` that fit under ``max_streams``;
    those left out beyond it are said in one warning on ``log`` (with ``who``: the consumer or group). A key that is
    no valid stream name (a space in it, say: another program's) is no stream of a prefix."""
    new = [stream for stream in names if stream not in known and STREAM_NAME_RE.fullmatch(stream)]
    room = max(0, max_streams - len(known))
    if len(new) > room:
        log.warning(
            "more streams than max_streams; reading the first of them",
            **who,
            max_streams=max_streams,
            left_out=len(new) - room,
        )
    return new[:room]


def label_of(streams: tuple[str, ...], prefix: str | None) -> str:
    """The one ``stream`` label a consumer over several streams gives its metrics, logs and spans, whatever the
    number of streams (a label per stream would grow the metric's series with the streams): ``prefix*``, the
    streams joined by ``,`` when they are few, or the first and a count."""
    parts = [f"{prefix}*"] if prefix is not None else []
    if len(streams) <= 3:
        parts += list(streams)
    else:
        parts += [streams[0], f"+{len(streams) - 1} streams"]
    return ",".join(parts)
