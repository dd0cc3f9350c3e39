"""Issue 46: over many streams, the second share's batch is read in a side session while the streamer's own session
claims the first share's, and saved by the owner; what it saves is the claim the owner would have taken, and a side
session that fails leaves the share to the owner's own claim, every record still once and in order."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import psycopg
import pytest
import redis
from structlog.testing import capture_logs
from test_many_streams import _assert_each_once_in_order, _stage

from unilog import Settings, Streamer, StreamerConfig, emit_many, store

SIDE_FAILED = "a share's batch could not be read in the side session: it is claimed in the streamer's own"


@pytest.fixture
def shares(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass over four sources or more cuts them in shares (SHARED_FROM lowered: the tests stage tens of streams)."""
    from unilog.stream import capture_spread

    monkeypatch.setattr(capture_spread, "SHARED_FROM", 4)


def _claims(conn: psycopg.Connection[Any], across: store.Across) -> tuple[Any, ...]:
    """What a claim across sources is, its claim ids aside: each part and the rows saved for it."""
    parts = [(c.source, c.count, c.saved, c.stride, c.body, c.first_created_ms, c.parents) for c in across.claims]
    saved = conn.execute("SELECT source, lo, hi, records FROM unilog_claims ORDER BY claim").fetchall()
    return parts, saved, across.cut, across.filled


@pytest.mark.parametrize(("limit", "per_source"), [(100, 2), (7, 2)], ids=["each-sources-range", "one-scan"])
def test_a_batch_read_in_another_session_and_saved_by_the_owner_is_the_claim_it_would_have_taken(
    settings: Settings, pg: Any, limit: int, per_source: int
) -> None:
    """Both statements (a range of each source's rows, and one scan in id order): the read, saved, is the claim;
    a row committed after the read is left to a later claim (here the only row of ``d``); a session of another
    server (a promoted standby, say) saves none of it."""
    order = ["a", "", "b", "a", "c", "a", "b", "", "c", "c"]
    with psycopg.connect(settings.conninfo) as conn:
        records = [{"action": "x", "object": "o", "data": {"i": i}, "stream": s} for i, s in enumerate(order)]
        emit_many(conn, [{k: v for k, v in r.items() if v != ""} for r in records])  # '': staged with no stream
        conn.commit()
    sources = ["", "a", "b", "c", "d"]
    with psycopg.connect(settings.conninfo) as owner, psycopg.connect(settings.conninfo) as side:
        claimed = _claims(owner, store.claim_across(owner, sources, limit, per_source=per_source))
        owner.rollback()
        read = store.read_across(side, sources, limit, per_source=per_source)
        side.rollback()
        with psycopg.connect(settings.conninfo) as producer:
            emit_many(producer, [{"action": "x", "object": "o", "data": {}, "stream": "d"}])
        elsewhere = store.Read((*read.row[:11], "2000-01-01 00:00:00+00"), read.limit)  # another server's start
        assert store.save_read(owner, elsewhere) is None, "a read on another server saves nothing"
        saved = store.save_read(owner, read)
        assert saved is not None and _claims(owner, saved) == claimed
        owner.commit()
        later = store.claim_across(owner, ["d"], limit, per_source=per_source)
        owner.commit()
    assert [(c.source, c.count) for c in later.claims] == [("d", 1)]
    assert sum(len(p) for p in claimed[0]) and claimed[0]  # the claim took rows


