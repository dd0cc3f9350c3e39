"""Logging: every batch logs its size and time; passwords never reach the logs; a warning each retry would repeat is
logged once."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from typing import Any

import psycopg
import pytest
import structlog
from structlog.testing import capture_logs

from unilog import Consumer, ConsumerConfig, Settings, Streamer, emit
from unilog.consume.progress import RewindWatch
from unilog.errors import PublishError, WrongKeyType
from unilog.log import configure_logging


def test_batches_log_size_and_time(settings: Settings) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(3):
            emit(conn, action="a", object="o", data={"n": i})
        conn.commit()
    with capture_logs() as logs:
        with Streamer(settings) as s:
            s.drain()
        with Consumer(settings, ConsumerConfig(name="c"), lambda conn, records: None) as c:
            c.drain()
    streamed = [e for e in logs if e["event"] == "batch streamed"]
    consumed = [e for e in logs if e["event"] == "batch consumed"]
    assert [e["records"] for e in streamed] == [3] and streamed[0]["ms"] >= 0
    assert [e["records"] for e in consumed] == [3] and consumed[0]["ms"] >= 0


def test_json_logs_when_not_a_tty_and_no_passwords(settings: Settings) -> None:
    out = io.StringIO()
    configure_logging(stream=out)
    try:
        secret_url = settings.database_url.replace("postgres@", "postgres:s3cr3t@")  # trust auth ignores it
        secret = Settings(database_url=secret_url, redis_url=settings.redis_url, stream=settings.stream)
        import threading

        stop = threading.Event()
        stop.set()
        Streamer(secret).run(stop)
        lines = [json.loads(line) for line in out.getvalue().splitlines()]
        assert any(e["event"] == "streamer started" for e in lines)
        assert "s3cr3t" not in out.getvalue() and "***" in out.getvalue()
    finally:
        structlog.reset_defaults()


def test_console_logs_on_a_tty() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    configure_logging(stream=out)
    try:
        structlog.get_logger("t").info("hello", n=1)
    finally:
        structlog.reset_defaults()
    text: Any = out.getvalue()
    assert "hello" in text and not text.lstrip().startswith("{")


# A fresh process's first configure_logging: JSON imports structlog without rich (issue 45: its import is a tenth of a
# command's start), a terminal's console lines keep rich's tracebacks, and an error is a JSON line either way.
_FIRST_CONFIGURATION = """
import io, json, sys
from unilog.log import configure_logging
tty = sys.argv[1] == "tty"
out = type("Tty", (io.StringIO,), {"isatty": lambda self: True})() if tty else io.StringIO()
configure_logging(stream=out)
import structlog
try:
    1 / 0
except ZeroDivisionError:
    structlog.get_logger("t").exception("failed", n=1)
print(json.dumps({"rich": "rich" in sys.modules, "formatter": structlog.dev.default_exception_formatter.__class__.__name__,
                  "out": out.getvalue()}))
