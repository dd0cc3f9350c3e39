"""Surveying many streams at once: what ``unilog status``, the exporter and the dashboard read of every stream, in a
few round trips whatever the number of streams.

Read one stream at a time, a status of 10,000 streams costs some 100,000 round trips (seconds to minutes); here
``survey.lua`` reads :data:`CHUNK` streams in one call on a single Redis (one call per hash slot on a cluster, the
calls of each node written back to back), so the cost follows the work Redis does per stream, not round trips.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from hashlib import sha1
from importlib import resources
from typing import Any

import redis

from ..wire import dlq_key, meta_key, registry_key, to_str
from .commands import issues
from .nodes import clustered, node_pool
from .read import Reading, StreamInfo

# A survey call is one atomic script: Redis serves nothing else meanwhile. Its work is bounded by CHUNK streams, each
# counting at most COUNT_PAGE entries per range (a group's lag, an id asked for), so a call over consumers far behind
# (when status is looked at most) stays in the tens of milliseconds; a longer range is counted on from here, in pages
# between which Redis serves others.
CHUNK = 100
COUNT_PAGE = 100
SURVEY_LUA = (resources.files(__package__) / "survey.lua").read_text(encoding="utf-8")
SURVEY_SHA = sha1(SURVEY_LUA.encode()).hexdigest()


@dataclass(frozen=True)
class RangeCount:
    """How many entries a range holds, and the id of its first (None when it is empty)."""

    count: int
    first_id: str | None


@dataclass(frozen=True)
class StreamSurvey:
    """What one stream holds: its length and ends; its groups (``XINFO GROUPS``' name, consumers, pending and
    last-delivered-id, with ``oldest-pending``: the oldest pending entry's id, None when nothing is pending, and
    ``lag``: a :class:`RangeCount` of the entries after last-delivered-id); the consumers registered for its
    retention (name -> registered id); its partition count (1: not partitioned); how many dead letters it has; and
    ``after``: the entries after each id asked for (id -> :class:`RangeCount`). Empty groups and counts when the
    stream is missing."""

    info: StreamInfo
    groups: list[dict[str, Any]]
    registered: dict[str, str]
    partitions: int
    dead_letters: int
    after: dict[str, RangeCount]


def _chunks(items: Sequence[Any]) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), CHUNK):
        yield items[start : start + CHUNK]


def _id(raw: Any) -> str | None:
    return to_str(raw) if raw else None


def _surveyed(reply: list[Any], at: int, ids: Sequence[str]) -> tuple[StreamSurvey, int]:
    """A :class:`StreamSurvey` from ``survey.lua``'s flat reply (see the script for its shape), read from index
    ``at``; and the index the next stream's answer starts at."""
    length, first, last, letters, partitions, registrations = reply[at : at + 6]
    at += 6
    registered = {to_str(reply[i]): to_str(reply[i + 1]) for i in range(at, at + 2 * registrations, 2)}
    at += 2 * registrations
    groups = []
    for _ in range(reply[at]):
        name, consumers, pending, delivered, oldest, n, next_id = reply[at + 1 : at + 8]
        at += 7
        groups.append(
            {
                "name": to_str(name),
                "consumers": int(consumers),
                "pending": int(pending),
                "last-delivered-id": to_str(delivered),
                "oldest-pending": _id(oldest),
                "lag": RangeCount(int(n), _id(next_id)),
            }
        )
    at += 1
    after = {}
    for after_id in ids:
        after[after_id] = RangeCount(reply[at], _id(reply[at + 1]))
        at += 2
    found = StreamSurvey(
        info=StreamInfo(length=int(length), first_id=_id(first), last_id=_id(last)),
        groups=groups,
        registered=registered,
        partitions=int(partitions) if partitions else 1,
        dead_letters=int(letters),
        after=after,
    )
    return found, at