@pytest.mark.usefixtures("shares")
def test_the_next_shares_batch_is_read_in_a_side_session_while_the_first_share_is_claimed(
    settings: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first share's claim (the streamer's session) waits here until the second share's read has begun in the
    side session: a streamer that claimed the shares one after the other in one session fails this test."""
    names = [f"s-{k:03d}" for k in range(40)]
    total = _stage(settings, names, per_stream=2)
    claim_across, read_across = store.claim_across, store.read_across
    reading = threading.Event()
    seen: dict[str, Any] = {}

    def claim(conn: Any, sources: list[str], *args: Any, **kw: Any) -> Any:
        seen.setdefault("waited", reading.wait(10))
        return claim_across(conn, sources, *args, **kw)

    def read(conn: Any, sources: list[str], *args: Any, **kw: Any) -> Any:
        seen["reader"] = (threading.current_thread().name, conn.info.parameter_status("application_name"))
        reading.set()
        return read_across(conn, sources, *args, **kw)

    monkeypatch.setattr(store, "claim_across", claim)
    monkeypatch.setattr(store, "read_across", read)
    with Streamer(settings, StreamerConfig(batch_size=10), name="sided") as streamer:
        assert streamer.drain(timeout=60) == total
    assert seen.get("waited"), "the second share was read while the first was claimed"
    thread, app = seen["reader"]
    assert thread != threading.main_thread().name and app == "unilog-sided-side"
    assert pg.execute("SELECT count(*) FROM unilog_claims").fetchone()[0] == 0
    _assert_each_once_in_order(rds, names, 2)


def _side_pid(pg: Any, app: str) -> int | None:
    row = pg.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,)).fetchone()
    return row[0] if row else None


@pytest.mark.usefixtures("shares")
def test_a_side_session_the_server_ended_is_opened_again_and_one_that_cannot_be_leaves_the_share_to_the_own_claim(
    settings: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The side session is ended between passes (as a server restart or an operator would): the next pass's read
    opens it again at once, with no line. Ended while no new session can be opened: the read fails, one line says
    so, the streamer's own session claims that share; once sessions open again, so does the side one. Every record
    goes once, in order."""
    from unilog.errors import ServerUnreachable

    names = [f"s-{k:03d}" for k in range(40)]
    claim_across, connect = store.claim_across, store.connect
    claims: list[int] = []

    def claim(conn: Any, sources: list[str], *args: Any, **kw: Any) -> Any:
        claims.append(len(sources))
        return claim_across(conn, sources, *args, **kw)

    def refused(*args: Any, **kw: Any) -> Any:
        raise ServerUnreachable("injected: cannot connect to Postgres")

    def end_side_session() -> None:
        pid = _side_pid(pg, "unilog-broken-side")
        assert pid is not None, "the drain before read in a side session"
        pg.execute("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 10
        while _side_pid(pg, "unilog-broken-side") == pid and time.monotonic() < deadline:
            time.sleep(0.05)

    monkeypatch.setattr(store, "claim_across", claim)
    with Streamer(settings, StreamerConfig(batch_size=10), name="broken") as streamer:
        for round_ in range(4):
            total = _stage(settings, names, per_stream=2)
            claims.clear()
            if round_ in (1, 2):
                end_side_session()
            if round_ == 2:
                monkeypatch.setattr(store, "connect", refused)  # the side session's next attempt
            with capture_logs() as logs:
                assert streamer.drain(timeout=60) == total
            monkeypatch.setattr(store, "connect", connect)
            failed = [e for e in logs if e["event"] == SIDE_FAILED]
            if round_ == 2:
                assert len(failed) == 1 and failed[0]["log_level"] == "warning", logs
                assert "injected" in failed[0]["error"]
                assert claims == [20, 20], "both shares claimed in the streamer's own session"
            else:
                assert failed == [] and claims == [20], f"round {round_}: the second share saved from the side read"
    assert pg.execute("SELECT count(*) FROM unilog_claims").fetchone()[0] == 0
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0] == 0
    _assert_rounds_in_order(rds, names, rounds=4, per_stream=2)


def _assert_rounds_in_order(rds: redis.Redis, names: list[str], rounds: int, per_stream: int) -> None:
    for name in names:
        entries = rds.xrange(name)
        assert [int(f["seq"]) for _, f in entries] == list(range(1, rounds * per_stream + 1)), name
        assert [json.loads(f["data"])["i"] for _, f in entries] == list(range(per_stream)) * rounds, name


