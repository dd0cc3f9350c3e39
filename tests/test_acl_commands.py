"""The ACL of each kind of process is what it issues: every adapter method issues only the Redis commands it declares
(``@issues``, watched with ``MONITOR``, both faces), and each kind of process, run under the ACL user `unilog acl`
prints for it, issues only commands of that user's list (``MONITOR`` again, and ``ACL LOG`` holds no refusal). A
planted method that issues a command it does not declare is caught both ways."""

from __future__ import annotations

import asyncio
import inspect
import logging
import shlex
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
import redis
import structlog
from acl_users import acl_users

from unilog import Settings, Streamer, StreamerConfig, emit
from unilog.cli import main
from unilog.engine import RedisStreams, connect, ids_many, ping, raw_pages
from unilog.engine.aio import AsyncRedisStreams, connect_async
from unilog.engine.commands import commands_of, declared, issues, methods_of
from unilog.errors import WrongKeyType
from unilog.ops import acl, admin
from unilog.wire import dlq_key

PASSWORD = "cmds-" + uuid.uuid4().hex[:8]
PARTS = "test-parts"  # a partitioned stream beside the test's own
MARK = "unilog-window:"
# commands whose ACL names carry their subcommand (``xinfo|stream``)
CONTAINERS = {"xinfo", "xgroup", "script", "client", "config", "object", "memory", "acl", "cluster", "function"}
UNCHECKED = {"hello", "auth"}  # authentication: Redis runs them before any ACL check


def acl_name(command: str) -> str:
    """The ACL name of a command as ``MONITOR`` shows it (``XINFO STREAM s`` -> ``xinfo|stream``)."""
    words = command.split(" ", 2)
    name = words[0].lower()
    return f"{name}|{words[1].lower()}" if name in CONTAINERS and len(words) > 1 else name


class Monitor:
    """``MONITOR`` on an admin connection, in a thread; :meth:`window` attributes what Redis runs (scripts' commands
    included) to a label until the window closes. Only the code under watch may talk to Redis inside a window."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.admin = redis.Redis.from_url(url, decode_responses=True)
        self.lines: list[str] = []
        self.labels: list[str] = []  # every window opened, in order (one that issued nothing is in no line)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)

    def _listen(self) -> None:
        client = redis.Redis.from_url(self.url, decode_responses=True)
        with client.monitor() as monitor:
            self._ready.set()
            for line in monitor.listen():
                command = line["command"]
                self.lines.append(command)
                if command == f"ECHO {MARK}stop":
                    return

    def __enter__(self) -> Monitor:
        self._thread.start()
        assert self._ready.wait(10), "MONITOR did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self.admin.echo(f"{MARK}stop")
        self._thread.join(10)
        self.admin.close()

    @contextmanager
    def window(self, label: str) -> Iterator[None]:
        self.labels.append(label)
        self.admin.echo(MARK + label)
        try:
            yield
        finally:
            self.admin.echo(MARK + "-")

    def seen(self) -> dict[str, set[str]]:
        """Commands per window label (ACL names), once the monitor stopped."""
        found: dict[str, set[str]] = defaultdict(set)
        label = "-"
        for command in self.lines:
            if command.startswith("ECHO " + MARK):
                label = command.removeprefix("ECHO " + MARK)
            elif label != "-" and acl_name(command) not in UNCHECKED:
                found[label].add(acl_name(command))
        return found


def nil_claims(rds: Any) -> bool:
    """Whether the server claims an entry deleted while pending as a nil (Redis before 7; 7 names it deleted)."""
    return int(str(rds.info("server")["redis_version"]).split(".")[0]) < 7


def undeclared(seen: dict[str, set[str]], declared: Callable[[str], frozenset[str]]) -> dict[str, set[str]]:
    """Per window, the commands seen that its method does not declare."""
    return {label: extra for label, commands in seen.items() if (extra := commands - declared(label))}


def allowed(function: Any, owner: type = RedisStreams) -> frozenset[str]:
    """What ``function`` declares, and what any connection may send (``connect``'s: redis-py's health check, on a
    connection the method opens or reuses)."""
    return commands_of(function, owner) | commands_of(connect)


def declared_by(label: str) -> frozenset[str]:
    """What the adapter method a window is named after may issue: as the threaded method declares it, or (``aio:``
    windows) as the asyncio method does, on each face's own class."""
    name = label.removeprefix("aio:").partition("#")[0]
    if label.startswith("aio:"):
        return allowed(getattr(AsyncRedisStreams, name), AsyncRedisStreams)
    return allowed(
        {"connect": connect, "ping": ping, "raw_pages": raw_pages, "ids_many": ids_many}.get(name)
        or getattr(RedisStreams, name)
    )


