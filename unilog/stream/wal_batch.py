"""The shape of a WAL-mode batch (:mod:`unilog.stream.capture_wal`): whether it is spread over many streams, the cap
of a deep batch's records per stream, its staged rows' ids and its records by target stream. Pure functions of the
decoded rows, on every batch's path: the per-row work is left to C where it can be (over ten thousand streams, a
batch is 50,000 rows)."""

from __future__ import annotations

from collections import Counter
from operator import itemgetter

from ..store.pgoutput import WalRow
from .publisher import Publisher

SPREAD = 8  # a batch is spread when it has fewer than this many records per stream, on 100 streams or more
_STREAM, _ROW = itemgetter(0), itemgetter(1)  # a WalRow's stream name, and its staged row (None: a message)


def spread(streams: int, records: int) -> bool:
    """Whether a batch of ``records`` over ``streams`` streams is spread (taken deeper: see
    :data:`unilog.stream.capture_wal.WAL_DEPTH`)."""
    return streams >= 100 and streams * SPREAD > records


class Caps:
    """A deep batch's cap of ``cap`` records per stream (``default``: where a row staged with no stream goes), over
    the ``rows`` taken so far. Counted row by row only once a stream could reach it: until then each part's most
    records of one stream are summed (counted in C), a bound on any stream's count, which over a spread backlog grows
    by one a transaction (counting each of 50,000 rows was a tenth of a deep batch's preparation)."""

    def __init__(self, cap: int, default: str, rows: list[WalRow]) -> None:
        self.cap, self.default, self.rows = cap, default, rows
        self.bound = 0
        self.counts: Counter[str] | None = None

    def capped(self, part: tuple[WalRow, ...]) -> tuple[WalRow, ...]:
        """The rows of ``part`` before the first that would give its stream more than ``cap`` records in the batch
        (the rows returned are counted in)."""
        counts = self.counts
        if counts is None:
            per = Counter(map(_STREAM, part))
            most = max(max(per.values()), per[""] + per[self.default])
            if self.bound + most <= self.cap:
                self.bound += most
                return part
            counts = self.counts = Counter(map(_STREAM, self.rows))
            counts[self.default] += counts.pop("", 0)
        cap, default = self.cap, self.default
        for i, row in enumerate(part):
            stream = row[0] or default  # a row staged with no stream goes to the default one, by its name too
            n = counts[stream] + 1
            if n > cap:
                return part[:i]
            counts[stream] = n
        return part


def staged_ids(records: list[WalRow]) -> list[int]:
    """The ids of the staged rows among ``records`` (the messages, nearly all of a WAL batch, passed over in C)."""
    return [row[0] for row in filter(None, map(_ROW, records))]


def records_by_stream(publisher: Publisher, records: list[WalRow]) -> dict[str, list[WalRow]]:
    """A batch's records by target stream, in batch order (one stream, the usual case, found without a loop here)."""
    sources = set(map(_STREAM, records))
    if len(sources) == 1:
        return {publisher.stream_of(sources.pop()): records}
    by_stream: dict[str, list[WalRow]] = {}
    default = publisher.stream_of("")  # inline: a call per record was a tenth of a batch over ten thousand streams
    for r in records:
        stream = r[0] or default
        rows = by_stream.get(stream)
        if rows is None:
            by_stream[stream] = [r]
        else:
            rows.append(r)
    return by_stream
