"""Issue 27: `unilog backfill` stages one record per existing row through `emit`, in keyset pages that each commit
their records and their cursor together, consistent with live writes: a consumer that mirrors the table by applying
records in stream order ends equal to the table, in table and WAL capture mode, with an updater running, after a
kill mid-page and a resume. Bad input is one line and a named exit code, with nothing staged."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from cli import TESTS, one_line, unilog

from unilog import Consumer, ConsumerConfig, Record, Settings, Streamer, StreamerConfig, emit
from unilog.cli import ExitCode
from unilog.errors import BackfillRefused, InjectedCrash
from unilog.faults import Faults
from unilog.harness.embedded import EmbeddedPostgres
from unilog.ops.dashboard import History, create_app
from unilog.ops.schema import migrate
from unilog.produce.backfill import Backfill, BackfillConfig, backfills, cancel, start
from unilog.stream.modes import enable_wal

TABLE = """
CREATE TABLE accounts (
    id bigint PRIMARY KEY, balance int NOT NULL, note text, amount numeric(12, 2), opened timestamptz NOT NULL,
    ref uuid, blob bytea, tags text[], plain int, doc json
);
CREATE TABLE mirror (id bigint PRIMARY KEY, balance int NOT NULL, actions int NOT NULL DEFAULT 1);
"""


def make_table(pg: Any, rows: int) -> None:
    pg.execute(TABLE)
    pg.execute(
        "INSERT INTO accounts SELECT i, 0, 'row ' || i, i * 1.25, '2026-01-01T00:00:00Z'::timestamptz + i * interval "
        "'1 s', md5(i::text)::uuid, int4send(i), ARRAY['a', i::text], i %% 7, jsonb_build_object('i', i) "
        "FROM generate_series(1, %s) i",
        (rows,),
    )


def mirror(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
    """The mirroring consumer: every record (backfill or change) upserts the row's balance, in stream order."""
    for r in records:
        conn.execute(
            "INSERT INTO mirror (id, balance) VALUES (%s, %s) "
            "ON CONFLICT (id) DO UPDATE SET balance = EXCLUDED.balance, actions = mirror.actions + 1",
            (int(r.key), r.data["balance"]),
        )


def publish_and_mirror(settings: Settings) -> None:
    with Streamer(settings, StreamerConfig(restart_after_crash=False)) as s:
        s.drain(timeout=120)
    with Consumer(settings, ConsumerConfig(name="mirror"), mirror) as c:
        c.drain()


def differences(pg: Any) -> list[Any]:
    return pg.execute(
        "SELECT a.id, a.balance, m.balance FROM accounts a FULL JOIN mirror m USING (id) "
        "WHERE m.balance IS DISTINCT FROM a.balance ORDER BY 1"
    ).fetchall()


def published_backfill(settings: Settings) -> list[dict[str, Any]]:
    """Publish what is staged (rows, or in WAL mode messages), then the stream's backfill records' fields."""
    import redis

    with Streamer(settings, StreamerConfig(restart_after_crash=False)) as s:
        s.drain(timeout=120)
    rds = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    try:
        return [f for _id, f in rds.xrange(settings.stream) if f["action"] == "backfill"]
    finally:
        rds.close()


def backfill_counts(pg: Any) -> Counter[str]:
    """Staged backfill records per key (before a streamer publishes them)."""
    rows = pg.execute("SELECT key, count(*) FROM staged_log_records WHERE action = 'backfill' GROUP BY key")
    return Counter({k: n for k, n in rows})