# -- every method issues only what it declares ---------------------------------------------------------------------


def _publish_and_read(api: RedisStreams, mon: Monitor, rds: Any, s: str) -> None:
    rows = [("{}", "create", "ride", 1, None), ("{}", "create", "ride", 2, "k")]
    rds.script_flush()  # the next publish finds no script: SCRIPT LOAD, then EVALSHA again
    with mon.window("publish"):
        api.publish(s, "p", 1, 1, rows, wait_replicas=1, wait_timeout_ms=1)
    rds.set("not-a-stream", "x")
    rds.script_flush()
    with mon.window("publish_many"):
        api.publish_many([(s + "m", 1, rows), (s + "n", 1, rows)], "p", 1, wait_replicas=1, wait_timeout_ms=1)
    with mon.window("publish#wrongtype"), pytest.raises(WrongKeyType):
        api.publish("not-a-stream", "p", 1, 1, rows)
    with mon.window("high_water"):
        assert api.high_water(s, "p") == (1, 2)
    with mon.window("high_waters"):
        assert api.high_waters([s, s + "-none"], "p") == {s: (1, 2), s + "-none": None}
    with mon.window("unsaved_entries"):
        assert [e["seq"] for e in api.unsaved_entries(s, "p", 1, 0, 2)] == ["1", "2"]
    with mon.window("memory"):
        assert api.memory().used > 0
    for name, call in {
        "read": lambda: api.read(s, "0-0", 10, None),
        "info": lambda: api.info(s),
        "pages": lambda: list(api.pages(s, "+", "-", reverse=True)),
        "entries": lambda: list(api.entries(s)),
        "first_after": lambda: api.first_after(s, "0-0"),
        "entries_after": lambda: api.entries_after(s, "0-0"),
        "wait_for_entries": lambda: api.wait_for_entries({s: "0-0"}, 1),
        "missing_stream": lambda: api.missing_stream("no-such-stream"),
        "last_generated_id": lambda: api.last_generated_id(s),
        "read_many": lambda: api.read_many({s: "0-0", s + "m": "0-0", "no-such-stream": "0-0"}, 10, None),
        "stream_names": lambda: api.stream_names(s[:3], 100),
        "missing_streams": lambda: api.missing_streams([s, "no-such-stream"]),
        "last_generated_ids": lambda: api.last_generated_ids([s, "no-such-stream"]),
        "raw_pages": lambda: list(raw_pages(mon.url, s, "0-0", "+", 10)),
        "ids_many": lambda: ids_many(mon.url, {s: ("0-0", "+"), "no-such-stream": ("0-0", "+")}, 10),
    }.items():
        with mon.window(name):
            call()


def _groups_and_letters(api: RedisStreams, mon: Monitor, rds: Any, s: str) -> None:
    with mon.window("ensure_group"):
        api.ensure_group(s, "g")
        api.ensure_group(s, "g")  # BUSYGROUP
    pending = [eid for eid, _ in rds.xreadgroup("g", "gone", {s: ">"}, count=2)[0][1]]
    rds.xdel(s, pending[-1])  # pending and deleted: Redis 6.2 claims it as a nil, Redis 7 names it deleted
    with mon.window("autoclaim"):
        _, claimed, _deleted = api.autoclaim(s, "g", "w", 0)
    with mon.window("autoclaim_many"):
        api.autoclaim_many([s], "g", "w", 60_000)
    eid, fields = claimed[0]
    for name, call in {
        "read_group": lambda: api.read_group(s, "g", "w", 10, None, "0"),
        "read_group_many": lambda: api.read_group_many("g", "w", {s: "0"}, 10, None),
        "ensure_groups": lambda: api.ensure_groups([s, s + "g"], "g"),
        "attempt": lambda: api.attempt(s, "g", eid),
        "pending_summary": lambda: api.pending_summary(s, "g"),
        "groups": lambda: api.groups(s),
        "survey": lambda: api.survey([s, "no-such-stream"], {s: ["0-0", eid]}),
        "count_ranges": lambda: api.count_ranges([(s, "0-0", "+"), (s, "0-0", eid)]),
        "dead_letter": lambda: api.dead_letter(s, "g", eid, fields, error="e", consumer="w", attempts=1),
        "ack": lambda: api.ack(s, "g", [eid]),
        "settle": lambda: api.settle(s, "g", [eid]),
        "settle_many": lambda: api.settle_many("g", {s: [eid], s + "g": []}),
        "dead_letter_entry": lambda: api.dead_letter_entry(s, eid, fields, error="e", consumer="c"),
        "dead_letters": lambda: (api.dead_letters(s), api.dead_letters(s, "0-1")),
    }.items():
        with mon.window(name):
            call()
    letters = [to for to, _ in rds.xrange(dlq_key(s))]
    with mon.window("replay_dead_letter"):
        api.replay_dead_letter(s, letters[0], {"data": "{}"})
    with mon.window("delete_dead_letter"):
        api.delete_dead_letter(s, letters[1])
    with mon.window("delete_dead_letters"):
        api.delete_dead_letters(s, letters[2:])
    with mon.window("destroy_group"):
        api.destroy_group(s, "g")
        api.destroy_group("no-such-stream", "g")


