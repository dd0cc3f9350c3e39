"""Decoding Postgres's built-in ``pgoutput`` logical replication messages (protocol version 1) into staged rows.

Only what WAL capture needs: ``B`` (begin), ``R`` (relation: the column names), ``I`` (insert), ``M`` (a logical
message: a record that ``unilog_stage`` wrote with ``pg_logical_emit_message``, or a mode switch's marker) and ``C``
(commit). Other messages (origin, type, and the update/delete/truncate a publication limited to inserts never sends)
are skipped. Transactions arrive whole and in commit order, each ``C`` carrying the LSN just past its commit, which is
what a streamer confirms once the transaction's records are published. Protocol version 1 without ``streaming``
sends a transaction only once it has committed, so its rows may be handed on before its ``C`` is read: a decoder
with ``part_rows`` returns a large transaction in parts of that many rows, and holds no more than one part. Pure
functions and a small state machine: no I/O, tested byte for byte against a real server's output.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from datetime import datetime

from .claims import StagedRow

STAGING_TABLE = "staged_log_records"
MESSAGE_PREFIX = "unilog"  # a record (see unilog_stage, migrations unilog_0009 and unilog_0010)
_RECORD = MESSAGE_PREFIX.encode() + b"\0"
_NONE_YET = "\0"  # no stream is named so (Postgres text holds no NUL)
_RECORD_AT = 10 + len(_RECORD) + 4  # a record message's content: after kind, flags, LSN, the prefix and its length
MARKER_PREFIX = "unilog-switch"  # a mode switch's marker: every record message commits before it (see store.wal)
_REQUIRED = ("id", "stream", "action", "object", "data", "key", "created_at", "traceparent", "tracestate")
_TYPE = "record_type"
_I16, _I32, _I64 = struct.Struct("!h"), struct.Struct("!i"), struct.Struct("!q")


class DecodeError(ValueError):
    """A pgoutput message this decoder cannot read (a protocol it does not speak, or a table it does not know)."""


# One staged record read from the WAL: ``(stream, row, mark, body, trace)``, its target ``stream`` column first. A row
# of staged_log_records has ``row`` (as the streamer publishes it; its id is ``row[0]``) and an empty body and trace.
# A record written as a logical message has no row: ``body`` holds its five publish arguments already encoded as
# RESP bulk strings (as unilog_stage wrote them), ``trace`` its tail: the trace context's two, or those two and its
# type for a typed record (three), or nothing, and ``mark`` is
# (its transaction's commit LSN, its place among the transaction's messages): the order the WAL delivers them in,
# which a streamer saves with its positions to skip what it already published. A plain tuple, not a class: a
# streamer holds thousands at a time, and the cyclic collector stops tracking a tuple of strings, bytes and numbers
# at its first look, where it walks a class instance in every full collection (a fifth of a WAL streamer's CPU).
WalRow = tuple[str, "StagedRow | None", "tuple[int, int] | None", bytes, bytes]


@dataclass(frozen=True, slots=True)
class WalTransaction:
    """A committed transaction's staged records, in insert order, or one part of them: ``end_lsn`` is the LSN just
    past its commit on the transaction's last (or only) part, None on the parts before it."""

    xid: int
    end_lsn: int | None
    rows: tuple[WalRow, ...]
    marker: str | None = None  # a mode switch's marker committed in this transaction
    plain: str | None = None  # the one stream of all its rows when each is an untraced message (None: not so)


