"""Shared fixtures: the real servers come from unilog's own pytest plugin (unilog.harness.pytest_plugin)."""

from __future__ import annotations

import compileall
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from handlers import APPLIED_DDL  # tests/ is on sys.path: pytest puts a rootdir-less test folder there

from unilog import Settings
from unilog.harness.app import SPARK_SHORT_JVM


@pytest.hookimpl(tryfirst=True)  # before pytest's tmpdir plugin reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    """unilog's own suite runs on the servers ``DATABASE_URL`` / ``REDIS_URL`` name, when set (CONTRIBUTING.md: they
    must be throw-away), as the project's CI contract says. The plugin itself never takes those variables (an app's
    own servers): here they are handed to it as its test servers in so many words, and it still creates only
    databases of its own and refuses a Redis database that holds keys."""
    for app, test in (("DATABASE_URL", "UNILOG_TEST_DATABASE_URL"), ("REDIS_URL", "UNILOG_TEST_REDIS_URL")):
        if os.environ.get(app) and not os.environ.get(test):
            os.environ[test] = os.environ[app]
    if not hasattr(config, "workerinput"):
        _compile_the_project()
        # every Spark JVM of the suite (the sessions of test_spark.py, the fleets' consumers) is short-lived and
        # shares two cores: the JIT's quick tier alone (unilog.harness.app.SPARK_SHORT_JVM, measured there)
        for name, value in SPARK_SHORT_JVM.items():
            os.environ.setdefault(name, value)
    if os.geteuid() == 0 and config.option.basetemp is None and not hasattr(config, "workerinput"):
        # As root, tests' own servers run as an unprivileged user that must traverse the test's tmp_path; any other
        # pytest run on the machine resets /tmp/pytest-of-root to 0700 and cuts them off mid-test: a base of our own
        config.option.basetemp = _OWN_BASETEMP[0] = tempfile.mkdtemp(prefix="unilog-pytest-")


def _compile_the_project() -> None:
    """Byte-compile this checkout's packages once, before the workers start: an editable install has no ``.pyc``
    (pip compiles what it installs, not the checkout), and with ``PYTHONDONTWRITEBYTECODE`` set (as on this
    project's CI machine) every process the suite starts (some thousands: fleets, commands, chaos runs) compiled
    each unilog module it imported again (test_cli.py: 32.6 and 29.0 s without, 28.9 and 26.3 s with)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for package in ("unilog", "services", "tests"):
        compileall.compile_dir(os.path.join(root, package), quiet=2)


ROOT = Path(__file__).resolve().parent.parent
_OWN_BASETEMP = [""]  # the base this run made (removed after a run that passed; kept to read when one failed)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject's addopts): a worker per CPU and one more, each with throw-away servers of its own;
    none (a serial run) on servers given by URL, since some tests change server-wide state there (``maxmemory``,
    roles, ACL users) that a second worker's tests would meet."""
    del config  # the hook's signature
    given = ("DATABASE_URL", "REDIS_URL", "UNILOG_TEST_DATABASE_URL", "UNILOG_TEST_REDIS_URL")
    if any(os.environ.get(name) for name in given):
        return 0
    # one more than the CPUs: much of a test's time is waiting (servers starting, processes polled, a five-minute
    # fleet run at ten records a second), and the extra worker fills it. Two more were tried: the machine's two cores
    # were already the limit, so every test took about twice as long, the run no less, and two end-to-end verdicts
    # missed their marks at load 10-15
    return len(os.sched_getaffinity(0)) + 1


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest first, so parallel workers end together instead of one finishing a five-minute test alone: the
    durations the last run on this checkout recorded (pytest's cache), else those committed in
    ``tests/durations.json`` (a fresh clone's), else the ``slow`` marker. A module whose
    tests share a fixture of its own (a Spark session, a cluster, a built wheel) stays on one worker
    (``--dist loadgroup``) and in one piece, so the fixture is built once."""
    cache = getattr(config, "cache", None)  # None with -p no:cacheprovider
    known: dict[str, float] = _recorded() | (cache.get(DURATIONS_KEY, {}) if cache else {})

    def took(item: pytest.Item) -> float:
        slow = item.get_closest_marker("slow")  # @pytest.mark.slow(seconds=300): how long it runs, for a fresh clone
        return known.get(item.nodeid) or (float(slow.kwargs.get("seconds", 60)) if slow else 0.0)

    heavy_modules = {item.path.stem for item in items if _heavy(item)}
    lane: dict[int, str] = {}
    heavy_time: dict[str, float] = {}
    for item in items:
        if item.path.stem in CORE and not item.get_closest_marker("slow"):  # the inner loop leaves the long runs out
            item.add_marker(pytest.mark.core)
        shares = _shares_a_module_fixture(item)
        if _heavy(item) or (shares and item.path.stem in heavy_modules):
            unit = item.path.stem if shares else item.nodeid  # a shared fixture keeps its module in one piece
            lane[id(item)] = unit
            heavy_time[unit] = heavy_time.get(unit, 0.0) + took(item)
        elif shares:
            lane[id(item)] = item.path.stem
    heavy_lane = _spread(heavy_time, HEAVY_LANES)
    for key, name in lane.items():
        lane[key] = heavy_lane.get(name, name)
    groups: dict[str, float] = {}
    for item in items:
        if id(item) in lane:
            item.add_marker(pytest.mark.xdist_group(lane[id(item)]))
            groups[lane[id(item)]] = groups.get(lane[id(item)], 0.0) + took(item)
    order = {id(item): index for index, item in enumerate(items)}
    items.sort(key=lambda item: (-groups.get(lane.get(id(item), ""), took(item)), order[id(item)]))


# The end-to-end runs (a fleet, a chaos run, Spark, the compose stack) take two lanes, each one test at a time, spread
# over them by their known times, longest first (a module whose tests share a fixture of its own as one piece): three
# at once on two cores put the load past 14 and their verdicts' deadlines with it, and one lane alone was the suite's
# critical path (1,966 s of 2,044). A light one (@pytest.mark.slow(light=True): a fleet at ten records a second, a
# test slow only for the default run's length) runs beside the rest.
HEAVY = "end-to-end"
HEAVY_LANES = 2


def _spread(times: dict[str, float], lanes: int) -> dict[str, str]:
    """Each heavy test's (or module's) lane: the longest first, each into the lane with the least time so far."""
    load = [0.0] * lanes
    placed: dict[str, str] = {}
    for unit in sorted(times, key=lambda name: (-times[name], name)):
        emptiest = load.index(min(load))
        load[emptiest] += times[unit]
        placed[unit] = f"{HEAVY}-{emptiest + 1}"
    return placed


def _heavy(item: pytest.Item) -> bool:
    slow = item.get_closest_marker("slow")
    return slow is not None and not slow.kwargs.get("light", False)


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    module = item.nodeid.partition("::")[0]
    fixtures = getattr(item, "_fixtureinfo", None)
    if fixtures is None:
        return False
    return any(
        definition.scope != "function" and definition.baseid == module
        for definitions in fixtures.name2fixturedefs.values()
        for definition in definitions
    )


# The inner loop (`pytest -m core`, about a minute): the producer, the streamer, the consumers' exactly-once
# sequences and both loops' conformance, the engine, the generated faces
CORE = frozenset(
    f"test_{name}"
    for name in (
        "producer",
        "producers",
        "async_producer",
        "typed_records",
        "encoding",
        "malformed",
        "settings",
        "engine",
        "streamers",
        "conformance",
        "loop_conformance",
        "pipeline",
        "commit_order",
        "groups",
        "edges",
        "faces",
    )
)
DURATIONS_KEY = "unilog/durations"
# A fresh clone (the CI) has no cache: the times of a whole run, committed, spread the lanes there
# (`python tools/suite_durations.py` writes them from the last whole run's cache)
RECORDED = os.path.join(os.path.dirname(__file__), "durations.json")


def _recorded() -> dict[str, float]:
    try:
        with open(RECORDED) as file:
            return dict(json.load(file))
    except (OSError, ValueError):
        return {}


_durations: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each test's time (set-up, call and teardown) for the next run's order; under xdist the controller sees every
    worker's reports."""
    nodeid = report.nodeid.partition("@")[0]  # xdist's loadgroup appends "@group"
    _durations[nodeid] = _durations.get(nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _OWN_BASETEMP[0] and exitstatus == 0 and not hasattr(session.config, "workerinput"):
        shutil.rmtree(_OWN_BASETEMP[0], ignore_errors=True)
    cache = getattr(session.config, "cache", None)
    if cache is None or hasattr(session.config, "workerinput"):
        return  # the controller (or a serial run) records: a worker saw only its share
    cache.set(DURATIONS_KEY, cache.get(DURATIONS_KEY, {}) | _durations)


@pytest.fixture
def settings(unilog_settings: Settings) -> Settings:
    with psycopg.connect(unilog_settings.conninfo, autocommit=True) as conn:
        conn.execute(APPLIED_DDL)
    return unilog_settings


@pytest.fixture
def pg(settings: Settings) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test database, for set-up and assertions."""
    with psycopg.connect(settings.conninfo, autocommit=True) as conn:
        yield conn


@pytest.fixture
def wal(settings: Settings, pg: Any) -> Iterator[Settings]:
    """The test's database in WAL capture mode (producers' ``emit`` writes logical messages); skipped, saying why,
    on a server given by URL without wal_level=logical."""
    from unilog.stream.modes import enable_wal  # here: most tests never switch modes

    level = pg.execute("SHOW wal_level").fetchone()[0]
    if level != "logical":
        pytest.skip(f"the Postgres given by DATABASE_URL has wal_level={level}; WAL capture needs logical")
    enable_wal(settings)
    yield settings


@pytest.fixture
def rds(settings: Settings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def spans() -> Iterator[Any]:
    """An OpenTelemetry SDK with an in-memory exporter for this test only (the rest of the suite runs on the bare
    API, which records nothing); the test gets the exporter."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.util._once import Once

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        # OpenTelemetry sets its global provider once per process; its own test helpers reset it the same way
        trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
        trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def this_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's wheel, built once per run and shared by every suite worker. setuptools builds in the source
    tree (``build/``, ``*.egg-info``): two workers that built at once broke each other's build (CI, 2026-11-29:
    test_install_names' ``pip wheel`` failed while test_packaging's ran), so one builds under a file lock and the
    others take its wheel."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the workers' common folder
    out = shared / "this-wheel"
    with (shared / ".this-wheel.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not list(out.glob("unilog_outbox-*.whl")):
            fresh = shared / f"this-wheel.{os.getpid()}"
            shutil.rmtree(fresh, ignore_errors=True)
            subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(fresh), str(ROOT)],
                check=True, capture_output=True, timeout=300,
            )  # fmt: skip
            fresh.rename(out)  # whole or not at all: a worker never sees a half-written wheel
    (path,) = out.glob("unilog_outbox-*.whl")  # the distribution is unilog-outbox
    return path