def _bookkeeping(api: RedisStreams, mon: Monitor, rds: Any, s: str) -> None:
    rds.hset(f"unilog:consumers:{s}x", "c", "0-0")  # a key of stream sx in the layout before hash tags
    for name, call in {
        "register": lambda: api.register(s, "c", "0-0"),
        "register_many": lambda: api.register_many({(s, "c:a"): "0-0", (s + "m", "c:b"): "0-0"}),
        "registered": lambda: api.registered(s),
        "unregister": lambda: api.unregister(s, "c"),
        "trim": lambda: api.trim(s, min_id="0-1", max_len=1000),
        "partitions": lambda: api.partitions(s),
        "partitions_many": lambda: api.partitions_many([s, "sp"]),
        "set_partitions": lambda: (api.set_partitions("sp", 2), api.set_partitions("sp", 2)),
        "heartbeat": lambda: api.heartbeat(s, "c", "w", 10),
        "leave": lambda: api.leave(s, "c", "w"),
        "legacy_keys": lambda: api.legacy_keys(s + "x"),
        "legacy_keys_many": lambda: api.legacy_keys_many([s, s + "x"]),
        "relayout": lambda: api.relayout(s + "x"),
        "close": api.close,
    }.items():
        with mon.window(name):
            call()


def _async_twins(url: str, mon: Monitor, rds: Any, s: str) -> set[str]:
    """The asyncio methods, each in a window named after its threaded twin."""
    rds.xadd(s, {"data": "{}"})

    async def run() -> set[str]:
        api = AsyncRedisStreams(connect_async(url))
        eid, fields = (await api.read(s, "0-0", 1, None))[0]
        calls: dict[str, Callable[[], Any]] = {
            "read": lambda: api.read(s, "0-0", 10, None),
            "read#wrongtype": lambda: api.read("not-a-stream", "0-0", 1, None),
            "missing_stream": lambda: api.missing_stream("no-such-stream"),
            "last_generated_id": lambda: api.last_generated_id(s),
            "register": lambda: api.register(s, "c", "0-0"),
            "register_many": lambda: api.register_many({(s, "c:a"): "0-0"}),
            "read_many": lambda: api.read_many({s: "0-0", "no-such-stream": "0-0"}, 10, None),
            "stream_names": lambda: api.stream_names(s[:3], 100),
            "missing_streams": lambda: api.missing_streams([s, "no-such-stream"]),
            "last_generated_ids": lambda: api.last_generated_ids([s, "no-such-stream"]),
            "wait_for_entries": lambda: api.wait_for_entries({s: "0-0"}, 1),
            "partitions": lambda: api.partitions(s),
            "heartbeat": lambda: api.heartbeat(s, "c", "w", 10),
            "leave": lambda: api.leave(s, "c", "w"),
            "dead_letter_entry": lambda: api.dead_letter_entry(s, eid, fields, error="e", consumer="c"),
            "ensure_group": lambda: api.ensure_group(s, "ag"),
            "read_group": lambda: api.read_group(s, "ag", "w", 10, None),
            "ensure_groups": lambda: api.ensure_groups([s, s + "ag"], "ag"),
            "read_group_many": lambda: api.read_group_many("ag", "w", {s: "0", s + "ag": ">"}, 10, None),
            "autoclaim": lambda: api.autoclaim(s, "ag", "w2", 0),
            "autoclaim_many": lambda: api.autoclaim_many([s], "ag", "w3", 60_000),
            "attempt": lambda: api.attempt(s, "ag", eid),
            "ack": lambda: api.ack(s, "ag", [eid]),
            "settle": lambda: api.settle(s, "ag", [eid]),
            "settle_many": lambda: api.settle_many("ag", {s: [eid]}),
            "dead_letter": lambda: api.dead_letter(s, "ag", eid, fields, error="e", consumer="w", attempts=1),
            "aclose": api.aclose,
        }
        for name, call in calls.items():
            with mon.window("aio:" + name):
                try:
                    await call()
                except WrongKeyType:
                    assert name.endswith("#wrongtype")
        return {name.partition("#")[0] for name in calls}

    return asyncio.run(run())