@pytest.mark.parametrize("mode", ["table", "wal"])
def test_a_backfill_stages_every_row_once_through_emit(settings: Settings, pg: Any, mode: str) -> None:
    make_table(pg, 2500)
    if mode == "wal":
        enable_wal(settings)
    cursor = start(settings, BackfillConfig("accounts", "id", batch_size=1000))
    assert cursor["name"] == "accounts.id" and cursor["rows_estimate"] == 2500 and cursor["status"] == "running"
    pages: list[int] = []
    with Backfill(settings, cursor["name"], on_page=lambda c: pages.append(c["rows_done"])) as b:
        assert b.drain() == 2500
        assert b.outcome == "done"
    assert pages == [1000, 2000, 2500], "keyset pages of --batch-size rows, the last one short: done"
    records = published_backfill(settings)  # in WAL mode the records are messages: counted once published
    assert Counter(f["key"] for f in records) == Counter({str(i): 1 for i in range(1, 2501)})
    (seventh,) = [f for f in records if f["key"] == "7"]
    assert seventh["object"] == "accounts"
    assert json.loads(seventh["data"]) == {
        "id": 7, "balance": 0, "note": "row 7", "amount": "8.75", "opened": "2026-01-01T00:00:07+00:00",
        "ref": str(uuid.UUID(pg.execute("SELECT md5('7')").fetchone()[0])), "blob": "AAAABw==", "tags": ["a", "7"],
        "plain": 0, "doc": {"i": 7},
    }  # fmt: skip
    publish_and_mirror(settings)
    assert pg.execute("SELECT count(*) FROM mirror").fetchone()[0] == 2500
    assert differences(pg) == []
    (done,) = [b for b in backfills(settings) if b["name"] == "accounts.id"]
    assert done["status"] == "done" and done["rows_done"] == 2500 and done["last_key"] == "2500"


def test_where_stream_object_and_action_are_the_records(settings: Settings, pg: Any) -> None:
    make_table(pg, 300)
    cursor = start(
        settings,
        BackfillConfig(
            "public.accounts", "id", where="note LIKE 'row 1%'", stream="other", object="acct", action="snap"
        ),
    )
    with Backfill(settings, cursor["name"]) as b:
        b.drain()
    rows = pg.execute("SELECT DISTINCT stream, object, action FROM staged_log_records").fetchall()
    assert rows == [("other", "acct", "snap")]
    keys = {int(k) for (k,) in pg.execute("SELECT key FROM staged_log_records")}
    assert keys == {i for i in range(1, 301) if str(i).startswith("1")}
    assert cursor["name"].startswith("public.accounts.id-"), "a --where gets its own name"


class Updater:
    """The application: transactions that each update two rows (holding the first while it waits) and emit a record
    per updated row with its new balance, in the same transaction. Updaters share rows (each takes its two rows in
    id order, so two of them queue on a row instead of deadlocking)."""

    def __init__(self, settings: Settings, rows: int, seed: int) -> None:
        self.settings, self.rows, self.rng = settings, rows, random.Random(seed)
        self.stop = threading.Event()
        self.commits = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Updater:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
        assert self.error is None, self.error

    def _run(self) -> None:
        try:
            with psycopg.connect(self.settings.conninfo) as conn:
                while not self.stop.is_set():
                    with conn.transaction():
                        hot = 10  # half the updates go to ten rows: updaters queue on each other there
                        picks = [self.rng.randint(1, hot if self.rng.random() < 0.5 else self.rows) for _ in range(2)]
                        for n, row_id in enumerate(sorted(set(picks))):
                            (balance,) = conn.execute(
                                "UPDATE accounts SET balance = balance + 1 WHERE id = %s RETURNING balance", (row_id,)
                            ).fetchone()
                            emit(conn, action="update", object="accounts", data={"balance": balance}, key=str(row_id))
                            if n == 0:
                                time.sleep(0.002)  # the first row stays locked, the transaction's id taken
                    self.commits += 1
        except BaseException as exc:  # reported by __exit__
            self.error = exc


@pytest.mark.parametrize("mode", ["table", "wal"])
def test_the_mirror_equals_the_table_with_an_updater_and_a_crash_mid_page(
    settings: Settings, pg: Any, mode: str
) -> None:
    rows = 1500
    make_table(pg, rows)
    if mode == "wal":
        enable_wal(settings)
    cursor = start(settings, BackfillConfig("accounts", "id", batch_size=40))
    crashes = Faults.scripted(backfill__crash_before_commit=[False] * 10 + [True] + [False] * 5 + [True])
    # The updaters share rows: both capture modes publish two changes of one row in the order they committed
    # (issue 33), so the mirror must equal the table whichever updater wrote last.
    with Updater(settings, rows, seed=27) as app, Updater(settings, rows, seed=72) as app2:
        stop = threading.Event()
        with Backfill(settings, cursor["name"], faults=crashes) as b:
            b.run(stop)  # restarts in-process after each injected crash, from the committed cursor
        assert b.outcome == "done" and crashes.counts["backfill.crash_before_commit"] == 2
        time.sleep(0.2)
    assert app.commits > 20 and app2.commits > 20, "the updaters ran while the backfill did"
    counts = Counter(f["key"] for f in published_backfill(settings))
    assert counts == Counter({str(i): 1 for i in range(1, rows + 1)}), "no row missing, none twice"
    publish_and_mirror(settings)
    assert differences(pg) == []


