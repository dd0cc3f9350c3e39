"""One behaviour, two faces: the checkpoint consumer's contract run over the threaded and the asyncio face.

Each test is parametrized by ``face``; the asyncio face is driven from the test's thread through one event loop per
consumer, with an ``async def`` twin of the same handler. A difference between the faces fails a test here. The
four differences found before both faces came from one source (issue 25) each have a test: the poison record's
``attempts``, the malformed entry's reason, ``register_interval``, and the explanation of a refused read.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import pytest
from handlers import APPLIED_INSERT
from unilog.dlq import list_letters, replay

from unilog import (
    AsyncConsumer,
    AsyncGroupConsumer,
    Consumer,
    ConsumerConfig,
    Faults,
    GroupConfig,
    GroupConsumer,
    InjectedCrash,
    PoisonRecord,
    Record,
    Settings,
    Streamer,
    StreamRewound,
    emit,
)
from unilog.engine import RedisStreams, connect
from unilog.errors import WrongKeyType

FACES = ["sync", "async"]


def rows(name: str, records: Sequence[Record], bad: set[int]) -> list[tuple[Any, ...]]:
    """The ``applied`` rows of ``records`` (iterating them is where an injected mid-batch crash fires); raises if
    one of them is in ``bad``, after its effects would have been written."""
    out = []
    for r in records:
        n = r.data.get("n") if isinstance(r.data, dict) else None
        out.append((name, r.producer, r.seq, r.id, n, r.raw_data.decode() if r.raw_data else "null"))
    if any(n in bad for *_, n, _ in out):
        raise ValueError(f"cannot apply a record of {sorted(bad)}")
    return out


class Driver:
    """A consumer (``kind`` "checkpoint" or "group") of either face, driven synchronously."""

    def __init__(self, face: str, settings: Settings, config: Any, bad: set[int], faults: Faults) -> None:
        self.face, self.bad, self.closed = face, bad, False
        name = getattr(config, "name", None) or config.group
        if face == "sync":

            def handle(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
                with conn.cursor() as cur:
                    cur.executemany(APPLIED_INSERT, rows(name, records, self.bad))

            kind: Any = Consumer if isinstance(config, ConsumerConfig) else GroupConsumer
            self.consumer: Any = kind(settings, config, handle, faults=faults)
            self.loop: asyncio.Runner | None = None
        else:

            async def handle_async(conn: psycopg.AsyncConnection[Any], records: Sequence[Record]) -> None:
                async with conn.cursor() as cur:
                    await cur.executemany(APPLIED_INSERT, rows(name, records, self.bad))

            kind = AsyncConsumer if isinstance(config, ConsumerConfig) else AsyncGroupConsumer
            self.consumer = kind(settings, config, handle_async, faults=faults)
            self.loop = asyncio.Runner()

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self.consumer, method)(*args, **kwargs)
        return self.loop.run(result) if self.loop is not None else result

    def run_once(self) -> Any:
        return self.call("run_once", block_ms=-1)

    def drain(self) -> int:
        return int(self.call("drain"))

    def connect(self) -> None:
        self.call("connect")

    def close(self) -> None:
        if self.closed:
            return
        self.call("close")
        self.closed = True
        if self.loop is not None:
            self.loop.close()


@pytest.fixture(params=FACES)
def face(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make(face: str, settings: Settings) -> Any:
    made: list[Driver] = []

    def build(name: str = "c", *, bad: set[int] | None = None, faults: Faults | None = None, **config: Any) -> Driver:
        config.setdefault("block_ms", 100)
        driver = Driver(face, settings, ConsumerConfig(name=name, **config), bad or set(), faults or Faults())
        made.append(driver)
        return driver

    yield build
    for driver in made:
        driver.close()


@pytest.fixture
def make_group(face: str, settings: Settings) -> Any:
    made: list[Driver] = []

    def build(worker: str, *, bad: set[int] | None = None, faults: Faults | None = None, **config: Any) -> Driver:
        config.setdefault("block_ms", 100)
        config.setdefault("claim_idle_ms", 0)  # a failed record is retried at once: no back-off to wait out
        group = GroupConfig(group="g", worker=worker, **config)
        driver = Driver(face, settings, group, bad or set(), faults or Faults())
        made.append(driver)
        return driver

    yield build
    for driver in made:
        driver.close()


def produce(settings: Settings, ns: Sequence[int], **faults: list[bool]) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for n in ns:
            emit(conn, action="create", object="ride", data={"n": n})
    with Streamer(settings, faults=Faults.scripted(**faults)) as streamer:
        streamer.drain()


def applied(pg: Any, name: str = "c") -> list[Any]:
    order = "split_part(entry_id, '-', 1)::bigint, split_part(entry_id, '-', 2)::bigint"  # stream order
    return [r[0] for r in pg.execute(f"SELECT n FROM applied WHERE consumer = %s ORDER BY {order}", (name,))]


def letters(settings: Settings) -> list[Any]:
    api = RedisStreams(connect(settings.redis_url))
    try:
        return list_letters(api, settings.stream)
    finally:
        api.close()


def registered(rds: Any, stream: str, name: str) -> str | None:
    return next((v for k, v in rds.hgetall(f"unilog:consumers:{{{stream}}}").items() if k == name), None)


Make = Callable[..., Driver]


def group_letters(settings: Settings) -> list[Any]:
    api = RedisStreams(connect(settings.redis_url))
    try:
        return list_letters(api, settings.stream, group="g")
    finally:
        api.close()


def test_burst_mode_applies_every_record_once_in_order(settings: Settings, pg: Any, make: Make) -> None:
    produce(settings, range(25))
    c = make(batch_size=10)
    assert c.drain() == 25
    assert c.drain() == 0
    assert applied(pg) == list(range(25))


@pytest.mark.parametrize("point", ["consumer.crash_before_commit", "consumer.crash_mid_batch"])
def test_a_crash_at_each_point_applies_nothing_twice(settings: Settings, pg: Any, make: Make, point: str) -> None:
    produce(settings, range(6))
    faults = Faults.scripted(**{point.replace(".", "__"): [True]})
    c = make(batch_size=4, faults=faults)
    with pytest.raises(InjectedCrash, match=point.split(".")[1]):
        c.run_once()
    assert applied(pg) == []
    c.close()
    assert make(batch_size=4).drain() == 6
    assert applied(pg) == [0, 1, 2, 3, 4, 5]


def test_a_double_sent_batch_is_applied_once(settings: Settings, pg: Any, rds: Any, make: Make) -> None:
    produce(settings, range(5), streamer__double_send=[True])
    assert rds.xlen(settings.stream) == 10
    c = make()
    assert c.drain() == 5
    assert c.consumer.skipped_total == 5
    assert applied(pg) == [0, 1, 2, 3, 4]


def test_a_poison_record_stops_the_consumer_naming_it(settings: Settings, pg: Any, make: Make) -> None:
    produce(settings, range(5))
    c = make(bad={2}, max_attempts=2)
    for _ in range(2):
        with pytest.raises(ValueError, match="cannot apply"):
            c.run_once()
        c.consumer.after_handler_failure(ValueError())  # what the loop does when it carries out the retry
    with pytest.raises(PoisonRecord, match=r"after 2 failed attempts at its batch"):
        c.run_once()
    assert applied(pg) == [0, 1], "the records before the poison are applied, it and those after are not"


def test_a_dead_lettered_poison_record_carries_its_attempts_and_replays_once(
    settings: Settings, pg: Any, make: Make
) -> None:
    """Difference 1: the asyncio face dead-lettered with attempts 1, the threaded one with 3 (max_attempts 2: the
    batch failed twice, then the record alone)."""
    produce(settings, range(5))
    c = make(bad={2}, max_attempts=2, on_poison="dead-letter")
    assert c.drain() == 4
    assert applied(pg) == [0, 1, 3, 4]
    (letter,) = letters(settings)
    assert letter.attempts == 3
    assert "cannot apply" in letter.error
    c.bad.clear()
    api = RedisStreams(connect(settings.redis_url))
    replay(api, settings.stream, letter)
    replay_again = letters(settings)
    api.close()
    assert replay_again == []
    assert c.drain() == 1
    assert sorted(applied(pg)) == [0, 1, 2, 3, 4], "the replay is applied once"


def test_a_malformed_entry_is_dead_lettered_with_its_reason(settings: Settings, pg: Any, rds: Any, make: Make) -> None:
    """Difference 2 (seen in the group workers, whose faces now share this rule too): the reason is the real one."""
    produce(settings, [0])
    rds.xadd(settings.stream, {"data": "{oops", "action": "create", "object": "ride"})
    produce(settings, [1])
    assert make().drain() == 2
    assert applied(pg) == [0, 1]
    (letter,) = letters(settings)
    assert letter.error.startswith("malformed: data is not JSON ("), letter.error


def test_the_registration_is_written_at_most_every_register_interval(settings: Settings, rds: Any, make: Make) -> None:
    """Difference 3: the asyncio face registered after every batch, ignoring ``register_interval``."""
    produce(settings, range(3))
    c = make(register_interval=3600, batch_size=1)
    c.connect()
    at_start = registered(rds, settings.stream, "c")
    assert at_start == "0-0", "connect registers at once"
    assert c.drain() == 3
    assert registered(rds, settings.stream, "c") == at_start, "no batch may write it again within the interval"
    eager = make("eager", batch_size=1)
    assert eager.drain() == 3
    assert registered(rds, settings.stream, "eager") == c.consumer.checkpoint.last_id


def test_a_refused_read_is_explained_in_one_line(settings: Settings, rds: Any, make: Make) -> None:
    """Difference 4: the asyncio face's read skipped the explanation the threaded read gives."""
    rds.set(settings.stream, "not a stream")
    c = make()
    with pytest.raises(WrongKeyType, match=f"the Redis key '{settings.stream}' holds a string, not a stream"):
        c.run_once()


