"""The stream engine adapter: every Redis command unilog sends lives here.

The client is configured deliberately: redis-py's default retries a command that timed out, and a retried ``XADD``
whose first attempt did reach Redis appends the entry twice. unilog turns those retries off and retries whole
batches itself, where the outcome is known and deduplicated by position.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from ..errors import ConfigurationError, WrongKeyType
from ..wire import (  # noqa: F401 - the adapter's names, used as engine.X across the library
    Packed,
    PublishRow,
    _b,
    _pack,
    attempts_key,
    dlq_key,
    first_created_ms,
    hwm_key,
    id_tuple,
    letter_fields,
    meta_key,
    pack_rows,
    parse_autoclaim,
    registry_key,
    to_str,
    workers_key,
)
from .bulk import no_gc, raw_pages  # noqa: F401 - the adapter's names, used as engine.X across the library
from .refusals import FATAL, connect, fatal, hint, no_permission, ping, read_only  # noqa: F401 - connecting and classifying refusals

Fields = Mapping[str, Any]
Entry = tuple[bytes, dict[bytes, bytes]]
# What a failure of Redis itself raises (other modules name it here instead of importing redis-py)
RedisError = redis.RedisError

PAGE = 10_000  # entries per XRANGE page: large enough to amortize the round trip, small enough to bound memory


@dataclass(frozen=True)
class StreamInfo:
    """A stream's length and the ids of its first and last entries (None when empty or missing)."""

    length: int
    first_id: str | None
    last_id: str | None


# Appends a batch only past this producer's high-water mark on the stream, so a batch re-sent after a crash, a
# timeout with unknown outcome or a retry is not appended twice. Positions are (epoch, seq); seq is computed here as
# first_seq + i, so each entry costs five arguments (and no per-entry Lua table: Redis CPU is the drain's limit; a
# batch that carries trace context has seven, traceparent and tracestate, and builds its fields in a table). The
# mark lives in a hash beside the stream; if the stream key is gone (deleted, flushed) the mark is ignored, so a
# missing stream can never swallow records as "duplicates".
PUBLISH_LUA = """
local producer, epoch, first, stride = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5])
local n = (#ARGV - 5) / stride
local skip, gap = 0, -1
if ARGV[4] == '1' and redis.call('EXISTS', KEYS[1]) == 1 then
  local mark = redis.call('HGET', KEYS[2], producer)
  if mark then
    local sep = string.find(mark, ':', 1, true)
    local me, ms = tonumber(string.sub(mark, 1, sep - 1)), tonumber(string.sub(mark, sep + 1))
    if me > epoch then
      return redis.error_reply('UNILOG_STALE_EPOCH producer ' .. producer .. ' is at epoch ' .. me .. ', not ' .. epoch)
    elseif me == epoch then
      skip = ms - first + 1
      if skip < 0 then gap = ms; skip = 0 end
      if skip > n then skip = n end
    end
  end
end
local first_id, last_id = false, false
for i = skip, n - 1 do
  local b = 5 + i * stride
  if stride == 7 then
    local key, tp, ts = ARGV[b + 5], ARGV[b + 6], ARGV[b + 7]
    if key == '' and ts == '' and tp ~= '' then
      last_id = redis.call('XADD', KEYS[1], '*', 'data', ARGV[b + 1], 'action', ARGV[b + 2], 'object', ARGV[b + 3],
                           'producer', producer, 'epoch', ARGV[2], 'seq', first + i, 'created', ARGV[b + 4],
                           'traceparent', tp)
    elseif ts == '' and tp ~= '' then
      last_id = redis.call('XADD', KEYS[1], '*', 'data', ARGV[b + 1], 'action', ARGV[b + 2], 'object', ARGV[b + 3],
                           'producer', producer, 'epoch', ARGV[2], 'seq', first + i, 'created', ARGV[b + 4],
                           'key', key, 'traceparent', tp)
    else  -- the rare ones (a tracestate, a record without a traceparent in a traced batch): fields in a table
      local f = {'data', ARGV[b + 1], 'action', ARGV[b + 2], 'object', ARGV[b + 3], 'producer', producer,
                 'epoch', ARGV[2], 'seq', first + i, 'created', ARGV[b + 4]}
      if key ~= '' then f[#f + 1] = 'key'; f[#f + 1] = key end
      if tp ~= '' then f[#f + 1] = 'traceparent'; f[#f + 1] = tp end
      if ts ~= '' then f[#f + 1] = 'tracestate'; f[#f + 1] = ts end
      last_id = redis.call('XADD', KEYS[1], '*', unpack(f))
    end
  elseif ARGV[b + 5] == '' then
    last_id = redis.call('XADD', KEYS[1], '*', 'data', ARGV[b + 1], 'action', ARGV[b + 2], 'object', ARGV[b + 3],
                         'producer', producer, 'epoch', ARGV[2], 'seq', first + i, 'created', ARGV[b + 4])
  else
    last_id = redis.call('XADD', KEYS[1], '*', 'data', ARGV[b + 1], 'action', ARGV[b + 2], 'object', ARGV[b + 3],
                         'producer', producer, 'epoch', ARGV[2], 'seq', first + i, 'created', ARGV[b + 4],
                         'key', ARGV[b + 5])
  end
  if not first_id then first_id = last_id end
end
if n > skip then
  redis.call('HSET', KEYS[2], producer, ARGV[2] .. ':' .. tostring(first + n - 1))
end
return {n - skip, skip, gap, first_id, last_id}
"""