"""


@pytest.mark.parametrize("where", ["pipe", "tty"])
def test_the_first_configuration_imports_rich_only_for_a_terminal(where: str) -> None:
    result = subprocess.run([sys.executable, "-c", _FIRST_CONFIGURATION, where], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    if where == "tty":
        assert found["rich"] and found["formatter"] == "RichTracebackFormatter"
        assert "ZeroDivisionError" in found["out"] and not found["out"].startswith("{")
    else:
        assert not found["rich"]
        line = json.loads(found["out"])
        assert line["event"] == "failed" and line["n"] == 1 and line["level"] == "error"
        assert line["exception"].startswith("Traceback") and "ZeroDivisionError" in line["exception"]


def test_a_warning_retries_would_repeat_is_logged_once(settings: Settings, rds: Any) -> None:
    """A consumer that first sees a producer past its position 1 (the history before was trimmed) says so once,
    not again on each retry of the batch, nor after an in-process restart."""
    for seq in (5, 6):
        fields = {"producer": "p-trimmed", "epoch": "1", "seq": str(seq), "action": "a", "object": "o", "data": "{}"}
        rds.xadd(settings.stream, fields)
    failures = [RuntimeError("first try"), RuntimeError("second try")]

    def handler(conn: Any, records: Any) -> None:
        if failures:
            raise failures.pop(0)

    config = ConsumerConfig(name="once", stream=settings.stream, max_attempts=10)
    with capture_logs() as logs, Consumer(settings, config, handler) as consumer:
        for attempt in range(2):
            with pytest.raises(RuntimeError):
                consumer.run_once(block_ms=-1)
            if attempt:
                consumer.restart()
        assert consumer.run_once(block_ms=-1).handled == 2
    warnings = [e for e in logs if e["event"] == "history before this position is not in the stream"]
    assert len(warnings) == 1, warnings
    assert warnings[0]["producer"] == "p-trimmed" and tuple(warnings[0]["position"]) == (1, 5)


def test_waiting_for_a_rewound_stream_is_logged_once_per_episode() -> None:
    watch = RewindWatch("c", "s", grace=3600)
    with capture_logs() as logs:
        for _ in range(3):
            watch.check(None, "5-0")  # the stream ends below the checkpoint: waiting for the re-send
        watch.check("6-0", "5-0")  # re-sent
        watch.check(None, "5-0")  # and lost again: a new episode
    waits = [e for e in logs if e["event"].startswith("stream ends below the checkpoint")]
    assert len(waits) == 2, waits


def test_a_batch_across_streams_logs_one_line_for_its_skipped_positions_and_one_for_its_gaps(
    settings: Settings,
) -> None:
    """A batch across many streams sent again (after a failover, say) is skipped as present by Redis: one line says
    how many streams and records, naming the first, not a line per stream (ten thousand of them over ten thousand
    streams). Positions Redis lost (a gap before the batch) are one error line the same way."""
    from unilog.engine import RedisStreams, connect
    from unilog.store import ProducerIdentity
    from unilog.stream import sending

    api = RedisStreams(connect(settings.redis_url))
    identity = ProducerIdentity("p-logs", 1)
    names = [f"logs-{k:03d}" for k in range(40)]
    try:
        batches = [(name, 1, payload([1, 2])) for name in names]
        sending.send_many(api, batches, identity, 0, 1000, per_call=10)
        with capture_logs() as logs:
            sending.send_many(api, batches, identity, 0, 1000, per_call=10)  # sent again: every position present
            sending.send_many(api, [(name, 6, payload([6])) for name in names], identity, 0, 1000, per_call=10)
        with capture_logs() as short, pytest.raises(PublishError, match="replicas acknowledged"):
            # no replica acknowledges: the batch is retried, and its re-send finds no gap (Redis appended past it):
            # the gap is said now or never
            sending.send_many(api, [(name, 9, payload([9])) for name in names], identity, 1, 10, per_call=10)
    finally:
        api.close()
    assert [(e["streams"], e["high_water"]) for e in short if "missing confirmed" in e["event"]] == [(40, 6)]
    skipped = [e for e in logs if e["event"] == "re-sent positions skipped by the broker"]
    assert [(e["streams"], e["skipped"], e["first"]) for e in skipped] == [(40, 80, "logs-000")], skipped
    gaps = [e for e in logs if "missing confirmed positions" in e["event"]]
    assert [(e["streams"], e["first"], e["high_water"], e["first_seq"]) for e in gaps] == [(40, "logs-000", 2, 6)]
    assert gaps[0]["named"] == names, "each stream to reconcile is named"


def test_a_gap_found_by_one_call_of_a_batch_is_logged_though_another_call_was_refused(settings: Settings) -> None:
    """A batch across streams goes in several script calls of one pipeline; Redis refused the first (here a stream's
    key holds a string) and ran the next, which found positions Redis lost. The gap is logged before the batch
    fails: its re-send finds none (Redis appended past it), so it is said now or never. Before, the first refusal
    was raised at once and the replies after it dropped, the gap with them."""
    from unilog.engine import RedisStreams, connect
    from unilog.store import ProducerIdentity
    from unilog.stream import sending

    api = RedisStreams(connect(settings.redis_url))
    identity = ProducerIdentity("p-refused", 1)
    names = [f"gaps-{k:03d}" for k in range(4)]
    try:
        api.client.set("gaps-bad", "not a stream")
        sending.send_many(api, [(name, 1, payload([1, 2])) for name in names], identity, 0, 1000, per_call=10)
        batches = [("gaps-bad", 1, payload([1])), *[(name, 6, payload([6])) for name in names]]
        with capture_logs() as logs, pytest.raises(WrongKeyType, match="'gaps-bad' holds a string"):
            sending.send_many(api, batches, identity, 0, 1000, per_call=1)  # a call a stream: the bad one first
    finally:
        api.close()
    gaps = [e for e in logs if "missing confirmed positions" in e["event"]]
    assert [(e["streams"], e["first"], e["high_water"], e["first_seq"]) for e in gaps] == [(4, names[0], 2, 6)], logs


@pytest.mark.parametrize("refusal", ["WRONGTYPE", "UNILOG_STALE_EPOCH"])
def test_a_gap_found_before_a_refusal_inside_the_same_script_call_is_logged(settings: Settings, refusal: str) -> None:
    """One script call of many streams; the last stream is refused inside it (its key holds a string, or another
    producer's mark is at a later epoch) after the streams before it were appended, one of them past a gap. A script
    has no rollback: their re-send finds no gap, so the call says what they did before the refusal. Before, the
    refusal was the call's whole reply and the gap went unsaid."""
    from unilog.engine import RedisStreams, connect
    from unilog.store import ProducerIdentity
    from unilog.stream import sending

    api = RedisStreams(connect(settings.redis_url))
    identity = ProducerIdentity("p-inside", 1)
    names = [f"inside-{k:03d}" for k in range(4)]
    try:
        if refusal == "WRONGTYPE":
            api.client.set("inside-bad", "not a stream")
        else:
            sending.send_many(api, [("inside-bad", 1, payload([1]))], ProducerIdentity("p-inside", 2), 0, 1000)
        sending.send_many(api, [(name, 1, payload([1, 2])) for name in names], identity, 0, 1000)
        batches = [*[(name, 6, payload([6])) for name in names], ("inside-bad", 2, payload([2]))]
        with capture_logs() as logs, pytest.raises(Exception, match=refusal if "EPOCH" in refusal else "string"):
            sending.send_many(api, batches, identity, 0, 1000)  # one call: the bad stream last
        assert [api.client.xlen(name) for name in names] == [3] * 4, "the streams before it were appended"
    finally:
        api.close()
    gaps = [e for e in logs if "missing confirmed positions" in e["event"]]
    assert [(e["streams"], e["first"], e["high_water"], e["first_seq"]) for e in gaps] == [(4, names[0], 2, 6)], logs


def payload(values: list[int]) -> Any:
    """A batch of records ``{"n": value}`` packed for Redis (five fields a record, no key)."""
    from unilog.engine import Packed

    fields = [[b'{"n":%d}' % v, b"a", b"o", b"1700000000000", b""] for v in values]
    return Packed(len(values), b"".join(b"$%d\r\n%s\r\n" % (len(f), f) for row in fields for f in row), 5)
