"""Publishing: the idempotent publish script, and a producer's high-water mark on a stream."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis

from ..wire import Packed, PublishRow, _b, _pack, hwm_key, pack_rows, to_str
from ._sync.base import Adapter
from .commands import issues, script_commands
from .nodes import clustered, node_pool

# publish.lua (package data beside this module, shipped in the wheel) appends a batch only past this producer's
# high-water mark on the stream, so a batch re-sent after a crash, a timeout with unknown outcome or a retry is not
# appended twice. Positions are (epoch, seq); seq is computed here as
# first_seq + i, so each entry costs five arguments (and no per-entry Lua table: Redis CPU is the drain's limit; a
# batch that carries trace context has seven, traceparent and tracestate, and one with typed records eight, the
# type last; those build their fields in a table unless a common shape has its own XADD). The
# mark lives in a hash beside the stream; if the stream key is gone (deleted, flushed) the mark is ignored, so a
# missing stream can never swallow records as "duplicates".
PUBLISH_LUA = (resources.files(__package__) / "publish.lua").read_text(encoding="utf-8")


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


class PartlyRefused(redis.exceptions.ResponseError):
    """Redis refused some script calls of a pipeline, or a stream inside one (``refusal``: the first; made the one
    line no retry fixes when it names its stream; on a cluster, or a node's pipeline failed after others ran) and
    ran the others: ``results`` holds, per batch, what Redis did (None: refused, not run after a refusal inside its
    call, or not sent), so that a gap one of them found is still reported (its re-send finds none: Redis appended
    past it)."""

    def __init__(self, refusal: Exception, results: list[PublishResult | None]) -> None:
        super().__init__(str(refusal))
        self.refusal, self.results = refusal, results


class _Refused(Exception):
    """:meth:`Publishing._evalsha_many`'s: every reply was read, and some were refusals (the first is
    ``refusal``)."""

    def __init__(self, refusal: redis.exceptions.ResponseError, replies: list[Any], replicas: int) -> None:
        super().__init__(str(refusal))
        self.refusal, self.replies, self.replicas = refusal, replies, replicas


NOT_FOLLOWING = "UNILOG_NOT_FOLLOWING"  # publish.lua's refusal of a batch whose positions before it are missing
PUBLISH_SHA = hashlib.sha1(PUBLISH_LUA.encode()).hexdigest()

# publish_many.lua: many streams' batches, each as publish.lua appends one, in one call on a single Redis
PUBLISH_MANY_LUA = (resources.files(__package__) / "publish_many.lua").read_text(encoding="utf-8")
PUBLISH_MANY_SHA = hashlib.sha1(PUBLISH_MANY_LUA.encode()).hexdigest()


@dataclass(frozen=True)
class MemoryUse:
    """Redis's memory against its ``maxmemory`` (0: no limit), on the fullest node of a cluster."""

    used: int
    limit: int

    @property
    def ratio(self) -> float:
        """``used / limit``; 0.0 without a limit."""
        return self.used / self.limit if self.limit else 0.0


def memory_use(info: Mapping[str, Any]) -> MemoryUse:
    """The fullest node's :class:`MemoryUse` from an ``INFO memory`` reply (one node's fields, or a cluster's
    replies by node)."""
    nodes = [info] if "used_memory" in info else [v for v in info.values() if isinstance(v, Mapping)]
    uses = [MemoryUse(int(n.get("used_memory", 0)), int(n.get("maxmemory", 0))) for n in nodes]
    return max(uses, key=lambda u: u.ratio, default=MemoryUse(0, 0))