@dataclass(frozen=True)
class PublishResult:
    """What a publish did: entries appended, entries skipped as already present, and the ids appended.

    ``gap_after`` is the stream's high-water seq when it was *below* the batch's first seq minus one: positions in
    between were confirmed once and are missing now, so Redis lost data (None when there is no gap).
    """

    appended: int
    skipped: int
    first_id: str | None
    last_id: str | None
    gap_after: int | None = None
    replicas: int = 0


# (data JSON, action, object, created ms, key or None), in position order
def type_checked(stream: str) -> tuple[str, str]:
    """The keys whose types a ``WRONGTYPE`` refusal on ``stream`` is explained by."""
    return stream, hwm_key(stream)


def refusal(exc: redis.ResponseError, stream: str, kinds: Mapping[str, str]) -> Exception | None:
    """The one-line error for a refusal no retry can fix, or None: ``kinds`` are the types of the keys of
    :func:`type_checked` (read by the caller, sync or asyncio, only for a ``WRONGTYPE`` refusal)."""
    text = str(exc)
    for key, wanted in zip(type_checked(stream), ("stream", "hash"), strict=True):
        kind = kinds.get(key, "none")
        if kind not in (wanted, "none"):
            return WrongKeyType(
                f"the Redis key {key!r} holds a {kind}, not a {wanted}: another application uses that "
                "name; use another stream name (UNILOG_STREAM, emit(stream=...)) or remove that key"
            )
    if "READONLY" in text:  # inside a script the reply is a plain error quoting it
        return read_only(text.rpartition("-")[2] or text)
    script_refused = "user executing the script can't" in text  # an ACL refusal inside the publish script
    if "NOPERM" in text or script_refused or isinstance(exc, redis.exceptions.NoPermissionError):
        return no_permission(text, stream)
    return None