def test_every_adapter_method_issues_only_the_commands_it_declares(settings: Settings, rds: Any) -> None:
    s = settings.stream
    with Monitor(settings.redis_url) as mon:
        with mon.window("connect"):
            client = connect(settings.redis_url)
        with mon.window("ping"):
            ping(client, settings.redis_url)
        api = RedisStreams(client)
        _publish_and_read(api, mon, rds, s)
        _groups_and_letters(api, mon, rds, s)
        _bookkeeping(api, mon, rds, s)
        twins = _async_twins(settings.redis_url, mon, rds, s)
    seen = mon.seen()
    assert undeclared(seen, declared_by) == {}
    # every public method in a window of its own (``explained`` wraps others: the ``#wrongtype`` windows)
    public = {name for name in methods_of(RedisStreams) if not name.startswith("_")} - {"explained"}
    exercised = {label.partition("#")[0] for label in mon.labels if not label.startswith("aio:")}
    assert public - exercised == set(), "a method no window exercised"
    async_public = {name for name in methods_of(AsyncRedisStreams) if not name.startswith("_")} - {"explained"}
    assert async_public - twins == set(), "an asyncio method no window exercised"
    assert {"script|load", "evalsha", "wait", "xadd", "hset", "exists"} <= seen["publish"], "the script's commands"
    assert "type" in seen["publish#wrongtype"] and "type" in seen["aio:read#wrongtype"]
    assert {"multi", "exec"} <= seen["dead_letter"] and "xautoclaim" in seen["autoclaim"]
    if nil_claims(rds):
        assert {"xpending", "xrange"} <= seen["autoclaim"], "the ids of entries deleted while pending"
    assert "renamenx" in seen["relayout"]


async def _async_pending_but_gone(url: str, stream: str) -> list[bytes]:
    api = AsyncRedisStreams(connect_async(url))
    try:
        return await api._pending_but_gone(stream, "g", "c", page=2)
    finally:
        await api.aclose()


def test_both_faces_find_the_entries_deleted_while_pending(settings: Settings, rds: Any) -> None:
    """Redis 6.2 claims an entry deleted while pending as a nil, without its id: both faces find such ids among the
    consumer's pending entries (called directly here, so on any Redis version; pages of 2, one pipeline each)."""
    s = settings.stream
    ids = [rds.xadd(s, {"data": "{}"}) for _ in range(5)]
    rds.xgroup_create(s, "g", id="0")
    rds.xreadgroup("g", "c", {s: ">"}, count=5)
    rds.xdel(s, ids[1], ids[3])
    with Monitor(settings.redis_url) as mon:
        with mon.window("_pending_but_gone"):
            threaded = RedisStreams(connect(settings.redis_url))._pending_but_gone(s, "g", "c", page=2)
        with mon.window("aio:_pending_but_gone"):
            awaited = asyncio.run(_async_pending_but_gone(settings.redis_url, s))
    assert threaded == awaited == [ids[1].encode(), ids[3].encode()]
    assert undeclared(mon.seen(), declared_by) == {}
    seen = mon.seen()
    assert {"xpending", "xrange"} <= seen["_pending_but_gone"] and {"xpending", "xrange"} <= seen[
        "aio:_pending_but_gone"
    ]


class Planted(RedisStreams):
    @issues("xlen")
    def length_and_newest(self, stream: str) -> tuple[Any, Any]:
        """Declares XLEN, and issues XREVRANGE too."""
        return self.client.xlen(stream), self.client.xrevrange(stream, count=1)


class AsyncPlanted(AsyncRedisStreams):
    @issues("xlen")
    async def length_and_newest(self, stream: str) -> tuple[Any, Any]:
        """The same, in the asyncio face."""
        return await self.client.xlen(stream), await self.client.xrevrange(stream, count=1)


