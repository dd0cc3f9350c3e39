"""Poison records in checkpoint consumers: after `max_attempts` failures of one batch, its records are applied one per
transaction to find the failing one; then `stop` ends the consumer with a line naming it (the records before it are
applied, none after), or `dead-letter` moves it aside and goes on. A replay of a dead letter is applied once, by
its owner only, even when a crash dead-lettered it twice."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from cli import unilog
from handlers import record_applied

from unilog import (
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
    emit,
)
from unilog.cli import ExitCode
from unilog.consume.consumer import reset_checkpoint
from unilog.engine import RedisStreams, connect
from unilog.ops.dlq import drop, list_letters, replay


def produce(settings: Settings, ns: Sequence[int], poison: Sequence[int] = ()) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for n in ns:
            emit(conn, action="create", object="ride", data={"n": n, "poison": n in poison})
    with Streamer(settings) as streamer:
        streamer.drain()


def applied(pg: Any, name: str) -> list[Any]:
    return [r[0] for r in pg.execute("SELECT n FROM applied WHERE consumer = %s ORDER BY entry_id", (name,))]


class Poisoned:
    """A handler that fails every batch holding a record whose n is in ``bad``; fix it by emptying ``bad``."""

    def __init__(self, name: str, bad: set[int]) -> None:
        self.name, self.bad, self.calls = name, bad, 0

    def __call__(self, conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
        self.calls += 1
        record_applied(self.name, conn, records)  # effects first: the rollback must undo them
        for r in records:
            if r.data["n"] in self.bad:
                raise ValueError(f"cannot apply {r.data['n']}")


def letters(settings: Settings, **who: str) -> list[Any]:
    api = RedisStreams(connect(settings.redis_url))
    try:
        return list_letters(api, settings.stream, **who)
    finally:
        api.close()


def test_stop_applies_the_records_before_the_poison_and_names_it(settings: Settings, pg: Any, rds: Any) -> None:
    produce(settings, range(10))
    poison_id = rds.xrange(settings.stream)[5][0]
    handler = Poisoned("c0", {5})
    config = ConsumerConfig(name="c0", max_attempts=2)  # stop is the default
    with Consumer(settings, config, handler) as consumer, pytest.raises(PoisonRecord) as caught:
        consumer.drain()
    message = str(caught.value)
    assert caught.value.entry_id == poison_id
    assert poison_id in message and ":1:6" in message and "cannot apply 5" in message, message
    assert handler.calls == 2 + 6, "two failed batches, then one transaction per record up to the poison"
    assert applied(pg, "c0") == [0, 1, 2, 3, 4], "the records before it once, it and those after not at all"
    assert letters(settings) == []
    handler.bad.clear()  # the fix: a restart applies the rest once
    with Consumer(settings, config, handler) as consumer:
        consumer.drain()
    assert applied(pg, "c0") == list(range(10))


def test_the_loop_stops_on_a_poison_record_instead_of_retrying_forever(settings: Settings, pg: Any) -> None:
    produce(settings, range(3))
    config = ConsumerConfig(name="c0", max_attempts=2, block_ms=50)
    with Consumer(settings, config, Poisoned("c0", {1})) as consumer, pytest.raises(PoisonRecord):
        consumer.run(threading.Event())
    assert applied(pg, "c0") == [0]


def test_dead_letter_goes_on_and_a_replay_is_applied_once_even_if_dead_lettered_twice(
    settings: Settings, pg: Any, rds: Any
) -> None:
    produce(settings, range(10))
    poison_id = rds.xrange(settings.stream)[5][0]
    handler = Poisoned("c0", {5})
    config = ConsumerConfig(name="c0", max_attempts=1, on_poison="dead-letter")
    # the first dead-lettering crashes before the checkpoint passes the record: it is retried and dead-lettered again
    faults = Faults.scripted(consumer__crash_after_dead_letter=[True])
    with Consumer(settings, config, handler, faults=faults) as consumer:
        with pytest.raises(InjectedCrash):
            consumer.drain()
        consumer.close()
        consumer.drain()
        assert consumer.dead_total == 1
    assert applied(pg, "c0") == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    mine = letters(settings, consumer="c0")
    assert [d.original_id for d in mine] == [poison_id, poison_id], "a crash may copy it twice, never lose it"
    assert all("cannot apply 5" in d.error and d.attempts == 2 for d in mine)
    with Consumer(settings, ConsumerConfig(name="c1"), Poisoned("c1", set())) as other:
        other.drain()
    with GroupConsumer(settings, GroupConfig(group="g"), Poisoned("g", set())) as group:
        group.drain()
    handler.bad.clear()
    api = RedisStreams(connect(settings.redis_url))
    for letter in mine:
        replay(api, settings.stream, letter)
    api.close()
    for name, worker in (
        ("c0", Consumer(settings, config, handler)),
        ("c1", Consumer(settings, ConsumerConfig(name="c1"), Poisoned("c1", set()))),
        ("g", GroupConsumer(settings, GroupConfig(group="g"), Poisoned("g", set()))),
    ):
        with worker:
            worker.drain()
        assert sorted(applied(pg, name)) == list(range(10)), f"{name}: every record once"
    assert pg.execute("SELECT count(*) FROM unilog_held_letters").fetchone()[0] == 0


def test_a_replay_of_a_foreign_record_is_applied_only_by_the_group_that_dead_lettered_it(
    settings: Settings, pg: Any, rds: Any
) -> None:
    """A record without a unilog position cannot be deduplicated by position: the replay's owner mark does it."""
    rds.xadd(settings.stream, {"data": json.dumps({"n": 100}), "action": "sold"})
    produce(settings, [1])
    with Consumer(settings, ConsumerConfig(name="c1"), Poisoned("c1", set())) as other:
        other.drain()
    with GroupConsumer(settings, GroupConfig(group="g", max_deliveries=1), Poisoned("g", {100})) as group:
        group.drain()
        assert group.dead_total == 1
        api = RedisStreams(connect(settings.redis_url))
        for letter in letters(settings, group="g"):
            replay(api, settings.stream, letter)
        api.close()
        group.handler.bad.clear()  # type: ignore[attr-defined]
        group.drain()
    with Consumer(settings, ConsumerConfig(name="c1"), Poisoned("c1", set())) as other:
        other.drain()
    assert sorted(applied(pg, "g")) == [1, 100]
    assert sorted(applied(pg, "c1")) == [1, 100], "the other consumer applied the original, and skips the replay"