class Publishing(Adapter):
    """Appending batches to a stream, each entry once (see ``PUBLISH_LUA``)."""

    _sha = PUBLISH_SHA

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self._loaded: set[str] = set()  # scripts this adapter loaded before its first pipeline of them

    @issues("info")
    def memory(self) -> MemoryUse:
        """How full Redis is (``INFO memory``: ``used_memory`` against ``maxmemory``; on a cluster, its primaries'
        fullest), for the streamer's back-pressure."""
        if isinstance(self.client, redis.RedisCluster):
            return memory_use(self.client.info("memory", target_nodes=redis.RedisCluster.PRIMARIES))
        return memory_use(self.client.info("memory"))

    @issues(via=("explained", "_evalsha"))
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

    @issues(via=("_pool", "_evalsha_many", "_publish_together", "_partly"))
    def publish_many(
        self,
        batches: Sequence[tuple[str, int, Sequence[PublishRow] | Packed]],
        producer: str,
        epoch: int,
        *,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
        per_call: int | None = None,
    ) -> list[PublishResult]:
        """:meth:`publish` of many streams' batches, ``(stream, first_seq, payload)`` each, deduplicated, in one
        pipelined round trip per Redis node (not one per stream): the script calls are written back to back, then
        their replies read. Each call is atomic on its own stream; raises a redis error if Redis refused any (those
        before it may have been appended: a re-send under the same positions skips them). With ``wait_replicas``,
        one ``WAIT`` after them all reports in each result's ``replicas``. On a single Redis, consecutive batches go
        together in script calls of about ``per_call`` records (None: all in one; a stream's batch is never split),
        so that Redis serves its other clients between them (:meth:`_publish_together`)."""
        if batches and not clustered(self.client):
            return self._publish_together(batches, producer, epoch, wait_replicas, wait_timeout_ms, per_call)
        by_pool: dict[int, tuple[Any, list[int]]] = {}
        for i, (stream, _first, _payload) in enumerate(batches):
            pool = self._pool(stream)
            by_pool.setdefault(id(pool), (pool, []))[1].append(i)
        results: list[PublishResult | None] = [None] * len(batches)
        for pool, indexes in by_pool.values():
            commands, sent = [], set()
            for i in indexes:
                stream, first_seq, rows = batches[i]
                batch = rows if isinstance(rows, Packed) else pack_rows(rows)
                # a target's later batch is refused if the one before it was (publish.lua's '2'): never past a gap
                head = [producer, str(epoch), str(first_seq), "2" if stream in sent else "1", str(batch.stride)]
                sent.add(stream)
                keys = [_b(stream), _b(hwm_key(stream))]
                args = [b"EVALSHA", self._sha.encode(), b"2", *keys, *[_b(a) for a in head]]
                commands += [_pack(args, more=batch.stride * batch.count), batch.body]
            try:
                replies, replicas = self._evalsha_many(pool, commands, len(indexes), wait_replicas, wait_timeout_ms)
            except _Refused as refused:  # the other nodes' calls are not sent: the batch is sent again
                for i, reply in zip(indexes, refused.replies, strict=True):
                    results[i] = None if reply is None else _result(reply, refused.replicas)
                at = next((batches[i][0] for i, r in zip(indexes, refused.replies, strict=True) if r is None), None)
                raise self._partly(refused.refusal, results, at) from refused.refusal
            except (redis.RedisError, OSError) as exc:
                if any(r is not None for r in results):  # the nodes before it ran: a gap they found is news still
                    raise PartlyRefused(exc, results) from exc
                raise
            for i, reply in zip(indexes, replies, strict=True):
                results[i] = _result(reply, replicas)
        return [r for r in results if r is not None]

    @issues(via=("_pool", "_evalsha_many", "_partly"))
    def _publish_together(
        self,
        batches: Sequence[tuple[str, int, Sequence[PublishRow] | Packed]],
        producer: str,
        epoch: int,
        wait_replicas: int,
        wait_timeout_ms: int,
        per_call: int | None,
    ) -> list[PublishResult]:
        """:meth:`publish_many` on a single Redis: ``publish_many.lua`` calls of about ``per_call`` records each (a
        reply per call, not per stream; each call is atomic, and Redis runs nothing else meanwhile, as for one large
        batch), each written in one piece (redis-py writes each part of a packed command with a call of its own), all
        in one round trip. Its results carry no entry ids (the script returns only the streams with entries skipped
        or a gap); a batch appended whole shares its result with the others of its size.

        Every batch of one stream goes in the same call, in order: Redis runs a pipeline's later calls after one that
        failed, so a stream split over two calls could get its second part appended after its first was refused,
        with a gap no reply reported, and a re-send would then skip the first part as present, lost. In one call a
        stream's appended entries are always a prefix of its batches, which a re-send completes."""
        calls: list[list[tuple[int, str, int, Packed]]] = [[]]
        call_of: dict[str, int] = {}
        records = 0
        for index, (stream, first_seq, rows) in enumerate(batches):
            batch = rows if isinstance(rows, Packed) else pack_rows(rows)
            if stream not in call_of:
                if calls[-1] and per_call is not None and records + batch.count > per_call:
                    calls.append([])
                    records = 0
                call_of[stream] = len(calls) - 1
            calls[call_of[stream]].append((index, stream, first_seq, batch))
            records += batch.count if call_of[stream] == len(calls) - 1 else 0
        head = [b"EVALSHA", PUBLISH_MANY_SHA.encode()]
        parts = [[(stream, first, batch) for _i, stream, first, batch in call] for call in calls]
        commands = (_together(head, part, _b(producer), b"%d" % epoch) for part in parts)  # encoded as written
        refused = None
        try:
            replies, replicas = self._evalsha_many(
                self._pool(batches[0][0]), commands, len(calls), wait_replicas, wait_timeout_ms, script=PUBLISH_MANY_LUA
            )
        except _Refused as exc:
            refused, replies, replicas = exc, exc.replies, exc.replicas
        results: list[PublishResult | None] = [None] * len(batches)
        first: tuple[Exception, str | None] | None = None  # the first refusal, and the stream it names if it does
        for call, part, reply in zip(calls, parts, replies, strict=True):
            if reply is not None:
                ran, inside = _results_together(reply, part, replicas)
                for (index, *_batch), result in zip(call, ran, strict=True):
                    results[index] = result
                first = first or inside
        if refused is not None and (first is None or first[0] is not refused.refusal):
            first = (refused.refusal, None)  # a whole call's, before any stream's inside a call
        if first is not None:
            raise self._partly(first[0], results, first[1]) from first[0]
        return [r for r in results if r is not None]

    @issues(via=("explained",))
    def _partly(self, refusal: Exception, results: list[PublishResult | None], stream: str | None) -> PartlyRefused:
        """The :class:`PartlyRefused` of ``refusal``, made the one line no retry fixes when it names a ``stream``
        (:meth:`explained`: a key of another type at its name), as a batch of that stream alone is refused."""
        if stream is not None and isinstance(refusal, redis.ResponseError):
            try:
                with self.explained(stream):
                    raise refusal
            except Exception as exc:  # the refusal itself, or its one line
                refusal = exc
        return PartlyRefused(refusal, results)

    @issues("evalsha", "script|load", "wait", *script_commands(PUBLISH_LUA), *script_commands(PUBLISH_MANY_LUA))
    def _evalsha_many(
        self,
        pool: Any,
        commands: Iterable[bytes],
        count: int,
        wait_replicas: int,
        wait_timeout_ms: int,
        *,
        script: str = PUBLISH_LUA,
    ) -> tuple[list[Any], int]:
        """Write ``count`` packed script calls on one connection of ``pool``, then read their replies (and a
        ``WAIT``'s, last, with ``wait_replicas``); the script is loaded and all are sent again if Redis forgot it.
        ``commands`` may be lazy: each part is written as soon as it is made, so Redis runs a call while the next is
        encoded (at ten thousand streams the encoding was a quarter of the send, all of it before Redis started)."""
        written: list[bytes] = []
        pending: Iterator[bytes] | None = iter(commands)
        if script not in self._loaded:
            # loaded first: a new server's empty cache refused every call of the first pipeline, a batch's worth of
            # records sent again whole once the script was loaded
            self.client.script_load(script)
            self._loaded.add(script)
        earlier: list[Any] | None = None  # the replies of the first attempt, which met an empty script cache
        for attempt in (1, 2):
            conn = pool.get_connection()
            try:
                conn.send_packed_command(written, check_health=True)
                for part in pending or ():
                    written.append(part)
                    conn.send_packed_command([part], check_health=False)
                pending = None
                if wait_replicas:
                    conn.send_packed_command(
                        [_pack([b"WAIT", b"%d" % wait_replicas, b"%d" % wait_timeout_ms])], check_health=False
                    )
                replies, replicas, forgotten, refused = _replies(conn, count, wait_replicas)
            except BaseException:
                conn.disconnect()  # the connection's state is unknown; never reuse it
                raise
            finally:
                pool.release(conn)
            if earlier is not None:  # a call that ran before the script was loaded: its reply says what it did
                replies = [_merged(e, r) for e, r in zip(earlier, replies, strict=True)]
            if forgotten is not None:
                if attempt == 2:
                    raise forgotten
                earlier = replies
                self.client.script_load(script)
                continue
            if refused is not None:
                raise _Refused(refused, replies, replicas)
            return replies, replicas
        raise AssertionError("unreachable")

    # EVALSHA, SCRIPT LOAD when Redis forgot the script, WAIT for replicas; and the script's own commands, which it runs
    # as the calling user
    @issues("evalsha", "script|load", "wait", *script_commands(PUBLISH_LUA))
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
                except redis.exceptions.ResponseError:
                    if wait_replicas:  # read, and refused too on a replica: the call's refusal is the news
                        with contextlib.suppress(redis.exceptions.ResponseError):
                            conn.read_response()
                    raise
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

    @issues()
    def _pool(self, key: str) -> Any:
        """The connection pool of the node that serves ``key`` (the one pool of a single Redis)."""
        return node_pool(self.client, key)

    @issues("xrevrange")
    def unsaved_entries(self, stream: str, producer: str, epoch: int, after: int, upto: int) -> list[dict[str, str]]:
        """The entries ``producer`` appended to ``stream`` at ``epoch`` with positions ``after`` + 1 .. ``upto`` (a
        batch Redis confirmed and Postgres never saved), in position order; fewer if some are gone (trimmed). Each
        is its fields as text. One streamer publishes a stream at a time, so they are the stream's last entries."""
        wanted = upto - after
        rows = (self.client.xrevrange(stream, "+", "-", count=wanted) if wanted > 0 else None) or []
        found = []
        for _id, raw in rows:
            fields = {to_str(k): to_str(v) for k, v in (raw or {}).items()}
            ours = fields.get("producer") == producer and fields.get("epoch") == str(epoch)
            if ours and after < int(fields.get("seq", "0")) <= upto:
                found.append(fields)
        return sorted(found, key=lambda f: int(f["seq"]))

    @issues("hget")
    def high_water(self, stream: str, producer: str) -> tuple[int, int] | None:
        """The producer's high-water (epoch, seq) on ``stream``, or None."""
        return _high_water(self.client.hget(hwm_key(stream), producer))

    @issues("hget")
    def high_waters(self, streams: Sequence[str], producer: str) -> dict[str, tuple[int, int] | None]:
        """:meth:`high_water` of each of ``streams``, in one pipelined round trip (one per node on a cluster), not
        one per stream: settling a mode switch over ten thousand streams read their marks one at a time."""
        if not streams:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for stream in streams:
            pipe.hget(hwm_key(stream), producer)
        return {stream: _high_water(mark) for stream, mark in zip(streams, pipe.execute(), strict=True)}