def test_a_stream_that_lost_entries_stops_the_consumer(settings: Settings, rds: Any, make: Make) -> None:
    produce(settings, range(3))
    assert make().drain() == 3
    rds.delete(settings.stream)
    rds.xadd(settings.stream, {"data": json.dumps({"n": 9})}, id="1-1")
    with pytest.raises(StreamRewound):
        make().connect()


# -- consumer groups ------------------------------------------------------------------------------------------------


def test_two_group_workers_apply_every_record_once(settings: Settings, pg: Any, make_group: Make) -> None:
    produce(settings, range(30), streamer__double_send=[True])
    first, second = make_group("w1", batch_size=7), make_group("w2", batch_size=7)
    first.connect()
    second.connect()
    for _ in range(10):
        first.run_once()
        second.run_once()
    assert sorted(applied(pg, "g")) == list(range(30))


@pytest.mark.parametrize(
    "point", ["consumer.crash_mid_batch", "consumer.crash_before_commit", "group.crash_before_ack"]
)
def test_a_group_crash_at_each_point_applies_nothing_twice(
    settings: Settings, pg: Any, make_group: Make, point: str
) -> None:
    produce(settings, range(6))
    crashing = make_group("w1", faults=Faults.scripted(**{point.replace(".", "__"): [True]}))
    crashing.connect()
    with pytest.raises(InjectedCrash):
        crashing.run_once()
    crashing.close()
    assert make_group("w2").drain() + len(applied(pg, "g")) >= 6
    assert sorted(applied(pg, "g")) == [0, 1, 2, 3, 4, 5], "claimed from the crashed worker, applied once"


def test_a_group_dead_letters_a_poison_record_after_max_deliveries(
    settings: Settings, pg: Any, make_group: Make
) -> None:
    produce(settings, range(5))
    worker = make_group("w1", bad={3}, max_deliveries=2, claim_interval=0)
    assert worker.drain() == 4
    (letter,) = group_letters(settings)
    assert letter.attempts == 2 and "cannot apply" in letter.error
    assert sorted(applied(pg, "g")) == [0, 1, 2, 4]


def test_a_group_dead_letters_a_malformed_entry_with_its_reason(
    settings: Settings, pg: Any, rds: Any, make_group: Make
) -> None:
    """Difference 2: the asyncio group dead-lettered with a fixed text, "a handler found it malformed"."""
    produce(settings, [0])
    rds.xadd(settings.stream, {"data": "{oops", "action": "create", "object": "ride"})
    produce(settings, [1])
    assert make_group("w1").drain() == 2
    (letter,) = group_letters(settings)
    assert letter.error.startswith("malformed: data is not JSON ("), letter.error