async def _async_planted(url: str, stream: str) -> None:
    api = AsyncPlanted(connect_async(url))
    try:
        await api.length_and_newest(stream)
    finally:
        await api.aclose()


def test_a_method_issuing_a_command_it_does_not_declare_is_caught(settings: Settings, rds: Any) -> None:
    s = settings.stream
    rds.xadd(s, {"data": "{}"})
    with Monitor(settings.redis_url) as mon:
        with mon.window("length_and_newest"):
            Planted(connect(settings.redis_url)).length_and_newest(s)
        with mon.window("aio:length_and_newest"):
            asyncio.run(_async_planted(settings.redis_url, s))

    def planted(label: str) -> frozenset[str]:
        face = AsyncPlanted if label.startswith("aio:") else Planted
        return allowed(getattr(face, label.removeprefix("aio:")), face)

    assert undeclared(mon.seen(), planted) == {
        "length_and_newest": {"xrevrange"},
        "aio:length_and_newest": {"xrevrange"},
    }
    # and a user given what it declares is refused the rest, which ACL LOG records
    user = f"planted-{uuid.uuid4().hex[:6]}"
    granted = sorted(commands_of(Planted.length_and_newest, Planted) | commands_of(ping))
    try:
        rds.execute_command("ACL", "SETUSER", user, "reset", "on", f">{PASSWORD}", f"~{s}", *(f"+{c}" for c in granted))
    except redis.ResponseError as exc:  # a Redis given by URL whose user may not manage ACLs
        pytest.skip(f"the test's Redis user may not create ACL users: {exc}")
    rds.execute_command("ACL", "LOG", "RESET")
    try:
        planted = Planted(connect(settings.redis_url.replace("redis://", f"redis://{user}:{PASSWORD}@")))
        with pytest.raises(redis.exceptions.NoPermissionError, match="xrevrange"):
            planted.length_and_newest(s)
        assert [(e["reason"], e["object"]) for e in rds.acl_log()] == [("command", "xrevrange")]
    finally:
        rds.execute_command("ACL", "DELUSER", user)


# -- every kind of process, under its ACL user, issues only what its ACL holds -------------------------------------


def _stage(settings: Settings) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for n in range(12):
            emit(conn, action="create", object="ride", data={"n": n, "poison": n == 5})
        for n in range(6):
            emit(conn, action="create", object="ride", data={"n": n}, key=f"k{n % 3}", stream=PARTS)


def _unilog(*argv: str) -> None:
    """The command in this process: it configures logging onto this test's captured stdout, which pytest closes
    after the test, so the defaults come back before the next test logs."""
    try:
        assert main(list(argv)) == 0, argv
    finally:
        structlog.reset_defaults()
        logging.basicConfig(level=logging.WARNING, force=True)


def _consumers(mon: Monitor, rds: Any, s: str, as_kind: Callable[[str], Settings]) -> None:
    """A checkpoint consumer with a dead letter (threaded and asyncio), a partitioned worker; then group workers
    that claim a stopped worker's entries (one deleted meanwhile) and dead-letter a poison record."""
    as_kind("consumer")
    with mon.window("consumer"):
        _unilog("consume", "handlers:poison_handler", "--name", "cli", "--once", "--on-poison", "dead-letter")
        _unilog("consume", "handlers:async_cli_handler", "--name", "acli", "--once")
        _unilog("consume", "handlers:cli_handler", "--name", "pc", "--partitioned", "--stream", PARTS, "--once")
    rds.xgroup_create(s, "g", id="0")
    rds.xreadgroup("g", "stopped", {s: ">"}, count=3)
    rds.xdel(s, rds.xrange(s, count=3)[-1][0])
    as_kind("group")
    with mon.window("group"):
        worker = ["--group", "g", "--worker", "w1", "--claim-idle-ms", "1", "--max-deliveries", "1", "--once"]
        _unilog("consume", "handlers:poison_handler", *worker)
        _unilog("consume", "handlers:async_group_handler", "--group", "ag", "--once")


def _operator(mon: Monitor, settings: Settings, rds: Any, s: str) -> None:
    letters = [eid for eid, _ in rds.xrange(dlq_key(s))]
    assert len(letters) == 2, "the consumer's and the group's"
    with mon.window("operator"):
        for argv in (
            ["status", "--json"],
            ["dlq", "list"],
            ["dlq", "replay", letters[0]],
            ["dlq", "drop", letters[1]],
            ["consumer", "register", "late"],
            ["consumer", "unregister", "late"],
            ["consumer", "reset", "cli", "--to", "end"],
            ["stream", "relayout", s, PARTS],
        ):
            _unilog(*argv)
        admin.declare(settings, s, consumers=["declared"], groups=["declared"])
        _unilog("consumer", "delete", "declared")
        _unilog("group", "delete", "declared")


