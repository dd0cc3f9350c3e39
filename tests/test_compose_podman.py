"""docker-compose.yml run for real under Podman (slow), as ``tools/compose_podman.py up`` runs it: the fleet under its
least-privilege roles and ACL users, the passwords from .env.example, health checks on /readyz kept running by the
tool's keeper after ``up`` returned, and the guide's ``ps``, ``logs`` and ``run`` through the socket it leaves. Rides
posted to the API reach every consumer, equal to the ``rides`` table, through killed consumers and streamers;
Postgres stopped within its grace period shuts down cleanly while the API answers 503 with ``Retry-After``;
Prometheus scrapes every process and loads the alert rules. Last, a consumer broken on purpose (stopped, then its
state corrupted) is seen by the same checks: they fail, and Prometheus fires ``UnilogProcessDown`` for it.

Each run is its own compose project (``unilogtest<pid>x<random>``), so it never takes down a stack someone else runs;
a stack left by a run whose process is gone is taken down first. Skipped, with the reason, where Podman,
debootstrap or docker-compose is missing or Podman cannot run containers. Images come from tools/compose_podman.py:
the Debian base and the stand-ins are built once and reused by tag; the app image is rebuilt each run (layer cache:
seconds when only the code changed). docs/guides/compose.md has the figures.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from compose_tool import tool  # tests/ is on sys.path
from unilog_demo.rides import CANONICAL_SQL

ROOT = Path(__file__).parent.parent
pytestmark = pytest.mark.slow
PREFIX = "unilogtest"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reap_abandoned() -> None:
    """Take down the stacks of earlier runs of this test whose process is gone (a run killed before its teardown);
    a stack whose test still runs, or any other project, is left alone."""
    listed = tool.run(["podman", "ps", "-a", "--format", '{{index .Labels "com.docker.compose.project"}}'])
    for project in set(listed.stdout.split()):
        match = re.fullmatch(rf"{PREFIX}(\d+)x[0-9a-f]+", project)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            tool.down(tool.open_stack(project, {}, ROOT / ".env.example"))


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, Any]]:
    """The fleet up and healthy under Podman, its own project; taken down with its volumes afterwards, whatever
    happened. The passwords are .env.example's."""
    try:
        took = tool.build_images()
    except tool.Unusable as exc:
        pytest.skip(f"cannot run the compose file under Podman here: {exc}")
    print("image builds (s):", {tag: round(seconds) for tag, seconds in took.items()})
    reap_abandoned()
    ports = {name: free_port() for name in ("api", "exporter", "dashboard", "prometheus")}
    project = f"{PREFIX}{os.getpid()}x{secrets.token_hex(3)}"
    compose = tool.open_stack(project, ports, ROOT / ".env.example")
    try:
        print(f"fleet healthy in {tool.up(compose):.0f} s")
        yield {"compose": compose, "ports": ports, "up_at": time.time()}
    finally:
        logs = subprocess.run(
            ["docker-compose", "logs", "--no-color", "--tail", "30"],
            env=compose.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        print(logs.stdout[-20000:])
        tool.down(compose)


def post_rides(port: int, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        body = json.dumps({"distance": 1 + (i * 7919 % 1000) / 100}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/rides", body, {"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 201


def psql(compose: Any, sql: str) -> list[list[str]]:
    """Rows of ``sql`` run by the database's owner inside the Postgres container (its port is not published)."""
    argv = ["podman", "exec", compose.container("postgres"), "psql", "-U", "postgres", "-d", "rocket_rides"]
    result = tool.run([*argv, "-At", "-c", sql])
    return [line.split("|") for line in result.stdout.splitlines() if line]


def wait_agreement(compose: Any, rides: int, timeout: float = 120) -> dict[str, list[str]]:
    """Every consumer (consumer0, consumer1, the group) equal to the canonical totals of ``rides`` rides."""
    deadline = time.monotonic() + timeout
    while True:
        canonical = psql(compose, " ".join(CANONICAL_SQL.split()))[0]
        rows = psql(compose, "SELECT name, total_distance, ride_count, checksum FROM consumer_states")
        states = {row[0]: row[1:] for row in rows}
        assert int(canonical[1]) == rides, canonical
        if set(states) == {"consumer0", "consumer1", "group0"} and all(s == canonical for s in states.values()):
            return states
        assert time.monotonic() < deadline, f"consumers disagree with the rides table {canonical}: {states}"
        time.sleep(2)


def disagreeing(compose: Any) -> set[str]:
    """The consumers whose state differs from the totals recomputed from ``rides``."""
    canonical = psql(compose, " ".join(CANONICAL_SQL.split()))[0]
    rows = psql(compose, "SELECT name, total_distance, ride_count, checksum FROM consumer_states")
    return {row[0] for row in rows if row[1:] != canonical}


def until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(2)
    return found


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def last_health_check(name: str) -> float:
    """When the container's last health check ended (Unix time; 0 if none is recorded)."""
    log = json.loads(tool.run(["podman", "inspect", "--format", "{{json .State.Health.Log}}", name]).stdout or "[]")
    if not log:
        return 0.0
    # RFC 3339 in nanoseconds, 2026-11-27T05:18:56.293092472Z: Python parses microseconds
    stamp = re.sub(r"(\.\d{6})\d*", r"\1", log[-1]["End"]).replace("Z", "+00:00")
    return datetime.fromisoformat(stamp).timestamp()


def test_the_socket_stays_and_the_guides_commands_work(stack: dict[str, Any]) -> None:
    """After ``up`` returned: ``ps``, ``logs``, ``exec`` and ``run`` through the socket the tool leaves (``env``
    prints it). ``run`` of a service that is running fails under Podman (docker-compose 1.29 links the one-off
    container to it, and Podman's API refuses links): the guide says ``exec`` for those."""
    compose = stack["compose"]
    exported = tool.run(
        [sys.executable, str(ROOT / "tools" / "compose_podman.py"), "env", "--project", compose.project]
    )
    assert f"export DOCKER_HOST=unix://{tool.state_folder(compose.project)}/podman.sock" in exported.stdout
    assert "export APP_DB_PASSWORD=change-me-app-db" in exported.stdout, "the passwords come from .env.example"
    assert "consumer0" in compose.compose("ps").stdout
    assert compose.compose("logs", "--no-color", "--tail", "5", "consumer0").returncode == 0
    status = compose.compose("exec", "-T", "exporter", "unilog", "status", timeout=300)
    assert "rocket-rides-log" in status.stdout, status.stdout
    assert "usage: unilog" in compose.compose("run", "--rm", "--no-deps", "-T", "simulator", "unilog", "--help").stdout


def test_health_checks_keep_running_after_up(stack: dict[str, Any]) -> None:
    """The keeper runs every container's check at its interval: each has one that ended after ``up`` returned."""
    names = [stack["compose"].container(service) for service in tool.FLEET]

    def stale() -> list[str]:
        return [name for name in names if last_health_check(name) <= stack["up_at"]]

    until(lambda: not stale(), 60, "a health check of each container after up")


def test_the_fleet_agrees_and_survives_killed_containers(stack: dict[str, Any]) -> None:
    compose, port = stack["compose"], stack["ports"]["api"]
    post_rides(port, 40)
    wait_agreement(compose, 40)

    # mid-run: rides keep coming while the active streamer (or its standby) and a consumer are killed
    poster = threading.Thread(target=post_rides, args=(port, 60, 40))
    poster.start()
    time.sleep(1)
    killed = [compose.container("consumer0"), compose.container("streamer")]
    tool.run(["podman", "kill", *killed])
    # Podman's restart policy does not restart a container it was told to kill (a stop by the user, for Podman),
    # so they are started again by hand; a process that exits by itself is restarted (below)
    time.sleep(3)
    tool.run(["podman", "start", *killed])
    poster.join(timeout=120)
    assert not poster.is_alive()
    # no check is run here: the keeper's, as for any container restarted after `up`
    tool.wait_healthy(compose, ["streamer", "consumer0"], time.monotonic() + 120)
    wait_agreement(compose, 100)


def test_restart_policy_restarts_a_process_that_exits(stack: dict[str, Any]) -> None:
    compose = stack["compose"]
    name = compose.container("group0a")
    before = int(tool.run(["podman", "inspect", "--format", "{{.RestartCount}}", name]).stdout)
    tool.run(["podman", "exec", name, "python", "-c", "import os,signal;os.kill(1,signal.SIGTERM)"])
    deadline = time.monotonic() + 60
    while int(tool.run(["podman", "inspect", "--format", "{{.RestartCount}}", name]).stdout) == before:
        assert time.monotonic() < deadline, "compose's restart policy did not restart group0a"
        time.sleep(1)
    tool.wait_healthy(compose, ["group0a"], time.monotonic() + 120)
    post_rides(stack["ports"]["api"], 10, 100)
    wait_agreement(compose, 110)


def test_postgres_stops_cleanly_and_the_api_answers_503_meanwhile(stack: dict[str, Any]) -> None:
    """``podman stop`` gives Postgres its grace period and SIGINT: a fast shutdown, no crash recovery on the next
    start. While it is down the API answers 503 with Retry-After; once it is back the fleet carries on."""
    compose, port = stack["compose"], stack["ports"]["api"]
    name = compose.container("postgres")
    assert tool.run(["podman", "inspect", "--format", "{{.Config.StopTimeout}}", name]).stdout.strip() == "60"

    def logs() -> str:
        result = tool.run(["podman", "logs", name])
        return result.stdout + result.stderr

    shutdowns = logs().count("database system is shut down")
    tool.run(["podman", "stop", name], timeout=120)
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/rides", b'{"distance": 1}', {"Content-Type": "application/json"}, method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 503 and int(refused.value.headers["Retry-After"]) > 0, refused.value.headers
    tool.run(["podman", "start", name])
    tool.wait_healthy(compose, ["postgres", "api", "streamer", "consumer0", "group0a"], time.monotonic() + 180)
    text = logs()
    assert text.count("database system is shut down") == shutdowns + 1, text[-3000:]
    assert "not properly shut down" not in text and "automatic recovery" not in text, text[-3000:]
    post_rides(port, 10, 110)
    wait_agreement(compose, 120)


def test_exporter_and_read_only_dashboard(stack: dict[str, Any]) -> None:
    ports = stack["ports"]
    with urllib.request.urlopen(f"http://127.0.0.1:{ports['exporter']}/metrics", timeout=30) as response:
        metrics = response.read().decode()
    assert "unilog_system_up 1.0" in metrics, metrics[:2000]
    with urllib.request.urlopen(f"http://127.0.0.1:{ports['dashboard']}/api/status", timeout=30) as response:
        assert response.status == 200
        assert response.headers["Server"] == "waitress", "the dashboard runs on a production WSGI server"
    replay = urllib.request.Request(
        f"http://127.0.0.1:{ports['dashboard']}/api/dlq/rocket-rides-log/0-1/replay", b"", method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(replay, timeout=30)
    assert refused.value.code == 403, "the compose file's dashboard must be read-only"


def test_each_process_runs_under_its_own_role(stack: dict[str, Any]) -> None:
    """Nothing in the fleet connects as the superuser: only the init service did (it has exited)."""
    rows = psql(
        stack["compose"],
        "SELECT DISTINCT usename FROM pg_stat_activity WHERE datname = 'rocket_rides' AND pid <> pg_backend_pid()",
    )
    users = {row[0] for row in rows}
    assert users and users <= {"rides_api", "unilog_streamer", "rides_consumer", "unilog_operator"}, users


def test_the_stack_streams_in_wal_capture_mode(stack: dict[str, Any]) -> None:
    """Issue 33: migrate left the database in WAL mode, and the active streamer streams from its slot."""
    compose = stack["compose"]
    ((slot,),) = psql(compose, "SELECT slot_name FROM unilog_capture")
    assert psql(compose, f"SELECT active FROM pg_replication_slots WHERE slot_name = '{slot}'") == [["t"]], slot
    with urllib.request.urlopen(f"http://127.0.0.1:{stack['ports']['dashboard']}/api/status", timeout=30) as response:
        capture = json.loads(response.read())["status"]["capture"]
    assert capture["mode"] == "wal" and capture["active"], capture


def test_prometheus_scrapes_every_process_and_loads_the_rules(stack: dict[str, Any]) -> None:
    """Every running streamer, consumer and the exporter is an `up` target; only the Spark consumer (not run here)
    is down, and no alert is about it. The rules loaded are alerts.yml's; the pages `up` prints answer."""
    url = f"http://127.0.0.1:{stack['ports']['prometheus']}"

    def health_by_instance() -> dict[str, str]:
        targets = get_json(url + "/api/v1/targets")["data"]["activeTargets"]
        return {t["labels"]["instance"]: t["health"] for t in targets}

    expected = {name: "up" for name in ("streamer", "streamer2", "consumer0", "consumer1", "group0a", "group0b")}
    expected |= {"exporter": "up", "spark": "down"}
    until(lambda: health_by_instance() == expected, 90, f"targets {expected} (last: {health_by_instance()})")
    groups = get_json(url + "/api/v1/rules")["data"]["groups"]
    loaded = {rule["name"] for group in groups for rule in group["rules"]}
    rules_file = (ROOT / "compose" / "prometheus" / "alerts.yml").read_text()
    assert loaded == set(re.findall(r"- alert: (\w+)", rules_file)), loaded
    # the Spark consumer never ran here: no UnilogProcessDown for it, not even pending (its `for` would hide it)
    alerts = get_json(url + "/api/v1/alerts")["data"]["alerts"]
    assert not [a for a in alerts if a["labels"].get("instance") == "spark"], alerts
    # the pages `up` prints open on this Prometheus (the stand-in's are under /classic/)
    for page in tool.prometheus_pages(url):
        with urllib.request.urlopen(page, timeout=30) as response:
            assert response.status == 200, page


def test_a_consumer_broken_on_purpose_fails_the_checks(stack: dict[str, Any]) -> None:
    """The checks above can fail. A stopped consumer: wait_agreement fails naming it, and Prometheus fires
    UnilogProcessDown for it (after the rule's `for: 1m`). A consumer whose state is wrong: wait_agreement fails.
    Each is repaired after, and the fleet agrees again."""
    compose, port = stack["compose"], stack["ports"]["api"]
    url = f"http://127.0.0.1:{stack['ports']['prometheus']}"
    name = compose.container("consumer1")

    def fired() -> set[tuple[str, str]]:
        alerts = get_json(url + "/api/v1/alerts")["data"]["alerts"]
        labels = [a["labels"] for a in alerts if a["state"] == "firing"]
        return {(a.get("alertname", ""), a.get("instance") or a.get("consumer") or "") for a in labels}

    def firing() -> bool:
        return ("UnilogProcessDown", "consumer1") in fired()

    assert fired() == set(), "the healthy stack (up for minutes by now) fires nothing"
    tool.run(["podman", "stop", name], timeout=120)
    post_rides(port, 10, 120)
    with pytest.raises(AssertionError, match="disagree"):
        wait_agreement(compose, 130, timeout=20)
    until(lambda: disagreeing(compose) == {"consumer1"}, 60, "every consumer but consumer1 to agree")
    until(firing, 180, "UnilogProcessDown to fire for the stopped consumer1")
    # over a minute later (the rules' `for` of 1-2 min passed meanwhile): only the stopped consumer's alert fires
    assert {alert for alert in fired() if alert[1] != "consumer1"} == set(), fired()
    tool.run(["podman", "start", name])
    wait_agreement(compose, 130)

    psql(compose, "UPDATE consumer_states SET ride_count = ride_count + 1 WHERE name = 'consumer1'")
    with pytest.raises(AssertionError, match="disagree"):
        wait_agreement(compose, 130, timeout=10)
    assert disagreeing(compose) == {"consumer1"}
    psql(compose, "UPDATE consumer_states SET ride_count = ride_count - 1 WHERE name = 'consumer1'")
    wait_agreement(compose, 130)
