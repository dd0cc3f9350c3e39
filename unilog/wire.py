"""Redis key names and the RESP encoding of a batch: pure functions, no commands (those are in ``engine``)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# (data, action, object, created ms, key or None[, traceparent, tracestate[, record type]]): the rest is optional
PublishRow = tuple[Any, ...]


@dataclass(slots=True)  # not frozen: a batch over many streams makes one per stream, and frozen costs more each
class Packed:
    """A batch ready to publish: ``count`` records' arguments to PUBLISH_LUA (data, action, object, created ms, key
    or ''; five per record, in position order), already encoded as RESP bulk strings. The streamer gets these
    bytes straight from Postgres (:func:`unilog.store.fetch_packed`), so no record passes through Python objects.
    Read-only by contract."""

    count: int
    body: bytes
    stride: int = 5  # arguments per record: 7 when the batch carries trace context (traceparent, tracestate), 8
    # when it carries record types (traceparent, tracestate, type; each maybe empty)


def stride_of(rows: Sequence[PublishRow]) -> int:
    """The arguments per record a batch of ``rows`` needs: 8 if any is typed, 7 if any is traced, else 5."""
    if any(len(row) > 7 and row[7] for row in rows):
        return 8
    return 7 if any(len(row) > 5 and row[5] for row in rows) else 5


def pack_rows(rows: Sequence[PublishRow]) -> Packed:
    """Encode rows the way :func:`unilog.store.fetch_packed` does."""
    stride = stride_of(rows)
    if stride == 8:
        return Packed(len(rows), b"".join(pack_record(row, 8) for row in rows), 8)
    if stride == 7:
        return Packed(
            len(rows),
            b"".join(
                _bulk(
                    [
                        _b(row[0]),
                        _b(row[1]),
                        _b(row[2]),
                        b"%d" % row[3],
                        _b(row[4] or ""),
                        _b(row[5] or ""),
                        _b(row[6] or ""),
                    ]
                )
                for row in rows
            ),
            7,
        )
    return Packed(
        len(rows),
        b"".join(
            _bulk([_b(data), _b(action), _b(obj), b"%d" % created, _b(key or "")])
            for data, action, obj, created, key, *_trace in rows
        ),
    )


EMPTY = b"$0\r\n\r\n"  # an empty argument: what pads a record's tail to its batch's stride


def pack_record(row: PublishRow, stride: int) -> bytes:
    """One record's arguments as :func:`pack_rows` encodes them in a batch of ``stride`` arguments per record."""
    data, action, obj, created, key = row[:5]
    head = [_b(data), _b(action), _b(obj), b"%d" % created, _b(key or "")]
    if stride >= 7:
        head += [_b(row[5] or ""), _b(row[6] or "")]
    if stride == 8:
        head.append(_b((row[7] if len(row) > 7 else None) or ""))
    return _bulk(head)


def pad_tail(tail: bytes, stride: int) -> bytes:
    """A record message's tail (nothing, its trace context's two arguments, or those and its type: three) padded
    with empty arguments to ``stride - 5``. Only the arguments' count is read, never a record's data."""
    want = stride - 5
    have = tail_arguments(tail) if tail else 0
    return tail + EMPTY * (want - have) if have < want else tail


def tail_arguments(encoded: bytes) -> int:
    """How many RESP bulk strings ``encoded`` holds, read by their lengths (a value may hold CR LF)."""
    count = pos = 0
    while pos < len(encoded):
        end = encoded.index(b"\r\n", pos)
        pos = end + 2 + int(encoded[pos + 1 : end]) + 2
        count += 1
    return count


def nth_bulk(body: bytes, n: int) -> str | None:
    """The ``n``-th (from 0) bulk string of an encoded record, as text, or None if it has fewer."""
    pos = 0
    try:
        for field in range(n + 1):
            end = body.index(b"\r\n", pos)
            size = int(body[pos + 1 : end])
            if field == n:
                return body[end + 2 : end + 2 + size].decode()
            pos = end + 2 + size + 2
    except ValueError:
        return None
    return None


def first_created_ms(body: bytes) -> int | None:
    """The ``created`` ms of the first record of a :class:`Packed` body (its fourth bulk string), or None."""
    text = nth_bulk(body, 3)
    return int(text) if text and text.isdigit() else None