def test_each_kind_of_process_issues_only_what_its_acl_user_may(
    settings: Settings, rds: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    s = settings.stream
    monkeypatch.setenv("DATABASE_URL", settings.database_url)
    monkeypatch.setenv("UNILOG_STREAM", s)
    _stage(settings)
    with acl_users(settings, rds, [s, PARTS], PASSWORD) as users, Monitor(settings.redis_url) as mon:
        rds.execute_command("ACL", "LOG", "RESET")
        rds.script_flush()

        def as_kind(kind: str) -> Settings:
            monkeypatch.setenv("REDIS_URL", users[kind])
            return Settings(database_url=settings.database_url, redis_url=users[kind], stream=s)

        as_kind("operator")
        with mon.window("operator"):
            _unilog("stream", "partition", PARTS, "2")
        config = StreamerConfig(retention_interval=0, max_len=10_000)
        with mon.window("streamer"), Streamer(as_kind("streamer"), config) as streamer:
            streamer.drain()
        _consumers(mon, rds, s, as_kind)
        rds.xgroup_create(s, "held", id="0")
        rds.xreadgroup("held", "idle", {s: ">"}, count=1)  # a group with a pending entry holds retention back
        with psycopg.connect(settings.conninfo) as conn:  # a record to publish: the streamer holds the stream again
            emit(conn, action="create", object="ride", data={"n": 12})
        with mon.window("streamer"), Streamer(as_kind("streamer"), config) as streamer:
            streamer.drain()  # retention: registrations, groups, pending entries, XTRIM
        _operator(mon, as_kind("operator"), rds, s)
        denials = rds.acl_log()
    capsys.readouterr()
    seen = mon.seen()
    assert denials == [], denials
    assert {kind: sorted(seen[kind] - set(acl.COMMANDS[kind])) for kind in acl.KINDS} == {
        kind: [] for kind in acl.KINDS
    }
    # the runs went where the commands are: scripts, retention, dead letters, claims, heartbeats, relayout
    assert {"evalsha", "script|load", "xadd", "xtrim", "xpending", "xinfo|groups", "scan"} <= seen["streamer"]
    assert {"xread", "xadd", "zadd", "zcard", "zrem", "hset", "scan"} <= seen["consumer"]
    assert {"xautoclaim", "multi", "xadd", "exec", "hincrby", "xgroup|create", "xack"} <= seen["group"]
    assert "xpending" in seen["group"] or not nil_claims(rds)
    assert {"hsetnx", "xdel", "multi", "exec", "scan", "xgroup|create", "xlen"} <= seen["operator"]


def test_the_acl_lists_are_the_declarations_of_the_methods_each_kind_calls() -> None:
    for kind, uses in acl.USES.items():
        declared = {c for used in uses for c in commands_of(used, RedisStreams)} | commands_of(ping)
        assert set(acl.COMMANDS[kind]) == declared
    line = acl.acl_line("group", "u", ["s"])
    assert "+xautoclaim" in line and "+evalsha" not in line and "~unilog:attempts:{s}:*" in line
    assert shlex.split(line)[:5] == ["ACL", "SETUSER", "u", "reset", "on"]


def test_every_method_of_the_adapter_declares_its_commands() -> None:
    """Both faces: the threaded classes (hand-written and generated) and their asyncio sources."""
    concerns = {c for face in (RedisStreams, AsyncRedisStreams) for c in face.__mro__}
    silent = [
        f"{concern.__name__}.{name}"
        for concern in concerns
        if concern.__module__.startswith("unilog.engine")
        for name, value in vars(concern).items()
        if callable(value) and not name.startswith("__") and declared(value) is None
    ]
    assert silent == []
    assert "unilog.engine._sync.groups" in {c.__module__ for c in RedisStreams.__mro__}
    assert all(declared(f) is not None for f in (connect, ping, raw_pages, ids_many))
    with pytest.raises(ValueError, match="lower case"):
        issues("XADD")
    # the declaration marks a coroutine function (and an asyncio context manager) without changing what it is
    assert inspect.iscoroutinefunction(AsyncRedisStreams.read) and declared(AsyncRedisStreams.read) == {"xread"}
    assert declared(AsyncRedisStreams.explained) == {"type"}