class RedisStreams:
    """Publishing to and reading from Redis Streams."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._sha = hashlib.sha1(PUBLISH_LUA.encode()).hexdigest()

    def publish(
        self,
        stream: str,
        producer: str,
        epoch: int,
        first_seq: int,
        rows: Sequence[PublishRow] | Packed,
        *,
        dedupe: bool = True,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
    ) -> PublishResult:
        """Append ``rows`` as positions ``first_seq, first_seq + 1, ...`` in one round trip, atomically.

        With ``dedupe`` (the default) positions at or below the producer's high-water mark are skipped, which makes a
        re-send idempotent; ``dedupe=False`` appends everything (the double-send fault uses it so consumers' own
        deduplication stays tested). Raises a redis error when Redis refused the batch (nothing was appended).
        With ``wait_replicas`` > 0, ``WAIT`` for that many replicas on the same connection and report how many
        acknowledged in ``replicas``.
        """
        batch = rows if isinstance(rows, Packed) else pack_rows(rows)
        head = [producer, str(epoch), str(first_seq), "1" if dedupe else "0", str(batch.stride)]
        with self.explained(stream):
            reply, replicas = self._evalsha(stream, [_b(a) for a in head], batch, wait_replicas, wait_timeout_ms)
        appended, skipped, gap, first_id, last_id = reply
        return PublishResult(
            replicas=replicas,
            appended=int(appended),
            skipped=int(skipped),
            first_id=to_str(first_id) if first_id else None,
            last_id=to_str(last_id) if last_id else None,
            gap_after=None if int(gap) < 0 else int(gap),
        )

    def _evalsha(
        self, stream: str, head: list[bytes], batch: Packed, wait_replicas: int, wait_timeout_ms: int
    ) -> tuple[Any, int]:
        """EVALSHA with the command packed here: redis-py's per-argument packing dominated the streamer's profile.

        ``WAIT`` must follow the write on the same connection, so it is sent in the same packet.
        """
        keys = [_b(stream), _b(hwm_key(stream))]
        args = [b"EVALSHA", self._sha.encode(), b"2", *keys, *head]
        command = _pack(args, more=batch.stride * batch.count)  # the batch's bulk strings follow
        for attempt in (1, 2):
            packed = [command, batch.body]
            if wait_replicas:
                packed.append(_pack([b"WAIT", b"%d" % wait_replicas, b"%d" % wait_timeout_ms]))
            pool = self._pool(stream)
            conn = pool.get_connection()
            try:
                conn.send_packed_command(packed, check_health=True)
                try:
                    reply = conn.read_response()
                finally:
                    replicas = int(conn.read_response()) if wait_replicas else 0
            except redis.exceptions.NoScriptError:
                if attempt == 2:
                    raise
                self.client.script_load(PUBLISH_LUA)
                continue
            except BaseException:
                conn.disconnect()  # the connection's state is unknown; never reuse it
                raise
            finally:
                pool.release(conn)
            return reply, replicas
        raise AssertionError("unreachable")

    def _pool(self, key: str) -> Any:
        """The connection pool of the node that serves ``key`` (the one pool of a single Redis)."""
        if isinstance(self.client, redis.RedisCluster):
            node = self.client.get_node_from_key(key)
            return self.client.get_redis_connection(node).connection_pool
        return self.client.connection_pool

    @contextlib.contextmanager
    def explained(self, stream: str) -> Iterator[None]:
        """Turn refusals no retry can fix into one-line errors naming the key and the fix: a key of another type at
        the stream's name (or its bookkeeping's), a Redis user without the permission (see :func:`refusal`)."""
        try:
            yield
        except redis.ResponseError as exc:
            kinds = {k: to_str(self.client.type(k)) for k in type_checked(stream)} if "WRONGTYPE" in str(exc) else {}
            raise refusal(exc, stream, kinds) or exc from None

    def high_water(self, stream: str, producer: str) -> tuple[int, int] | None:
        """The producer's high-water (epoch, seq) on ``stream``, or None."""
        mark = self.client.hget(hwm_key(stream), producer)
        if not mark:
            return None
        epoch, _, seq = to_str(mark).partition(":")
        return int(epoch), int(seq)

    # -- retention: consumers register their checkpoints; the stream is trimmed only behind the lowest -----------------

    def register(self, stream: str, consumer: str, last_id: str) -> None:
        """Record ``consumer``'s checkpoint on ``stream`` (after its commit), so trimming never passes it."""
        self.client.hset(registry_key(stream), consumer, last_id)

    def unregister(self, stream: str, consumer: str) -> bool:
        """Stop holding back trimming for ``consumer``; returns whether it was registered."""
        return bool(self.client.hdel(registry_key(stream), consumer))

    def registered(self, stream: str) -> dict[str, str]:
        """Registered consumers of ``stream`` and their checkpoints."""
        raw: Any = self.client.hgetall(registry_key(stream))
        return {to_str(k): to_str(v) for k, v in raw.items()}

    def trim(self, stream: str, *, min_id: str | None = None, max_len: int | None = None) -> int:
        """Trim entries below ``min_id`` (exactly) and/or beyond ``max_len`` (approximately); return entries removed."""
        removed = 0
        if min_id is not None:
            removed += int(self.client.xtrim(stream, minid=min_id, approximate=False))
        if max_len is not None:
            removed += int(self.client.xtrim(stream, maxlen=max_len, approximate=True))
        return removed

    def missing_stream(self, stream: str, limit: int = 10) -> list[str] | None:
        """None if ``stream`` exists; else the names of up to ``limit`` streams that do (to spot a typo)."""
        if self.client.exists(stream):
            return None
        names = self.client.scan_iter(match="*", count=1000, _type="STREAM")
        return sorted(to_str(n) for _, n in zip(range(limit), names, strict=False))

    def last_generated_id(self, stream: str) -> str | None:
        """The id of the last entry ever added to ``stream`` (kept across trims), or None if it does not exist."""
        try:
            info: Any = self.client.xinfo_stream(stream)
        except redis.ResponseError as exc:
            if "no such key" in str(exc).lower():
                return None
            raise
        return to_str(info["last-generated-id"])

    # -- partitions --------------------------------------------------------------------------------------------------

    def partitions(self, stream: str) -> int:
        """How many partitions ``stream`` is split into (1: not partitioned)."""
        value = self.client.hget(meta_key(stream), "partitions")
        return int(value) if value else 1

    def legacy_keys(self, stream: str) -> list[str]:
        """``stream``'s keys still in the layout before hash tags (see :mod:`unilog.engine.layout`)."""
        from .layout import legacy_keys

        return legacy_keys(self.client, stream)

    def relayout(self, stream: str) -> tuple[list[tuple[str, str]], list[str]]:
        """Rename ``stream``'s old-layout keys (see :mod:`unilog.engine.layout`)."""
        from .layout import relayout

        return relayout(self.client, stream)

    def set_partitions(self, stream: str, count: int) -> None:
        """Split ``stream`` into ``count`` partitions by key. A count, once set, cannot change: moving keys between
        partitions would break their order."""
        if not self.client.hsetnx(meta_key(stream), "partitions", count):
            current = self.partitions(stream)
            if current != count:
                raise ConfigurationError(
                    f"stream {stream!r} already has {current} partitions; changing it would reorder keys "
                    "(create a new stream instead)"
                )

    # -- consumer groups -----------------------------------------------------------------------------------------------

    def ensure_group(self, stream: str, group: str, start_id: str = "0") -> bool:
        """Create ``group`` on ``stream`` (and the stream) if missing; return whether it was created."""
        try:
            with self.explained(stream):
                self.client.xgroup_create(stream, group, id=start_id, mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" in str(exc):
                return False
            raise
        return True

    def read_group(
        self, stream: str, group: str, consumer: str, count: int, block_ms: int | None, after: str = ">"
    ) -> list[Entry]:
        """New entries for ``consumer`` in ``group`` (``XREADGROUP ... >``), waiting up to ``block_ms``; with
        ``after="0"``, the entries already delivered to ``consumer`` and not acknowledged (its own pending list)."""
        with self.explained(stream):
            reply: Any = self.client.xreadgroup(group, consumer, {stream: after}, count=count, block=block_ms)
        if not reply:
            return []
        return [(eid, fields) for eid, fields in reply[0][1] if fields is not None]

    def ack(self, stream: str, group: str, ids: Sequence[bytes | str]) -> int:
        """Acknowledge ``ids`` in ``group``."""
        return int(self.client.xack(stream, group, *ids)) if ids else 0

    def autoclaim(
        self, stream: str, group: str, consumer: str, min_idle_ms: int, count: int = 100, start: str = "0-0"
    ) -> tuple[str, list[Entry], list[bytes]]:
        """Claim entries idle for ``min_idle_ms`` (their worker died or is stuck): (next start, entries, deleted ids).

        Entries deleted from the stream while pending (trimmed) are returned as deleted ids: Redis 7 reports them
        separately; Redis 6.2 claims them but replies nil in their place, without their ids (redis-py shows a nil
        as ``None`` or ``(None, None)``, by version), so their ids are found among ``consumer``'s pending entries
        that are no longer in the stream.
        """
        reply: Any = self.client.execute_command(
            "XAUTOCLAIM", stream, group, consumer, min_idle_ms, start, "COUNT", count
        )
        next_start = to_str(reply[0])
        entries, deleted, anonymous = parse_autoclaim(reply)
        if anonymous:
            deleted += self._pending_but_gone(stream, group, consumer)
        return next_start, entries, deleted

    def _pending_but_gone(self, stream: str, group: str, consumer: str, page: int = 1000) -> list[bytes]:
        """Ids pending on ``consumer`` whose entries are no longer in the stream."""
        gone: list[bytes] = []
        low = "-"
        while True:
            pending: Any = self.client.xpending_range(stream, group, low, "+", page, consumername=consumer)
            ids = [p["message_id"] for p in pending]
            pipe = self.client.pipeline(transaction=False)
            for eid in ids:
                pipe.xrange(stream, eid, eid, count=1)
            gone += [bytes(eid) for eid, found in zip(ids, pipe.execute(), strict=True) if not found]
            if len(ids) < page:
                return gone
            low = "(" + to_str(ids[-1])

    def pending_summary(self, stream: str, group: str) -> dict[str, Any]:
        """Pending entries of ``group``: count, lowest and highest id, and count per consumer."""
        info: Any = self.client.xpending(stream, group)
        return {
            "count": int(info["pending"]),
            "min": to_str(info["min"]) if info["min"] else None,
            "max": to_str(info["max"]) if info["max"] else None,
            "consumers": {to_str(c["name"]): int(c["pending"]) for c in info["consumers"]},
        }

    def groups(self, stream: str) -> list[dict[str, Any]]:
        """``XINFO GROUPS`` for ``stream`` (empty if the stream does not exist), keys and values decoded."""
        try:
            raw: Any = self.client.xinfo_groups(stream)
        except redis.ResponseError as exc:
            if "no such key" in str(exc).lower():
                return []
            raise
        return [{to_str(k): (to_str(v) if isinstance(v, bytes) else v) for k, v in g.items()} for g in raw]

    def attempt(self, stream: str, group: str, entry_id: bytes | str) -> int:
        """Count one more failed attempt at ``entry_id`` in ``group``; return the total (kept in Redis, so it
        survives the worker)."""
        return int(self.client.hincrby(attempts_key(stream, group), to_str(entry_id), 1))

    def settle(self, stream: str, group: str, ids: Sequence[bytes | str]) -> int:
        """Acknowledge ``ids`` in ``group`` and forget their failed attempts, in one round trip; return acked."""
        if not ids:
            return 0
        pipe = self.client.pipeline(transaction=False)
        pipe.xack(stream, group, *ids)
        pipe.hdel(attempts_key(stream, group), *ids)
        acked, _ = pipe.execute()
        return int(acked)

    def dead_letter(
        self,
        stream: str,
        group: str,
        entry_id: bytes,
        fields: dict[bytes, bytes],
        *,
        error: str,
        consumer: str,
        attempts: int,
    ) -> str:
        """Move an entry to the stream's dead-letter stream with why, then acknowledge it (one MULTI)."""
        letter = letter_fields(fields, entry_id, group=group, consumer=consumer, attempts=attempts, error=error)
        pipe = self.client.pipeline(transaction=True)
        pipe.xadd(dlq_key(stream), letter)  # type: ignore[arg-type]
        pipe.xack(stream, group, entry_id)
        pipe.hdel(attempts_key(stream, group), to_str(entry_id))
        letter_id = pipe.execute()[0]
        return to_str(letter_id)

    def read(self, stream: str, after_id: str, count: int, block_ms: int | None) -> list[Entry]:
        """Up to ``count`` entries after ``after_id``, waiting up to ``block_ms`` if there are none yet."""
        with self.explained(stream):
            reply: Any = self.client.xread({stream: after_id}, count=count, block=block_ms)
        if not reply:
            return []
        return list(reply[0][1])

    def info(self, stream: str) -> StreamInfo:
        """Length and first/last ids of ``stream``; an absent stream has length 0."""
        pipe = self.client.pipeline(transaction=False)
        pipe.xlen(stream)
        pipe.xrange(stream, count=1)
        pipe.xrevrange(stream, count=1)
        length, first, last = pipe.execute()
        return StreamInfo(
            length=int(length),
            first_id=first[0][0].decode() if first else None,
            last_id=last[0][0].decode() if last else None,
        )

    def pages(
        self, stream: str, start: str = "-", end: str = "+", *, page: int = PAGE, reverse: bool = False
    ) -> Iterator[list[Entry]]:
        """The entries of ``stream`` from ``start`` to ``end`` (ids, ``-``/``+``, or ``(id`` to exclude it), one
        ``XRANGE`` page at a time, oldest first (newest first with ``reverse``, where ``start`` is the upper end).
        The one paging loop of the library: each page resumes after the last id of the one before."""
        cursor = start
        while True:
            chunk: Any = (
                self.client.xrevrange(stream, max=cursor, min=end, count=page)
                if reverse
                else self.client.xrange(stream, min=cursor, max=end, count=page)
            )
            if chunk:
                yield chunk
            if len(chunk) < page:
                return
            cursor = "(" + to_str(chunk[-1][0])

    def entries(
        self, stream: str, start: str = "-", end: str = "+", *, page: int = PAGE, reverse: bool = False
    ) -> Iterator[Entry]:
        """The entries :meth:`pages` reads, one by one."""
        for chunk in self.pages(stream, start, end, page=page, reverse=reverse):
            yield from chunk

    def first_after(self, stream: str, after_id: str) -> Entry | None:
        """The first entry after ``after_id`` (``0-0``: the first entry), or None."""
        return next(self.entries(stream, "-" if after_id == "0-0" else "(" + after_id, page=1), None)

    def entries_after(self, stream: str, after_id: str) -> int:
        """How many entries follow ``after_id`` (a consumer's lag in entries); linear in the lag."""
        return sum(len(chunk) for chunk in self.pages(stream, "(" + after_id))

    def wait_for_entries(self, after: Mapping[str, str], block_ms: int) -> bool:
        """Block until any stream in ``after`` (stream -> last id read) has an entry after its id, or ``block_ms``
        passed (one ``XREAD`` over all of them); return whether one arrived.

        On a Redis Cluster the streams live in different slots and one ``XREAD`` cannot span them: each is polled
        without blocking, every 50 ms, until ``block_ms`` passed."""
        if not isinstance(self.client, redis.RedisCluster) or len(after) <= 1:
            return bool(self.client.xread(dict(after), count=1, block=block_ms))  # type: ignore[arg-type]
        deadline = time.monotonic() + block_ms / 1000
        while True:
            if any(self.client.xread({stream: last}, count=1) for stream, last in after.items()):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    # -- dead letters and worker heartbeats --------------------------------------------------------------------------

    def dead_letters(self, stream: str, letter_id: str | None = None) -> list[Entry]:
        """Every dead letter of ``stream`` oldest first, or just ``letter_id`` (an empty list if it is gone)."""
        if letter_id is not None:
            return list(self.client.xrange(dlq_key(stream), min=letter_id, max=letter_id))  # type: ignore[arg-type]
        return list(self.entries(dlq_key(stream)))

    def dead_letter_entry(
        self,
        stream: str,
        entry_id: bytes,
        fields: Mapping[bytes, bytes],
        *,
        error: str,
        consumer: str,
        attempts: int = 1,
    ) -> str:
        """Copy an entry a checkpoint consumer cannot apply to the dead letters, with why (no group: nothing to
        acknowledge); return the dead letter's id."""
        letter = letter_fields(fields, entry_id, group="", consumer=consumer, attempts=attempts, error=error)
        return to_str(self.client.xadd(dlq_key(stream), letter))  # type: ignore[arg-type]

    def replay_dead_letter(self, stream: str, letter_id: str, fields: Mapping[str, str]) -> str:
        """Append a dead letter's original fields to ``stream`` and delete the letter, in one ``MULTI``; return the
        new entry's id."""
        pipe = self.client.pipeline(transaction=True)
        pipe.xadd(stream, dict(fields))  # type: ignore[arg-type]
        pipe.xdel(dlq_key(stream), letter_id)
        return to_str(pipe.execute()[0])

    def delete_dead_letter(self, stream: str, letter_id: str) -> None:
        self.client.xdel(dlq_key(stream), letter_id)

    def heartbeat(self, stream: str, consumer: str, worker: str, ttl: float) -> int:
        """Mark ``worker`` of partitioned consumer ``consumer`` alive now, forget workers silent for ``ttl`` seconds,
        and return how many are alive (one round trip)."""
        key, now = workers_key(stream, consumer), time.time()
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(key, {worker: now})
        pipe.zremrangebyscore(key, "-inf", now - ttl)
        pipe.zcard(key)
        return int(pipe.execute()[2])

    def leave(self, stream: str, consumer: str, worker: str) -> None:
        """Take ``worker`` out of the live workers at once (the others re-balance without waiting for its ttl)."""
        self.client.zrem(workers_key(stream, consumer), worker)

    def close(self) -> None:
        self.client.close()