# Key layout. Every key of a stream carries the stream's name as a hash tag, ``{<stream>}``: Redis Cluster hashes
# only the tag, which is the same text as the stream's own key, so a stream, its high-water mark, its dead letters
# and its bookkeeping share one slot (the publish script and the MULTI blocks touch them together), while the
# partitions of a partitioned stream, each named ``<stream>.p<i>``, hash to different slots and spread over the
# shards. A single Redis uses the same layout. Stream names cannot contain braces (validate_stream_name).
# LEGACY_KEYS are the names before that layout: `unilog stream relayout` renames them (tested).


def meta_key(stream: str) -> str:
    """The hash of a stream's settings (its partition count)."""
    return f"unilog:meta:{{{stream}}}"


def dlq_key(stream: str) -> str:
    """The dead-letter stream of ``stream``."""
    return f"unilog:dlq:{{{stream}}}"


def attempts_key(stream: str, group: str) -> str:
    """The hash counting failed attempts per entry for ``group``."""
    return f"unilog:attempts:{{{stream}}}:{group}"


def registry_key(stream: str) -> str:
    """The hash of registered consumers' checkpoints on ``stream``."""
    return f"unilog:consumers:{{{stream}}}"


def workers_key(stream: str, consumer: str) -> str:
    """The sorted set of a partitioned consumer's live workers, scored by their last heartbeat."""
    return f"unilog:workers:{{{stream}}}:{consumer}"


def hwm_key(stream: str) -> str:
    """The hash holding each producer's high-water position on ``stream``."""
    return f"unilog:hwm:{{{stream}}}"


def legacy_keys(stream: str) -> dict[str, str]:
    """The keys of ``stream`` in the layout before hash tags, and their names now (groups' and workers' keys, which
    carry a second name, are found by pattern: see :func:`legacy_patterns`)."""
    return {
        f"unilog:meta:{stream}": meta_key(stream),
        f"{stream}:dlq": dlq_key(stream),
        f"unilog:consumers:{stream}": registry_key(stream),
        f"unilog:hwm:{stream}": hwm_key(stream),
    }


def legacy_patterns(stream: str) -> dict[str, tuple[str, str]]:
    """SCAN patterns of ``stream``'s legacy per-group and per-consumer keys: pattern -> (old prefix, new prefix)."""
    return {
        f"unilog:attempts:{stream}:*": (f"unilog:attempts:{stream}:", f"unilog:attempts:{{{stream}}}:"),
        f"unilog:workers:{stream}:*": (f"unilog:workers:{stream}:", f"unilog:workers:{{{stream}}}:"),
    }


def id_tuple(entry_id: str) -> tuple[int, int]:
    """A stream id as a comparable (ms, seq) tuple."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _b(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def _pack(args: list[bytes], more: int = 0) -> bytes:
    """Encode one command in RESP (its head only, when ``more`` arguments follow already encoded)."""
    return b"*%d\r\n" % (len(args) + more) + _bulk(args)


def _bulk(values: list[bytes]) -> bytes:
    """RESP bulk strings, back to back."""
    return b"".join(b"$%d\r\n%b\r\n" % (len(v), v) for v in values)


def to_str(value: Any) -> str:
    """Decode a Redis reply value (bytes) to ``str``."""
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)


def letter_fields(
    fields: Mapping[bytes, bytes], entry_id: bytes, *, group: str, consumer: str, attempts: int, error: str
) -> dict[bytes, bytes]:
    """A dead letter: the entry's own fields and why it was moved (``group`` empty for a checkpoint consumer)."""
    return {
        **fields,
        b"dlq_original_id": entry_id,
        b"dlq_group": group.encode(),
        b"dlq_consumer": consumer.encode(),
        b"dlq_attempts": str(attempts).encode(),
        b"dlq_error": error.encode(errors="replace")[:4000],
        b"dlq_at": str(int(time.time() * 1000)).encode(),
    }


def parse_autoclaim(reply: Any) -> tuple[list[tuple[bytes, dict[bytes, bytes]]], list[bytes], bool]:
    """An ``XAUTOCLAIM`` reply: (claimed entries, ids Redis 7 reports deleted, whether Redis 6.2 sent nils in place
    of deleted entries, whose ids must then be looked up)."""
    entries: list[tuple[bytes, dict[bytes, bytes]]] = []
    deleted: list[bytes] = [bytes(d) for d in reply[2]] if len(reply) > 2 else []
    anonymous = False
    for item in reply[1]:
        if item is None or item[0] is None or item[1] is None:
            anonymous = True
            continue
        eid, raw = item[0], item[1]
        fields = raw if isinstance(raw, dict) else dict(zip(raw[::2], raw[1::2], strict=True))
        entries.append((eid, fields))
    return entries, deleted, anonymous
