"""docker-compose.yml run for real under Podman (slow): the fleet under its least-privilege roles and ACL users, health
checks on /readyz, rides posted to the API, every consumer equal to the ``rides`` table, a consumer and a streamer
killed mid-run, and every consumer equal again.

Skipped, with the reason, where Podman, debootstrap or docker-compose is missing or Podman cannot run containers.
Images come from tools/compose_podman.py: the Debian base and the stand-ins are built once and reused by tag; the
app image is rebuilt each run (layer cache: seconds when only the code changed). docs/guides/compose.md has the
figures.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from unilog_demo.rides import CANONICAL_SQL

ROOT = Path(__file__).parent.parent
pytestmark = pytest.mark.slow


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compose_podman", ROOT / "tools" / "compose_podman.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tool = _load_tool()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The fleet up and healthy under Podman; taken down with its volumes afterwards, whatever happened."""
    try:
        took = tool.build_images()
    except tool.Unusable as exc:
        pytest.skip(f"cannot run the compose file under Podman here: {exc}")
    print("image builds (s):", {tag: round(seconds) for tag, seconds in took.items()})
    ports = {"api": free_port(), "exporter": free_port(), "dashboard": free_port()}
    with tool.podman_service(tmp_path_factory.mktemp("podman")) as host:
        env = tool.compose_env(host, ports)
        try:
            tool.down(env)  # a stack left by an interrupted run
            print(f"fleet healthy in {tool.up(env):.0f} s")
            yield {"env": env, "ports": ports}
        finally:
            logs = subprocess.run(
                ["docker-compose", "-f", str(tool.COMPOSE_FILE), "logs", "--no-color", "--tail", "30"],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            print(logs.stdout[-20000:])
            tool.down(env)


def post_rides(port: int, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        body = json.dumps({"distance": 1 + (i * 7919 % 1000) / 100}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/rides", body, {"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 201


def psql(sql: str) -> list[list[str]]:
    """Rows of ``sql`` run by the database's owner inside the Postgres container (its port is not published)."""
    result = tool.run(
        ["podman", "exec", tool.container("postgres"), "psql", "-U", "postgres", "-d", "rocket_rides", "-At", "-c", sql]
    )
    return [line.split("|") for line in result.stdout.splitlines() if line]


def totals() -> tuple[list[str], dict[str, list[str]]]:
    canonical = psql(" ".join(CANONICAL_SQL.split()))[0]
    states = {row[0]: row[1:] for row in psql("SELECT name, total_distance, ride_count, checksum FROM consumer_states")}
    return canonical, states


def wait_agreement(rides: int, timeout: float = 120) -> dict[str, list[str]]:
    """Every consumer (consumer0, consumer1, the group) equal to the canonical totals of ``rides`` rides."""
    deadline = time.monotonic() + timeout
    while True:
        canonical, states = totals()
        assert int(canonical[1]) == rides, canonical
        if set(states) == {"consumer0", "consumer1", "group0"} and all(s == canonical for s in states.values()):
            return states
        assert time.monotonic() < deadline, f"consumers disagree with the rides table {canonical}: {states}"
        time.sleep(2)


def test_the_fleet_agrees_and_survives_killed_containers(stack: dict[str, Any]) -> None:
    port = stack["ports"]["api"]
    post_rides(port, 40)
    wait_agreement(40)

    # mid-run: rides keep coming while the active streamer (or its standby) and a consumer are killed
    poster = threading.Thread(target=post_rides, args=(port, 60, 40))
    poster.start()
    time.sleep(1)
    killed = [tool.container("consumer0"), tool.container("streamer")]
    tool.run(["podman", "kill", *killed])
    # Podman's restart policy does not restart a container it was told to kill (a stop by the user, for Podman),
    # so they are started again by hand; a process that exits by itself is restarted (below)
    time.sleep(3)
    tool.run(["podman", "start", *killed])
    poster.join(timeout=120)
    assert not poster.is_alive()
    tool.wait_healthy(["streamer", "consumer0"], time.monotonic() + 120)
    wait_agreement(100)


def test_restart_policy_restarts_a_process_that_exits(stack: dict[str, Any]) -> None:
    name = tool.container("group0a")
    before = int(tool.run(["podman", "inspect", "--format", "{{.RestartCount}}", name]).stdout)
    tool.run(["podman", "exec", name, "python", "-c", "import os,signal;os.kill(1,signal.SIGTERM)"])
    deadline = time.monotonic() + 60
    while int(tool.run(["podman", "inspect", "--format", "{{.RestartCount}}", name]).stdout) == before:
        assert time.monotonic() < deadline, "compose's restart policy did not restart group0a"
        time.sleep(1)
    tool.wait_healthy(["group0a"], time.monotonic() + 120)
    post_rides(stack["ports"]["api"], 10, 100)
    wait_agreement(110)


def test_exporter_and_read_only_dashboard(stack: dict[str, Any]) -> None:
    ports = stack["ports"]
    with urllib.request.urlopen(f"http://127.0.0.1:{ports['exporter']}/metrics", timeout=30) as response:
        metrics = response.read().decode()
    assert "unilog_system_up 1.0" in metrics, metrics[:2000]
    with urllib.request.urlopen(f"http://127.0.0.1:{ports['dashboard']}/api/status", timeout=30) as response:
        assert response.status == 200
    replay = urllib.request.Request(
        f"http://127.0.0.1:{ports['dashboard']}/api/dlq/rocket-rides-log/0-1/replay", b"", method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(replay, timeout=30)
    assert refused.value.code == 403, "the compose file's dashboard must be read-only"


def test_each_process_runs_under_its_own_role(stack: dict[str, Any]) -> None:
    """Nothing in the fleet connects as the superuser: only the init service did (it has exited)."""
    rows = psql(
        "SELECT DISTINCT usename FROM pg_stat_activity WHERE datname = 'rocket_rides' AND pid <> pg_backend_pid()"
    )
    users = {row[0] for row in rows}
    assert users and users <= {"rides_api", "unilog_streamer", "rides_consumer", "unilog_operator"}, users


def test_the_stack_streams_in_wal_capture_mode(stack: dict[str, Any]) -> None:
    """Issue 33: migrate left the database in WAL mode, and the active streamer streams from its slot."""
    ((slot,),) = psql("SELECT slot_name FROM unilog_capture")
    assert psql(f"SELECT active FROM pg_replication_slots WHERE slot_name = '{slot}'") == [["t"]], slot
    with urllib.request.urlopen(f"http://127.0.0.1:{stack['ports']['dashboard']}/api/status", timeout=30) as response:
        capture = json.loads(response.read())["status"]["capture"]
    assert capture["mode"] == "wal" and capture["active"], capture