@pytest.mark.usefixtures("shares")
def test_a_share_read_on_another_server_is_claimed_by_the_streamers_own_session(
    settings: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The side session reached another server than the streamer's own (here its read says another start time):
    nothing of the read is saved, the share is claimed in the streamer's own session, every record once."""
    names = [f"s-{k:03d}" for k in range(40)]
    total = _stage(settings, names, per_stream=2)
    read_across, claim_across = store.read_across, store.claim_across
    claims: list[int] = []

    def read(conn: Any, *args: Any, **kw: Any) -> store.Read:
        got = read_across(conn, *args, **kw)
        return store.Read((*got.row[:11], "2000-01-01 00:00:00+00"), got.limit)

    def claim(conn: Any, sources: list[str], *args: Any, **kw: Any) -> Any:
        claims.append(len(sources))
        return claim_across(conn, sources, *args, **kw)

    monkeypatch.setattr(store, "read_across", read)
    monkeypatch.setattr(store, "claim_across", claim)
    with Streamer(settings, StreamerConfig(batch_size=10), name="elsewhere") as streamer:
        assert streamer.drain(timeout=60) == total
    assert claims == [20, 20]
    assert pg.execute("SELECT count(*) FROM unilog_claims").fetchone()[0] == 0
    _assert_each_once_in_order(rds, names, 2)


@pytest.mark.usefixtures("shares")
def test_a_streamer_of_one_session_reads_no_share_beside(
    settings: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``side_session=False`` (``unilog streamer --one-session``): both shares are claimed in the streamer's own
    session, no second one is opened."""
    names = [f"s-{k:03d}" for k in range(40)]
    total = _stage(settings, names, per_stream=2)
    reads: list[int] = []
    monkeypatch.setattr(store, "read_across", lambda *a, **kw: reads.append(1))
    with Streamer(settings, StreamerConfig(batch_size=10, side_session=False), name="single") as streamer:
        assert streamer.drain(timeout=60) == total
        assert _side_pid(pg, "unilog-single-side") is None
    assert reads == []
    _assert_each_once_in_order(rds, names, 2)


@pytest.mark.usefixtures("shares")
def test_a_side_session_whose_server_stops_answering_holds_no_pass_up(
    settings: Settings, pg: Any, rds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The side session's server takes far longer than the deadline (here its read sleeps 30 s first): the streamer
    waits a quarter of its deadline for the read, claims the share in its own session, and drains everything once
    and in order; the read's own deadline breaks the side session, one line says so, and it is opened again."""
    names = [f"s-{k:03d}" for k in range(40)]
    total = _stage(settings, names, per_stream=2)
    read_across = store.read_across
    stuck = [True]

    def read(conn: Any, *args: Any, **kw: Any) -> Any:
        if stuck[0]:
            stuck[0] = False
            conn.execute("SELECT pg_sleep(30)")
        return read_across(conn, *args, **kw)

    monkeypatch.setattr(store, "read_across", read)
    started = time.monotonic()
    with capture_logs() as logs, Streamer(settings, StreamerConfig(batch_size=10, pg_timeout=4), name="stuck") as s:
        assert s.drain(timeout=60) == total
        drained = time.monotonic() - started
        deadline = time.monotonic() + 20
        while not any(e["event"] == SIDE_FAILED for e in logs) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert drained < 15, f"the drain waited for the stuck read ({drained:.1f} s)"
    events = [e["event"] for e in logs]
    assert any("still being read in the side session" in e for e in events), events
    failed = [e for e in logs if e["event"] == SIDE_FAILED]
    assert len(failed) == 1 and "deadline" in failed[0]["error"], failed
    assert pg.execute("SELECT count(*) FROM unilog_claims").fetchone()[0] == 0
    _assert_each_once_in_order(rds, names, 2)
