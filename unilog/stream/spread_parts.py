"""The parts of a table-mode batch across streams that its passes hand between threads
(:mod:`unilog.stream.capture_spread`): what is sent per target, a batch made ready to send and cut in pieces, its
sending in the helper thread, and the helper thread itself; and which streams may share a target."""

from __future__ import annotations

import concurrent.futures
import queue
import re
import threading
from dataclasses import dataclass
from typing import Any

from .. import engine, store


class Helper:
    """The one thread a table capture sends to Redis in while its own thread works in Postgres, made on first use.
    Shared by the capture and its passes over many sources without either referring to the other: a capture in a
    reference cycle would outlive its last use until a full garbage collection, its session (and the stream locks
    it holds) with it (``Streamer(settings).drain()`` in a script, then another streamer)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def get(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=self.name)
        return self._pool

    def shutdown(self) -> None:
        """Stop the thread (idle: a pass waits for its sends before it returns or raises)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


@dataclass(frozen=True, slots=True)
class Send:
    """One claim's payload for one target stream, from position ``first``."""

    claim: int
    target: str
    first: int
    payload: engine.Packed


@dataclass(frozen=True, slots=True)
class Sending:
    """A batch's pieces being sent in the helper thread: each piece's appended entries (or the error that ended the
    sending) arrive in ``confirmed``; ``stop`` ends it before the next piece."""

    future: concurrent.futures.Future[None]
    confirmed: queue.SimpleQueue[Any]
    stop: threading.Event

    def end(self) -> BaseException | None:
        """Stop the sending after its piece in flight and wait for it; return what ended it in error (None: nothing,
        or it was never begun). What the helper put in ``confirmed`` is dropped: an error left there would hold the
        helper's frame, which holds the queue, a cycle that kept a dropped streamer (its sessions) alive."""
        self.stop.set()
        self.future.cancel()
        concurrent.futures.wait([self.future])
        while True:
            try:
                self.confirmed.get_nowait()
            except queue.Empty:
                break
        return None if self.future.cancelled() else self.future.exception()


@dataclass(slots=True)
class Ready:
    """A saved batch made ready to send: its sends from their positions, in claim order, cut in pieces; ``sending``
    once handed to the helper thread (the next share's batch is, while the batch before it is still deleted)."""

    claims: list[store.SourceClaim]
    sends: list[Send]
    last: dict[str, int]  # target -> its last position in the batch
    identity: store.ProducerIdentity
    pieces: list[list[Send]]
    began: float
    sending: Sending | None = None


# A batch of at least two batches' worth of records is sent in up to this many pieces (whole claims, in claim order,
# one pipelined round trip each, in the helper thread), and the claims of each piece Redis confirmed are deleted here
# while Redis appends the next: the delete no longer waits for the whole send (Postgres and Redis each have a core),
# as one stream's batches overlap (capture_table). More pieces are more round trips and statements for less overlap.
PIECES = 4


def pieces_of(claims: list[store.SourceClaim], sends: list[Send], batch_size: int) -> list[list[Send]]:
    """``sends`` (in claim order) cut into up to :data:`PIECES` pieces of about equal records, a claim's sends never
    split; one piece when the batch holds less than two batches' worth."""
    records = sum(c.count for c in claims)
    count = min(PIECES, records // batch_size)
    if count < 2:
        return [sends]
    share = -(-records // count)
    pieces: list[list[Send]] = [[]]
    filled = 0
    for i, send in enumerate(sends):
        starts_claim = i == 0 or sends[i - 1].claim != send.claim
        if starts_claim and filled >= share and pieces[-1]:
            pieces.append([])
            filled = 0
        pieces[-1].append(send)
        filled += send.payload.count
    return pieces


# A partition's target is named ``<stream>.p<k>`` (routing.partition_stream), which a stream's own name may also be
_PARTITION_SUFFIXES = re.compile(r"(\.p[0-9]+)+$")


def root_of(stream: str) -> str:
    """The stream whose targets ``stream``'s may share: its name without partition suffixes (``x`` for ``x.p1``)."""
    # most names have no ".p" at all: the regular expression over ten thousand streams cost a pass 13 ms
    return _PARTITION_SUFFIXES.sub("", stream) if ".p" in stream else stream
