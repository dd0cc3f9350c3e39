"""The :class:`Capture` interface the streamer drives its captures through, and what a pass returns
(:class:`BatchResult`).

A capture reads committed staged records from one source and publishes them through the streamer's
:class:`~unilog.stream.publisher.Publisher`: table mode (:class:`unilog.stream.capture_table.TableCapture`, committed
staged rows claimed in id order), WAL mode (:class:`unilog.stream.capture_wal.WalCapture`, a logical slot in commit
order). Switching a database between the two is :mod:`unilog.stream.modes`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import psycopg


@dataclass(frozen=True)
class BatchResult:
    """What one pass did: records published, whether records are known to be on their way (WAL mode: staged rows, or
    WAL the slot's stream has not reached),
    whether a stream with staged records is held by another streamer's lock, and whether publishing was held off."""

    published: int = 0
    waiting: bool = False
    blocked: bool = False
    paused: bool = False  # publishing held off: Redis is nearly out of memory (back-pressure)


class Capture(Protocol):
    """One way of reading committed staged records and publishing them, driven by the streamer through these members
    only. A capture publishes through the :class:`Publisher` it was made with, deletes a record's staged row only
    after Redis confirmed it, and commits or rolls back the transactions it begins on ``conn``."""

    # True: what there is to publish arrives on the capture's own connection and :meth:`wait` sleeps on it (WAL
    # mode: the slot's stream); False: the streamer sleeps on LISTEN for commits
    wakes_itself: bool

    def run_once(self, conn: psycopg.Connection[Any]) -> BatchResult:
        """One pass on the streamer's Postgres session: publish at most one batch per owned stream, or raise with
        nothing deleted that Redis did not confirm."""
        ...

    def wait(self, timeout: float) -> bool:
        """Sleep until the source has something to publish (return True) or ``timeout`` passes (False)."""
        ...

    def reset(self) -> None:
        """After a failed pass: drop what was read but not published; the next pass starts from committed state."""
        ...

    def close(self) -> None:
        """Close what the capture opened of its own (its sessions, its threads)."""
        ...