class Survey(Reading):
    """Reads over many streams, pipelined."""

    @issues(via=("_survey_calls", "_counted_on"))
    def survey(
        self, streams: Iterable[str], after: Mapping[str, Sequence[str]] | None = None
    ) -> dict[str, StreamSurvey]:
        """Each of ``streams``' :class:`StreamSurvey`, with the entries after each of ``after[stream]``'s ids
        counted: one ``survey.lua`` call per :data:`CHUNK` streams (per hash slot on a cluster: a script's keys must
        share one), every call written at once and each reply read as it comes, so this process reads one while
        Redis runs the next. Counts are exact: a range longer than :data:`COUNT_PAGE` is counted on by
        :meth:`entries_after`. The script is loaded again if a server forgot it (a restart, a failover, ``SCRIPT
        FLUSH``)."""
        names = list(dict.fromkeys(streams))
        wanted = {n: list(dict.fromkeys((after or {}).get(n, ()))) for n in names}
        calls: list[tuple[list[str], tuple[Any, ...]]] = []
        for chunk in _chunks(names):
            calls += self._survey_calls(chunk, wanted)
        for attempt in (1, 2):
            found: dict[str, StreamSurvey] = {}
            try:
                with closing(self._per_node([(names[0], command) for names, command in calls])) as replies:
                    for i, reply in replies:
                        if isinstance(reply, Exception):
                            try:
                                raise reply
                            finally:
                                del reply  # it holds the error, whose traceback holds this frame: a cycle
                        at = 0
                        for name in calls[i][0]:
                            surveyed, at = _surveyed(reply, at, wanted[name])
                            found[name] = self._counted_on(name, surveyed)
            except redis.exceptions.NoScriptError:
                if attempt == 2:
                    raise
                self.client.script_load(SURVEY_LUA)
                continue
            return {name: found[name] for name in names}
        raise AssertionError("unreachable")

    # EVALSHA, SCRIPT LOAD when Redis forgot the script; and the script's own commands, which it runs as the caller
    # (named here rather than read from its text: its XINFOs are XINFO STREAM and GROUPS only, the narrower ACL rules)
    @issues(
        "evalsha",
        "script|load",
        "exists",
        "xinfo|stream",
        "xinfo|groups",
        "xlen",
        "hget",
        "hgetall",
        "xrange",
        "xpending",
    )
    def _survey_calls(
        self, chunk: Sequence[str], wanted: dict[str, list[str]]
    ) -> list[tuple[list[str], tuple[Any, ...]]]:
        """The ``survey.lua`` calls that read ``chunk``: one on a single Redis, one per hash slot on a cluster, each
        with the streams it reads, in the order of its reply."""
        slots: dict[int, list[str]] = {}
        cluster: Any = self.client if clustered(self.client) else None
        for name in chunk:
            slots.setdefault(cluster.keyslot(name) if cluster is not None else 0, []).append(name)
        calls: list[tuple[list[str], tuple[Any, ...]]] = []
        for names in slots.values():
            keys = [k for n in names for k in (n, registry_key(n), meta_key(n), dlq_key(n))]
            args = [a for n in names for a in (len(wanted[n]), *wanted[n])]
            calls.append((names, ("EVALSHA", SURVEY_SHA, len(keys), *keys, COUNT_PAGE, *args)))
        return calls

    @issues()
    def _per_node(self, calls: Sequence[tuple[str, tuple[Any, ...]]]) -> Generator[tuple[int, Any], None, None]:
        """Each ``(key, command)``'s index and reply (an error as its exception), as read: the commands of each
        node, the one that serves their key, written back to back on one of its connections and their replies then
        read one by one (redis-py's cluster pipeline refuses scripts). Stopped early, its connection is dropped (the
        replies not read would answer its next user)."""
        by_pool: dict[int, tuple[Any, list[int]]] = {}
        for i, (key, _command) in enumerate(calls):
            pool = node_pool(self.client, key)
            by_pool.setdefault(id(pool), (pool, []))[1].append(i)
        for pool, indexes in by_pool.values():
            conn = pool.get_connection()
            try:
                conn.send_packed_command(conn.pack_commands([calls[i][1] for i in indexes]))
                for i in indexes:
                    try:
                        reply = conn.read_response()
                    except redis.exceptions.ResponseError as exc:  # this command's refusal; the next reply follows
                        reply = exc
                    yield i, reply
            except BaseException:
                conn.disconnect()  # replies out of step: never reuse it
                raise
            finally:
                pool.release(conn)

    @issues(via=("_rest",))
    def _counted_on(self, stream: str, surveyed: StreamSurvey) -> StreamSurvey:
        """``surveyed`` with every count that filled its page counted to the end (rare: a lag past
        :data:`COUNT_PAGE`)."""
        for group in surveyed.groups:
            group["lag"] = self._rest(stream, group["last-delivered-id"], group["lag"])
        for after_id, counted in surveyed.after.items():
            surveyed.after[after_id] = self._rest(stream, after_id, counted)
        return surveyed

    @issues(via=("entries_after",))
    def _rest(self, stream: str, after_id: str, counted: RangeCount) -> RangeCount:
        """``counted`` counted on past its page (the entries read now: the stream may have changed since the
        script, a trim or an append; the count is as of now)."""
        if counted.count != COUNT_PAGE:  # fewer: the range's end was read; more: the stream's length, exact
            return counted
        return RangeCount(self.entries_after(stream, after_id), counted.first_id)

    @issues("xrange", via=("entries_after",))
    def count_ranges(self, ranges: Sequence[tuple[str, str, str]]) -> list[RangeCount]:
        """For each ``(stream, after_id, end)``: the entries after ``after_id`` up to ``end`` (an id, included;
        ``+``: the stream's end) and the first of them, in order. One pipelined ``XRANGE`` of :data:`COUNT_PAGE`
        entries per range and :data:`CHUNK` ranges per round trip; a range longer than that page is counted on
        (:meth:`entries_after`) on its own. Exact, like :meth:`entries_after`, and linear in the entries counted."""
        counts: list[RangeCount] = []
        for chunk in _chunks(ranges):
            pipe = self.client.pipeline(transaction=False)
            for stream, after_id, end in chunk:
                pipe.xrange(stream, min="(" + after_id, max=end, count=COUNT_PAGE)
            for (stream, _after, end), page in zip(chunk, pipe.execute(), strict=True):
                n = len(page)
                if n == COUNT_PAGE:
                    n += self.entries_after(stream, to_str(page[-1][0]), end)
                counts.append(RangeCount(n, to_str(page[0][0]) if page else None))
        return counts