def _high_water(mark: Any) -> tuple[int, int] | None:
    if not mark:
        return None
    epoch, _, seq = to_str(mark).partition(":")
    return int(epoch), int(seq)


# the head of one stream's part in a publish_many.lua call: its first seq, stride and count as RESP bulk strings
_HEAD = b"$%d\r\n%b\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n"


def _replies(
    conn: Any, count: int, wait_replicas: int
) -> tuple[list[Any], int, redis.exceptions.NoScriptError | None, redis.exceptions.ResponseError | None]:
    """Read ``count`` script calls' replies (None for a refused call; a ``publish_many.lua`` call that ended at a
    stream Redis refused keeps its reply, the refusal last) and a ``WAIT``'s (with ``wait_replicas``), every one of
    them; then the first NOSCRIPT refusal and the first other refusal, if any. Every reply is read
    before either is acted on: each call has run or been refused by then, so the script loaded after a NOSCRIPT
    lets no call of this pipeline run as well (one Redis had not read yet did, then ran again when sent again:
    skipped as present, correct, and a line per stream), and a gap the calls that ran found is reported, not
    dropped with them. A connection error is raised at once."""
    replies: list[Any] = []
    forgotten: redis.exceptions.NoScriptError | None = None
    refused: redis.exceptions.ResponseError | None = None
    for _ in range(count):
        try:
            replies.append(reply := conn.read_response())
            if _cut_short(reply):
                refused = refused or reply[-1]  # publish_many.lua's refusal of a stream, after the others' replies
        except redis.exceptions.NoScriptError as exc:
            forgotten = forgotten or exc
            replies.append(None)
        except redis.exceptions.ResponseError as exc:
            # a batch refused as following one NOSCRIPT refused (another client loaded the script between them) is
            # sent again with it: the pipeline's failure is the NOSCRIPT's, retried, not a failed pass
            if forgotten is None or NOT_FOLLOWING not in str(exc):
                refused = refused or exc
            replies.append(None)
    try:
        replicas = int(conn.read_response()) if wait_replicas else 0
    except redis.exceptions.ResponseError:
        if forgotten is None and refused is None:
            raise
        replicas = 0  # refused as the calls were (a replica's READONLY, then its WAIT): the calls' refusal is the news
    return replies, replicas, forgotten, refused