@dataclass
class Decoder:
    """Feeds on pgoutput messages one at a time and returns each transaction once its commit arrives; with
    ``part_rows``, a transaction of more rows comes in parts of ``part_rows`` rows (the last one at its commit)."""

    relations: dict[int, tuple[int, ...] | None] = field(default_factory=dict)  # relid -> column indexes, or None
    part_rows: int | None = None  # None: each transaction whole, however large
    _xid: int = 0
    _final_lsn: int = 0  # the commit LSN of the transaction being read (from its begin message)
    _messages: int = 0  # record messages of the transaction read so far
    _marker: str | None = None
    _rows: list[WalRow] = field(default_factory=list)
    _plain: str | None = _NONE_YET  # what WalTransaction.plain says of _rows (_NONE_YET: no rows yet)
    in_transaction: bool = False  # a begin was read and its commit not yet

    @property
    def open_rows(self) -> int:
        """Rows of the transaction being read that no returned part holds yet."""
        return len(self._rows)

    def feed(self, message: bytes) -> WalTransaction | None:
        """Take one message; return the transaction it completes (a ``C``) or the part it fills up, else None."""
        kind = message[:1]
        if kind == b"I":
            return self._insert(message)
        if kind == b"M":
            return self._message(message)
        if kind == b"B":
            self._final_lsn = _I64.unpack_from(message, 1)[0]
            self._xid, self._rows = _I32.unpack_from(message, 17)[0] & 0xFFFFFFFF, []
            self._messages, self._marker, self._plain = 0, None, _NONE_YET
            self.in_transaction = True
        elif kind == b"C":
            end_lsn = _I64.unpack_from(message, 10)[0]
            done = WalTransaction(self._xid, end_lsn, tuple(self._rows), self._marker, _plain(self._plain))
            self._rows, self.in_transaction = [], False
            return done
        elif kind == b"R":
            self._relation(message)
        return None

    def _message(self, message: bytes) -> WalTransaction | None:
        """Decode a logical message: unilog's record messages become records of the transaction, a switch marker is
        noted on it; other prefixes, and messages outside a transaction (``pg_logical_emit_message(false, ...)``:
        never unilog's), are not ours. A record message is ``stream LF trace-length LF body trace`` (the length
        written ``t<n>`` when the tail holds a type)."""
        if not self.in_transaction or not message[1] & 1:
            return None
        if message.startswith(_RECORD, 10):  # after the flags byte and the message's LSN
            return self._record(message, 10 + len(_RECORD))
        prefix, pos = _cstring(message, 10)
        if prefix == MARKER_PREFIX:
            self._marker = message[pos + 4 :].decode()
            return None
        return None

    def _record(self, message: bytes, pos: int) -> WalTransaction | None:
        return self._add(self._decode_record(message, pos + 4), messages=1)

    def _decode_record(self, message: bytes, start: int) -> WalRow:
        """A record message's content (from ``start``): ``stream LF trace-length LF body trace``."""
        try:
            first = message.index(b"\n", start)
            second = message.index(b"\n", first + 1)
            size = message[first + 1 : second]
            trace_end = len(message) - int(size[1:] if size[:1] == b"t" else size)  # t<n>: a typed record's tail
        except ValueError:
            where = f"{self._final_lsn >> 32:X}/{self._final_lsn & 0xFFFFFFFF:X}"
            raise DecodeError(f"a unilog message in the WAL at {where} has a header unilog cannot read") from None
        stream = message[start:first].decode() if first > start else ""
        return (stream, None, (self._final_lsn, self._messages), message[second + 1 : trace_end], message[trace_end:])

    def feed_all(self, messages: list[bytes]) -> list[WalTransaction]:
        """:meth:`feed` each message; return the transactions and parts they complete, in order. Record messages,
        nearly all of a busy slot's stream, take a short path (one without a trace context shorter still: its
        header ``stream LF 0 LF`` is found with one search)."""
        done: list[WalTransaction] = []
        record_at = _RECORD_AT
        part_rows = self.part_rows if self.part_rows is not None else 1 << 62
        rows, ordinal, lsn, plain = self._rows, self._messages, self._final_lsn, self._plain
        for message in messages:
            if message[0] == 77 and message[1] & 1 and self.in_transaction and message.startswith(_RECORD, 10):
                if len(rows) >= part_rows:
                    done.append(WalTransaction(self._xid, None, tuple(rows), plain=_plain(plain)))
                    rows, plain = [], _NONE_YET
                    self._rows = rows
                first = message.find(b"\n", record_at)
                if message.startswith(b"0\n", first + 1):  # no trace context
                    stream = message[record_at:first].decode() if first > record_at else ""
                    rows.append((stream, None, (lsn, ordinal), message[first + 3 :], b""))
                    if stream != plain:
                        plain = stream if plain == _NONE_YET else None
                else:
                    self._messages = ordinal
                    rows.append(self._decode_record(message, record_at))
                    plain = None
                ordinal += 1
                continue
            self._messages, self._plain = ordinal, plain
            completed = self.feed(message)
            rows, ordinal, lsn, plain = self._rows, self._messages, self._final_lsn, self._plain
            if completed is not None:
                done.append(completed)
        self._messages, self._plain = ordinal, plain
        return done

    def _relation(self, message: bytes) -> None:
        relid = _I32.unpack_from(message, 1)[0]
        pos = 5
        _namespace, pos = _cstring(message, pos)
        name, pos = _cstring(message, pos)
        pos += 1  # replica identity setting
        ncols = _I16.unpack_from(message, pos)[0]
        pos += 2
        columns: list[str] = []
        for _ in range(ncols):
            column, pos = _cstring(message, pos + 1)  # after the flags byte
            columns.append(column)
            pos += 8  # type oid, type modifier
        if name != STAGING_TABLE:
            self.relations[relid] = None  # another table in the publication (not ours): its rows are ignored
            return
        missing = [c for c in _REQUIRED if c not in columns]
        if missing:
            raise DecodeError(f"{STAGING_TABLE} in the WAL lacks columns {missing}: run `unilog migrate`")
        # record_type came with unilog_0013: rows written before it (still in the WAL) have none, and are untyped
        typed = columns.index(_TYPE) if _TYPE in columns else len(columns)
        self.relations[relid] = (*(columns.index(c) for c in _REQUIRED), typed)

    def _insert(self, message: bytes) -> WalTransaction | None:
        """Decode an insert; return the part it follows when that part is full (a part goes only once a row comes
        after it: the commit's part is then never empty, unless the whole transaction staged nothing)."""
        relid = _I32.unpack_from(message, 1)[0]
        if relid not in self.relations:
            raise DecodeError(f"insert into relation {relid} before its relation message")
        indexes = self.relations[relid]
        if indexes is None:
            return None
        values = _tuple_data(message, 6)  # after relid and the 'N' marker
        values.append(None)  # what a row without record_type (staged before unilog_0013) reads there
        id_, stream, action, obj, data, key, created, traceparent, tracestate, typed = (values[i] for i in indexes)
        if id_ is None or action is None or obj is None or data is None or created is None:
            raise DecodeError(f"a staged row in the WAL has a NULL where unilog needs a value (id {id_})")
        row: StagedRow = (int(id_), action, obj, data, key, created_ms(created), traceparent, tracestate, typed)
        return self._add((stream or "", row, None, b"", b""))

    def _add(self, row: WalRow, messages: int = 0) -> WalTransaction | None:
        """Append a decoded record; return the part it follows when that part is full."""
        part = None
        if self.part_rows is not None and len(self._rows) >= self.part_rows:
            part, self._rows = WalTransaction(self._xid, None, tuple(self._rows), plain=_plain(self._plain)), []
        self._rows.append(row)
        self._plain = None  # a row, or a message fed alone: not known to be plain (only feed_all's short path is)
        self._messages += messages
        return part


def _plain(state: str | None) -> str | None:
    return None if state == _NONE_YET else state


def _cstring(buf: bytes, pos: int) -> tuple[str, int]:
    end = buf.index(b"\0", pos)
    return buf[pos:end].decode(), end + 1


def _tuple_data(buf: bytes, pos: int) -> list[str | None]:
    """A TupleData's columns as text (NULL as None); inserts never carry unchanged-TOAST markers."""
    ncols = _I16.unpack_from(buf, pos)[0]
    pos += 2
    values: list[str | None] = []
    for _ in range(ncols):
        kind = buf[pos : pos + 1]
        pos += 1
        if kind == b"t":
            size = _I32.unpack_from(buf, pos)[0]
            values.append(buf[pos + 4 : pos + 4 + size].decode())
            pos += 4 + size
        elif kind == b"n":
            values.append(None)
        else:
            raise DecodeError(f"unexpected column kind {kind!r} in an insert (only text format is requested)")
    return values


def created_ms(text: str) -> int:
    """Milliseconds since the epoch of a ``timestamptz`` in ISO output (the replication session uses UTC and ISO)."""
    return int(datetime.fromisoformat(text).timestamp() * 1000)