def test_a_group_skips_the_replay_of_a_foreign_record_a_checkpoint_consumer_dead_lettered(
    settings: Settings, pg: Any, rds: Any
) -> None:
    rds.xadd(settings.stream, {"data": json.dumps({"n": 100}), "action": "sold"})
    with GroupConsumer(settings, GroupConfig(group="g"), Poisoned("g", set())) as group:
        group.drain()
    config = ConsumerConfig(name="c0", max_attempts=1, on_poison="dead-letter")
    with Consumer(settings, config, Poisoned("c0", {100})) as consumer:
        consumer.drain()
    api = RedisStreams(connect(settings.redis_url))
    (letter,) = letters(settings, consumer="c0")
    replay(api, settings.stream, letter)
    api.close()
    for name, worker in (
        ("g", GroupConsumer(settings, GroupConfig(group="g"), Poisoned("g", set()))),
        ("c0", Consumer(settings, config, Poisoned("c0", set()))),
    ):
        with worker:
            worker.drain()
        assert applied(pg, name) == [100], name


def test_drop_and_reset_stop_holding_a_dead_letter(settings: Settings, pg: Any, rds: Any) -> None:
    produce(settings, range(4))
    config = ConsumerConfig(name="c0", max_attempts=1, on_poison="dead-letter")
    with Consumer(settings, config, Poisoned("c0", {1, 2})) as consumer:
        consumer.drain()
    first, second = letters(settings, consumer="c0")
    held = "SELECT origin_id FROM unilog_held_letters WHERE consumer = 'c0' ORDER BY origin_id"
    assert [r[0] for r in pg.execute(held)] == [first.original_id, second.original_id]
    api = RedisStreams(connect(settings.redis_url))
    with psycopg.connect(settings.conninfo) as conn:
        drop(api, conn, settings.stream, first)
        assert [r[0] for r in pg.execute(held)] == [second.original_id]
        reset_checkpoint(conn, api, "c0", settings.stream, "end")
    assert pg.execute(held).fetchall() == []
    replay(api, settings.stream, second)
    api.close()
    with Consumer(settings, config, Poisoned("c0", set())) as consumer:
        consumer.drain()
    assert applied(pg, "c0") == [0, 3], "after the reset the consumer no longer holds it: its replay is skipped"


def test_the_commands_stop_with_exit_code_11_then_dead_letter_and_replay(settings: Settings, pg: Any) -> None:
    produce(settings, range(5), poison=[2])
    consume = ["consume", "handlers:poison_handler", "--name", "cli", "--once", "--max-attempts", "1"]
    stopped = unilog(settings, *consume)
    assert stopped.returncode == ExitCode.POISON, stopped.stderr
    lines = [line for line in stopped.stderr.splitlines() if not line.startswith("{")]
    assert len(lines) == 1 and "cannot apply record 2" in lines[0] and ":1:3" in lines[0], stopped.stderr
    assert applied(pg, "cli") == [0, 1]
    passed = unilog(settings, *consume, "--on-poison", "dead-letter")
    assert passed.returncode == ExitCode.OK, passed.stderr
    assert applied(pg, "cli") == [0, 1, 3, 4]
    listed = unilog(settings, "dlq", "list", "--consumer", "cli", "--json")
    assert [d["owner"] for d in json.loads(listed.stdout)] == ["consumer:cli"], listed.stderr
    assert unilog(settings, "dlq", "replay", "--all", "--consumer", "cli").returncode == 0
    assert unilog(settings, *consume, "--on-poison", "dead-letter").returncode == ExitCode.OK
    assert applied(pg, "cli") == [0, 1, 3, 4], "still poison: dead-lettered again, never applied"
    assert len(json.loads(unilog(settings, "dlq", "list", "--consumer", "cli", "--json").stdout)) == 1