def _cut_short(reply: Any) -> bool:
    """Whether ``reply`` is a ``publish_many.lua`` call's that ended at a stream Redis refused (the refusal last)."""
    return isinstance(reply, list) and bool(reply) and isinstance(reply[-1], redis.exceptions.ResponseError)


def _merged(first: Any, again: Any) -> Any:
    """A call's reply from a pipeline's two runs (the second sent after a NOSCRIPT): the first run's says what it did
    (a gap it found is not found again), but a call it cut short at a refused stream ran on in the second, whose reply
    says what the refused batch and those after it did (their gaps, a refusal that persists)."""
    if first is None or not (_cut_short(first) and isinstance(again, list)):
        return again if first is None else first
    at = -int(first[-2])
    before = [first[k : k + 3] for k in range(1, len(first) - 2, 3) if int(first[k]) < at]
    end = len(again) - (2 if _cut_short(again) else 0)
    after = [again[k : k + 3] for k in range(1, end, 3) if int(again[k]) >= at]
    return [first[0], *(v for triple in before + after for v in triple), *again[end:]]


def _together(head: list[bytes], batches: list[tuple[str, int, Packed]], producer: bytes, epoch: bytes) -> bytes:
    """One ``publish_many.lua`` call of ``batches``, encoded in RESP."""
    keys: list[bytes] = []
    parts: list[bytes] = []
    more = 0
    for stream, first_seq, batch in batches:
        keys += [_b(stream), _b(hwm_key(stream))]
        first, stride, count = b"%d" % first_seq, b"%d" % batch.stride, b"%d" % batch.count
        parts += [_HEAD % (len(first), first, len(stride), stride, len(count), count), batch.body]
        more += 3 + batch.stride * batch.count
    return b"".join([_pack([*head, b"%d" % len(keys), *keys, producer, epoch], more=more), *parts])