def test_a_crash_before_commit_stages_nothing_of_the_page_and_the_resume_goes_on(settings: Settings, pg: Any) -> None:
    make_table(pg, 1000)
    cursor = start(settings, BackfillConfig("accounts", "id", batch_size=100))
    faults = Faults.scripted(backfill__crash_before_commit=[False, False, True])
    with (
        Backfill(settings, cursor["name"], faults=faults, restart_after_crash=False) as b,
        pytest.raises(InjectedCrash),
    ):
        b.drain()
    assert sum(backfill_counts(pg).values()) == 200, "two pages committed, the third rolled back"
    (state,) = backfills(settings)
    assert state["rows_done"] == 200 and state["last_key"] == "200" and state["status"] == "running"
    assert not state["active"], "the crashed process let go of the backfill"
    again = start(settings, BackfillConfig("accounts", "id", batch_size=100, rate=50_000))
    assert again["rows_done"] == 200, "the same command resumes the running backfill"
    assert (again["rate"], backfills(settings)[0]["rate"]) == (50_000, 50_000), "with the command's pace"
    with Backfill(settings, cursor["name"]) as b:
        assert b.drain() == 800
    assert backfill_counts(pg) == Counter({str(i): 1 for i in range(1, 1001)})


def test_a_killed_command_resumes_where_its_last_page_committed(settings: Settings, pg: Any) -> None:
    make_table(pg, 3000)
    argv = [sys.executable, "-m", "unilog", "--log-json", "backfill", "accounts", "--key", "id", "--batch-size", "50"]
    env = {"DATABASE_URL": settings.database_url, "REDIS_URL": settings.redis_url, "UNILOG_STREAM": settings.stream}
    import os

    proc = subprocess.Popen([*argv, "--rate", "1000"], env={**os.environ, **env}, cwd=TESTS, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while sum(backfill_counts(pg).values()) < 500 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    staged = sum(backfill_counts(pg).values())
    assert 500 <= staged < 3000 and staged % 50 == 0, staged
    result = unilog(settings, "backfill", "accounts", "--key", "id", "--batch-size", "50")
    assert result.returncode == 0, result.stderr
    assert f"{3000 - staged} rows staged by this run" in result.stdout
    assert backfill_counts(pg) == Counter({str(i): 1 for i in range(1, 3001)})
    status = unilog(settings, "backfill", "status", "--json")
    (row,) = json.loads(status.stdout)
    assert row["status"] == "done" and row["rows_done"] == 3000


def dashboard_backfills(settings: Settings) -> list[dict[str, Any]]:
    """The running backfills in the dashboard's `/api/status`, which its page draws as the Backfills table."""
    history = History(settings)
    client = create_app(settings, history, read_only=True).test_client()
    page = client.get("/").get_data(as_text=True)
    assert 'id="backfills"' in page and "drawBackfills(data.status)" in page
    history.sample()
    return list(client.get("/api/status").get_json()["status"]["backfills"])


def test_cancel_stops_a_running_backfill_and_status_shows_it(settings: Settings, pg: Any) -> None:
    make_table(pg, 2000)
    cursor = start(settings, BackfillConfig("accounts", "id", batch_size=10, rate=100))
    stop = threading.Event()
    worker = Backfill(settings, cursor["name"])
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while backfills(settings)[0]["rows_done"] == 0:  # its first page committed: running, with rows done
            assert time.monotonic() < deadline, "the backfill staged no page"
            time.sleep(0.05)
        report = unilog(settings, "status", "--json")
        (running,) = json.loads(report.stdout)["backfills"]
        assert running["name"] == "accounts.id" and running["active"] and 0 < running["rows_done"] < 2000
        text = unilog(settings, "backfill", "status").stdout
        assert "accounts.id" in text and "running" in text
        (shown,) = dashboard_backfills(settings)
        assert shown["name"] == "accounts.id" and shown["active"] and shown["rows_estimate"] == 2000
        assert cancel(settings, "accounts.id") is True
        thread.join(10)
        assert not thread.is_alive() and worker.outcome == "cancelled"
    finally:
        stop.set()
        thread.join(10)
        worker.close()
    (state,) = backfills(settings)
    assert state["status"] == "cancelled" and sum(backfill_counts(pg).values()) == state["rows_done"]
    assert cancel(settings, "accounts.id") is False
    refused = unilog(settings, "backfill", "--resume", "accounts.id")
    assert refused.returncode == ExitCode.BACKFILL_REFUSED and "cancelled" in one_line(refused)
    with pytest.raises(BackfillRefused, match="no backfill named"):
        cancel(settings, "nope")


BAD = [
    (["missing", "--key", "id"], "table 'missing' does not exist"),
    (["accounts", "--key", "nope"], "has no column 'nope'"),
    (["accounts", "--key", "plain"], "is not unique by itself"),
    (["accounts", "--key", "doc"], "has no order"),
    (["accounts", "--key", "note"], "may be NULL"),
    (["accounts", "--key", "id", "--where", "balance >"], "cannot be used: syntax error"),
    (["accounts", "--key", "id", "--where", "nope = 1"], 'column "nope" does not exist'),
    (["accounts", "--key", "id", "--batch-size", "0"], "--batch-size must be at least 1"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_input_is_one_line_with_a_named_exit_code_and_nothing_staged(
    settings: Settings, pg: Any, args: list[str], message: str
) -> None:
    make_table(pg, 10)
    pg.execute("CREATE UNIQUE INDEX ON accounts (note)")  # unique, but nullable
    result = unilog(settings, "backfill", *args)
    assert result.returncode == ExitCode.BACKFILL_REFUSED, result.stderr
    assert message in one_line(result)
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0] == 0
    assert pg.execute("SELECT count(*) FROM unilog_backfills").fetchone()[0] == 0


def test_columns_of_types_emit_does_not_encode_are_staged_as_postgres_text(settings: Settings, pg: Any) -> None:
    """An interval, an inet, a range, a point and an array of intervals (types psycopg would load as objects emit
    does not encode, or has no loader for) are staged as their Postgres text (an array as a list of strings)."""
    pg.execute(
        "CREATE TABLE span (id int PRIMARY KEY, during interval, addr inet, span int4range, at point, "
        "steps interval[], n int)"
    )
    pg.execute(
        "INSERT INTO span VALUES (1, '1 day 02:00:00', '10.0.0.1/8', '[1,5)', '(1,2)', "
        "ARRAY['1 hour', '2 days']::interval[], 7), (2, NULL, NULL, NULL, NULL, NULL, NULL)"
    )
    cursor = start(settings, BackfillConfig("span", "id"))
    with Backfill(settings, cursor["name"]) as b:
        assert b.drain() == 2
    data = [r[0] for r in pg.execute("SELECT data FROM staged_log_records ORDER BY id").fetchall()]
    assert data[0] == {
        "id": 1, "during": "1 day 02:00:00", "addr": "10.0.0.1/8", "span": "[1,5)", "at": "(1,2)",
        "steps": ["01:00:00", "2 days"], "n": 7,
    }  # fmt: skip
    assert data[1] == {"id": 2, "during": None, "addr": None, "span": None, "at": None, "steps": None, "n": None}


def test_a_row_that_cannot_be_encoded_refuses_its_page_naming_the_rows_key(settings: Settings, pg: Any) -> None:
    """The page is staged with one emit_many: a row it refuses (a NaN float) names the row's key, and nothing of
    that page is staged; the pages before it stay committed."""
    pg.execute("CREATE TABLE readings (id int PRIMARY KEY, value float8 NOT NULL)")
    pg.execute(
        "INSERT INTO readings SELECT i, CASE WHEN i = 37 THEN 'NaN'::float8 ELSE i END FROM generate_series(1, 50) i"
    )
    cursor = start(settings, BackfillConfig("readings", "id", batch_size=20))
    with Backfill(settings, cursor["name"]) as b, pytest.raises(BackfillRefused) as refused:
        b.drain()
    assert (
        str(refused.value)
        == "the row with key '37' cannot be staged: data['value'] is NaN: NaN and Infinity are not valid JSON"
    )
    assert backfill_counts(pg) == Counter({str(i): 1 for i in range(1, 21)}), "page 21-40 staged nothing"
    (state,) = [c for c in backfills(settings) if c["name"] == cursor["name"]]
    assert state["rows_done"] == 20 and state["last_key"] == "20"


@pytest.fixture
def reader(settings: Settings, pg: Any) -> Iterator[str]:
    """A login role that may use unilog's tables and stage records, and nothing of ``accounts``: its URL."""
    name = f"unilog_bf_{uuid.uuid4().hex[:6]}"
    try:
        pg.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'pw'")
    except psycopg.errors.InsufficientPrivilege:
        pytest.skip("the test database's user may not create roles")
    pg.execute(f"GRANT SELECT ON unilog_alembic_version TO {name}")
    pg.execute(f"GRANT SELECT, INSERT, UPDATE ON unilog_backfills, staged_log_records TO {name}")
    parts = urlsplit(settings.database_url)
    yield urlunsplit(parts._replace(netloc=f"{name}:pw@{parts.netloc.rpartition('@')[2]}"))
    pg.execute(f"DROP OWNED BY {name}")
    pg.execute(f"DROP ROLE {name}")


def test_a_role_without_select_on_the_table_is_refused_in_one_line(settings: Settings, pg: Any, reader: str) -> None:
    make_table(pg, 10)
    result = unilog(settings, "backfill", "accounts", "--key", "id", database_url=reader)
    assert result.returncode == ExitCode.CONFIG, result.stderr
    assert "lacks SELECT and UPDATE on table public.accounts" in one_line(result)
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone()[0] == 0


def test_a_postgres_restart_mid_backfill_is_retried_and_stages_each_row_once(settings: Settings, tmp_path: Any) -> None:
    """On a Postgres of its own (the session's is shared): restarted while the backfill pages, the process
    reconnects and goes on from its last committed page."""
    with EmbeddedPostgres(tmp_path / "pg") as server:
        migrate(server.url)
        own = settings.with_(database_url=server.url)
        with psycopg.connect(server.url, autocommit=True) as pg:
            make_table(pg, 2000)
        cursor = start(own, BackfillConfig("accounts", "id", batch_size=20, rate=1000))
        worker = Backfill(own, cursor["name"], pg_timeout=10)
        worker.max_backoff = 0.5
        stop = threading.Event()
        thread = threading.Thread(target=worker.run, args=(stop,))
        thread.start()
        try:
            time.sleep(0.5)
            assert 0 < worker.staged_total < 2000
            server.restart("immediate")  # the page in progress dies with its session
            thread.join(60)
            assert not thread.is_alive() and worker.outcome == "done"
        finally:
            stop.set()
            thread.join(10)
            worker.close()
        with psycopg.connect(server.url, autocommit=True) as pg:
            assert backfill_counts(pg) == Counter({str(i): 1 for i in range(1, 2001)})


def test_a_lock_its_closing_session_still_holds_is_waited_for_and_a_live_holder_is_refused(
    settings: Settings, pg: Any
) -> None:
    """The backfill's lock is a session lock, let go when the holding backend exits, a moment after its client
    closed the session. A backfill restarted in-process after a crash met its own closed session still holding it (the
    CI's run at load: "being run by another process", by itself); it now waits up to ``LOCK_WAIT`` for it. A holder
    that stays is still refused."""
    from unilog.produce.backfill import LOCK_WAIT
    from unilog.store.backfills import try_backfill_lock

    make_table(pg, 10)
    cursor = start(settings, BackfillConfig("accounts", "id", batch_size=5))
    holder = psycopg.connect(settings.conninfo, autocommit=True)
    assert try_backfill_lock(holder, cursor["name"])
    closing = threading.Timer(1.0, holder.close)  # the last session of a crashed run, gone a moment later
    closing.start()
    try:
        with Backfill(settings, cursor["name"]) as b:
            assert b.drain() == 10
    finally:
        closing.join()
    with psycopg.connect(settings.conninfo, autocommit=True) as rival:
        assert try_backfill_lock(rival, cursor["name"])
        started = time.monotonic()
        with Backfill(settings, cursor["name"]) as b, pytest.raises(BackfillRefused, match="another process"):
            b.drain()
        assert time.monotonic() - started >= LOCK_WAIT, "refused only after the wait"