def _results_together(
    reply: list[Any], batches: list[tuple[str, int, Packed]], replicas: int
) -> tuple[list[PublishResult | None], tuple[Exception, str] | None]:
    """A ``publish_many.lua`` reply as one result per batch: {appended in all, then (index, skipped, gap) of each
    batch not appended whole, and last (-index, refusal) of a batch Redis refused}; that batch and those after it in
    the call did not run (None), and the refusal comes with its stream."""
    whole: dict[int, PublishResult] = {}
    results: list[PublishResult] = []
    for _stream, _first, batch in batches:
        count = batch.count
        result = whole.get(count)
        if result is None:
            result = whole[count] = PublishResult(
                appended=count, skipped=0, first_id=None, last_id=None, replicas=replicas
            )
        results.append(result)
    ran: list[PublishResult | None] = list(results)
    inside = None
    if _cut_short(reply):  # {..., -index, refusal}: the call ended at that batch
        at, refusal = -int(reply[-2]) - 1, reply[-1]
        ran[at:] = [None] * (len(ran) - at)
        inside, reply = (refusal, batches[at][0]), reply[:-2]
    for k in range(1, len(reply), 3):
        i, skipped, gap = int(reply[k]) - 1, int(reply[k + 1]), int(reply[k + 2])
        count = results[i].appended
        ran[i] = PublishResult(
            appended=count - skipped,
            skipped=skipped,
            first_id=None,
            last_id=None,
            gap_after=None if gap < 0 else gap,
            replicas=replicas,
        )
    return ran, inside


def _result(reply: Any, replicas: int) -> PublishResult:
    """A publish script's reply for one stream: {appended, skipped, gap, first id, last id}."""
    appended, skipped, gap, first_id, last_id = reply
    return PublishResult(
        replicas=replicas,
        appended=int(appended),
        skipped=int(skipped),
        first_id=to_str(first_id) if first_id else None,
        last_id=to_str(last_id) if last_id else None,
        gap_after=None if int(gap) < 0 else int(gap),
    )
