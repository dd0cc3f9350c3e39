"""docker-compose.yml: its structure (always, with PyYAML) and its validity per Compose itself (when installed).

The structural tests need no Docker: they check that the compose fleet is the Procfile's fleet, on durable servers,
started in the right order. The validation tests run ``docker compose config -q`` (Compose v2) or, failing that,
``docker-compose config -q`` (v1, e.g. Debian's 1.29); neither needs a Docker engine. They also prove the validator
rejects a broken file, so a validator that accepts anything cannot pass them.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
PROCFILE = ROOT / "Procfile"
ENV_EXAMPLE = ROOT / ".env.example"
PROMETHEUS_DIR = ROOT / "compose" / "prometheus"
PASSWORDS = ("POSTGRES_PASSWORD", "APP_DB_PASSWORD", "APP_REDIS_PASSWORD", "REDIS_ADMIN_PASSWORD")
# each process that serves Prometheus metrics, and the port (unilog.metrics on 9100; the exporter on its own)
METRICS_PORTS = {name: 9100 for name in ("streamer", "streamer2", "consumer0", "consumer1", "group0a", "group0b")}
METRICS_PORTS |= {"spark": 9100, "exporter": 9464}

INFRA = ("postgres", "redis")
# Variables the compose file interpolates: validated with their defaults, whatever the caller's environment says.
INTERPOLATED = (
    "POSTGRES_PASSWORD",
    "APP_DB_PASSWORD",
    "APP_REDIS_PASSWORD",
    "REDIS_ADMIN_PASSWORD",
    "API_PORT",
    "EXPORTER_PORT",
    "DASHBOARD_PORT",
    "STREAMER_FAULTS",
    "CONSUMER_FAULTS",
    "SIMULATOR_RATE",
    "SPARK_MASTER",
    "POSTGRES_IMAGE",
    "REDIS_IMAGE",
    "PYTHON_IMAGE",
    "PROMETHEUS_IMAGE",
    "PROMETHEUS_PORT",
    "APP_IMAGE",
)
# the Postgres role and the Redis user each kind of process connects as (services/migrate.py, unilog acl)
ROLES = {
    "api": ("rides_api", None),
    "streamer": ("unilog_streamer", "unilog-streamer"),
    "streamer2": ("unilog_streamer", "unilog-streamer"),
    "consumer0": ("rides_consumer", "unilog-consumer"),
    "consumer1": ("rides_consumer", "unilog-consumer"),
    "group0a": ("rides_consumer", "unilog-group"),
    "group0b": ("rides_consumer", "unilog-group"),
    "spark": ("rides_consumer", "unilog-consumer"),
    "exporter": ("unilog_operator", "unilog-operator"),
    "dashboard": ("unilog_operator", "unilog-operator"),
}
_VAR = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::?-(?P<default>[^}]*))?\}")


def interpolate(value: str) -> str:
    """``${VAR:-default}`` / ``${VAR-default}`` replaced by their defaults, as Compose would with VAR unset."""
    return _VAR.sub(lambda m: m.group("default") or "", value)


def procfile_services() -> list[str]:
    names = []
    for line in PROCFILE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            names.append(line.split(":", 1)[0].strip())
    return names


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(document, dict) and isinstance(document.get("services"), dict), "no services: mapping"
    return document


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the KEY=VALUE list form
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {key: interpolate(str(value)) for key, value in env.items()}


def argv(command: str | list[str]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(part) for part in command]


def image_major(image: str) -> str:
    """The major version of an ``name:tag`` image (``postgres:16.4-bookworm`` -> ``16``)."""
    tag = image.rpartition(":")[2] if ":" in image.rsplit("/", 1)[-1] else ""
    return re.split(r"[.\-]", tag, maxsplit=1)[0]


def health_test(service: dict[str, Any]) -> str:
    test = (service.get("healthcheck") or {}).get("test")
    assert test, "no healthcheck test"
    return " ".join(argv(test))


# -- structure (no Docker needed) -----------------------------------------------------------------------------------


def test_every_procfile_process_has_a_compose_service(services: dict[str, dict[str, Any]]) -> None:
    expected = procfile_services()
    assert set(expected) == {
        "api",
        "streamer",
        "streamer2",
        "consumer0",
        "consumer1",
        "group0a",
        "group0b",
        "spark",
        "simulator",
        "exporter",
        "dashboard",
    }, "the Procfile changed"
    missing = [name for name in expected if name not in services]
    assert not missing, f"Procfile processes without a compose service: {missing}"


def test_servers_are_postgres_16_and_redis_7(services: dict[str, dict[str, Any]]) -> None:
    postgres, redis = interpolate(services["postgres"]["image"]), interpolate(services["redis"]["image"])
    assert postgres.startswith("postgres:") and image_major(postgres) == "16", postgres
    assert redis.startswith("redis:") and image_major(redis) == "7", redis
    assert environment(services["postgres"]).get("POSTGRES_DB") == "rocket_rides"
    assert environment(services["postgres"]).get("POSTGRES_PASSWORD")


def test_redis_is_durable(compose: dict[str, Any], services: dict[str, dict[str, Any]]) -> None:
    command = argv(services["redis"]["command"])
    assert command[0] == "redis-server"
    options = " ".join(command[1:])
    assert re.search(r"--appendonly\s+yes\b", options), command
    assert re.search(r"--appendfsync\s+always\b", options), command
    assert any(str(volume).split(":")[1] == "/data" for volume in services["redis"].get("volumes", [])), "no /data"
    named = [str(v).split(":")[0] for name in INFRA for v in services[name].get("volumes", [])]
    assert named and all(volume in (compose.get("volumes") or {}) for volume in named), f"unnamed volumes: {named}"


def test_health_checks(services: dict[str, dict[str, Any]]) -> None:
    assert "pg_isready" in health_test(services["postgres"])
    assert "redis-cli ping" in health_test(services["redis"])
    assert environment(services["redis"]).get("REDISCLI_AUTH"), "the health check's redis-cli needs the admin password"
    # `python -m unilog.health URL`: one word per argument (Podman's Docker API splits CMD arguments on spaces)
    expected = {"api": ":5000/health", "exporter": ":9464/readyz", "dashboard": ":8765/api/status"}
    expected |= {name: ":9100/readyz" for name in ("streamer", "streamer2", "consumer0", "consumer1", "group0a")}
    for name, url in expected.items():
        test = argv((services[name].get("healthcheck") or {}).get("test") or [])
        assert test[:4] == ["CMD", "python", "-m", "unilog.health"] and test[4].endswith(url), (name, test)
        assert not any(" " in part for part in test), (name, test)


def test_app_services_wait_for_healthy_servers_and_a_finished_migration(services: dict[str, dict[str, Any]]) -> None:
    for name in procfile_services():
        depends_on = services[name].get("depends_on")
        assert isinstance(depends_on, dict), f"{name}: depends_on must use the long form with conditions"
        conditions = {dep: (spec or {}).get("condition") for dep, spec in depends_on.items()}
        assert conditions.get("postgres") == "service_healthy", f"{name}: {conditions}"
        assert conditions.get("redis") == "service_healthy", f"{name}: {conditions}"
        assert conditions.get("migrate") == "service_completed_successfully", f"{name}: {conditions}"
        assert services[name].get("restart") == "unless-stopped", f"{name} is long-running"
    assert services["simulator"]["depends_on"].get("api", {}).get("condition") == "service_healthy"


def test_migrate_runs_once_after_postgres(services: dict[str, dict[str, Any]]) -> None:
    migrate = services["migrate"]
    assert argv(migrate["command"]) == ["python", "-m", "services.migrate", "--grant-roles", "--capture", "wal"]
    env = environment(migrate)
    assert re.fullmatch(r"postgresql://postgres:[^@]+@postgres:5432/rocket_rides", env["DATABASE_URL"]), env
    assert re.fullmatch(r"redis://default:[^@]+@redis:6379/0", env["REDIS_URL"]), "the switch settles through Redis"
    assert env.get("APP_DB_PASSWORD")
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert migrate["depends_on"]["redis"]["condition"] == "service_healthy"
    assert str(migrate.get("restart")) == "no"


def test_the_stack_runs_in_wal_capture_mode(services: dict[str, dict[str, Any]]) -> None:
    """Issue 33: its Postgres allows logical decoding, and migrate switches the database to WAL mode."""
    assert argv(services["postgres"]["command"]) == ["postgres", "-c", "wal_level=logical"]
    assert argv(services["migrate"]["command"])[-2:] == ["--capture", "wal"]


def test_processes_run_the_procfile_commands(services: dict[str, dict[str, Any]]) -> None:
    api = argv(services["api"]["command"])
    assert api[0] == "gunicorn" and "services.api:app" in api
    assert "0.0.0.0:5000" in api, "the API must listen on all interfaces inside its container"
    assert any(interpolate(str(port)).endswith(":5000") for port in services["api"].get("ports", []))
    assert argv(services["streamer"]["command"])[:2] == ["unilog", "streamer"]
    for name in ("consumer0", "consumer1"):
        assert argv(services[name]["command"]) == ["python", "-m", "services.consumer", name]
    assert argv(services["simulator"]["command"]) == ["python", "-m", "services.simulator"]


def test_app_environment(services: dict[str, dict[str, Any]]) -> None:
    """Each process connects as its own role and Redis user, never as the superuser or Redis's default user."""
    for name, (role, user) in ROLES.items():
        env = environment(services[name])
        assert re.fullmatch(rf"postgresql://{role}:[^@]+@postgres:5432/rocket_rides", env.get("DATABASE_URL", "")), (
            name,
            env,
        )
        if user:
            assert re.fullmatch(rf"redis://{user}:[^@]+@redis:6379/0", env.get("REDIS_URL", "")), (name, env)
        assert env.get("UNILOG_STREAM") == "rocket-rides-log", name
        assert "build" in services[name] or "image" in services[name], name
    assert environment(services["streamer"])["UNILOG_FAULTS"] == "streamer.double_send=0.1"
    for name in ("consumer0", "consumer1"):
        assert environment(services[name])["UNILOG_FAULTS"] == "consumer.crash_before_commit=0.1"
    assert environment(services["simulator"])["API_URL"] == "http://api:5000"
    assert "UNILOG_FAULTS" not in environment(services["api"]), "faults belong to the streamer and consumers"


def test_exporter_dashboard_and_redis_users(services: dict[str, dict[str, Any]]) -> None:
    assert argv(services["exporter"]["command"])[:2] == ["unilog", "metrics"]
    dashboard = argv(services["dashboard"]["command"])
    assert dashboard[:2] == ["unilog", "dashboard"] and "--read-only" in dashboard, dashboard
    for name in ("exporter", "dashboard"):
        assert "0.0.0.0" in argv(services[name]["command"]), f"{name} must listen on all interfaces in its container"
    users = " ".join(argv(services["redis-users"]["command"]))
    assert "unilog acl --aclfile" in users and "--admin-password" in users, users
    redis = " ".join(argv(services["redis"]["command"]))
    assert "--aclfile /etc/redis/acl/users.acl" in redis, redis
    assert services["redis"]["depends_on"]["redis-users"]["condition"] == "service_completed_successfully"
    assert str(services["redis-users"].get("restart")) == "no"


def test_images_can_be_swapped(services: dict[str, dict[str, Any]]) -> None:
    """Official images by default; POSTGRES_IMAGE, REDIS_IMAGE, PYTHON_IMAGE (a build argument) select others."""
    assert services["postgres"]["image"] == "${POSTGRES_IMAGE:-postgres:16}"
    assert services["redis"]["image"] == "${REDIS_IMAGE:-redis:7}"
    assert services["api"]["build"]["args"]["PYTHON_IMAGE"] == "${PYTHON_IMAGE:-python:3.11-slim}"
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "ARG PYTHON_IMAGE=python:3.11-slim\nFROM ${PYTHON_IMAGE}" in dockerfile


def seconds(duration: str) -> float:
    """A compose duration (``30s``, ``1m30s``, ``1h``) in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"not a duration: {duration!r}"
    return sum(float(n) * units[u] for n, u in parts)


def test_every_container_has_a_stop_grace_period(services: dict[str, dict[str, Any]]) -> None:
    """Without one, Podman's Docker API gives a container 0 s: `podman restart` would SIGKILL Postgres."""
    for name, service in services.items():
        grace = service.get("stop_grace_period")
        assert grace and seconds(str(grace)) >= 10, f"{name}: stop_grace_period {grace!r}"
    postgres = services["postgres"]
    assert postgres.get("stop_signal") == "SIGINT", "Postgres's fast shutdown; SIGTERM waits for every client"
    assert seconds(postgres["stop_grace_period"]) >= 30, "the shutdown checkpoint needs time"


def env_example() -> dict[str, str]:
    """The variables .env.example sets, and (empty) those it names in a commented ``# NAME=value`` line."""
    found: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        match = re.fullmatch(r"(#\s*)?([A-Z][A-Z0-9_]*)=(.*)", line.strip())
        if match:
            found[match.group(2)] = "" if match.group(1) else match.group(3)
    return found


def test_env_example_sets_the_passwords_and_names_every_variable() -> None:
    """The guide says to change the passwords in .env: .env.example has all four, and every variable the compose
    file reads (INTERPOLATED is that list, kept equal to the file)."""
    interpolated = {m.group("name") for m in _VAR.finditer(COMPOSE_FILE.read_text())}
    assert interpolated == set(INTERPOLATED), "INTERPOLATED is out of date"
    variables = env_example()
    missing = sorted(interpolated - variables.keys())
    assert not missing, f".env.example does not name {missing}"
    assert all(variables.get(name) for name in PASSWORDS), {name: variables.get(name) for name in PASSWORDS}
    assert ".env" in (ROOT / ".gitignore").read_text().split(), ".env holds passwords: keep it out of git"
    guide = (ROOT / "docs" / "guides" / "compose.md").read_text()
    assert "cp .env.example .env" in guide


def test_prometheus_scrapes_every_process_and_loads_the_alert_rules(services: dict[str, dict[str, Any]]) -> None:
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"], config.get("rule_files")
    targets = {
        target
        for job in config["scrape_configs"]
        for static in job.get("static_configs", [])
        for target in static["targets"]
    }
    assert targets == {f"{name}:{port}" for name, port in METRICS_PORTS.items()}, targets
    # a process that serves metrics and is not in METRICS_PORTS (a new streamer or consumer) fails here
    for name, service in services.items():
        command = " ".join(argv(service.get("command") or []))
        if re.search(r"unilog (streamer|consume|metrics)\b|services\.(consumer|spark_consumer)\b", command):
            assert name in METRICS_PORTS, f"{name} serves metrics and Prometheus does not scrape it"
    for name, port in METRICS_PORTS.items():
        env, command = environment(services[name]), argv(services[name]["command"])
        if name == "exporter":
            assert command[command.index("--port") + 1] == str(port) and "0.0.0.0" in command
        elif name == "spark":
            assert command[command.index("--metrics-port") + 1] == str(port), command
            assert command[command.index("--metrics-addr") + 1] == "0.0.0.0", command
        else:
            assert (env.get("UNILOG_METRICS_PORT"), env.get("UNILOG_METRICS_ADDR")) == (str(port), "0.0.0.0"), name
    prometheus = services["prometheus"]
    assert "./compose/prometheus:/etc/prometheus:ro" in prometheus["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in argv(prometheus["command"])
    assert "/-/ready" in health_test(prometheus)


def _resolves(dotted: str) -> bool:
    """Whether ``a.b.c`` is a module, or an attribute of the longest module prefix (``services`` is the demo)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        try:
            target: Any = importlib.import_module(name.replace("services", "unilog_demo", 1))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(target, attr):
                return False
            target = getattr(target, attr)
        return True
    return False


def test_the_stack_files_name_only_modules_and_paths_that_exist() -> None:
    """Comments and commands in the Dockerfiles, the compose file, .env.example and compose/ name real things."""
    files = [ROOT / "Dockerfile", COMPOSE_FILE, ENV_EXAMPLE]
    files += [p for p in (ROOT / "compose").rglob("*") if p.is_file()]
    wrong = []
    for path in files:
        text = path.read_text()
        for match in re.finditer(r"(?<![\w/.-])(?:unilog|services|unilog_demo)(?:\.[A-Za-z_]\w*)+", text):
            if not _resolves(match.group()):
                wrong.append(f"{path.relative_to(ROOT)}: module {match.group()}")
        pattern = r"(?<![\w/.-])(?:tools|docs|examples|compose|services|migrations|bench|tests|unilog)/[\w./-]*"
        for match in re.finditer(pattern, text):
            if not (ROOT / match.group().rstrip(".")).exists():
                wrong.append(f"{path.relative_to(ROOT)}: path {match.group()}")
    assert not wrong, wrong


# -- validation by Compose itself ------------------------------------------------------------------------------------


def _works(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def find_compose() -> list[str] | None:
    """``docker compose`` if the v2 plugin works, else the ``docker-compose`` binary, else None."""
    docker = shutil.which("docker")
    if docker and _works([docker, "compose", "version"]):
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    if legacy and _works([legacy, "version"]):
        return [legacy]
    return None


@pytest.fixture(scope="module")
def compose_config() -> Callable[[Path], subprocess.CompletedProcess[str]]:
    cli = find_compose()
    if cli is None:
        pytest.skip("neither `docker compose` (Compose v2) nor `docker-compose` is installed; cannot validate")
    env = {key: value for key, value in os.environ.items() if key not in INTERPOLATED}

    def run(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cli, "-f", str(path), "config", "-q"],
            cwd=path.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    return run


def test_compose_accepts_the_file(compose_config: Callable[[Path], subprocess.CompletedProcess[str]]) -> None:
    result = compose_config(COMPOSE_FILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_reads_the_passwords_from_env_example(tmp_path: Path) -> None:
    """``.env.example`` copied to ``.env`` (the guide's step): every process gets its passwords from it."""
    cli = find_compose()
    if cli is None:
        pytest.skip("neither `docker compose` (Compose v2) nor `docker-compose` is installed; cannot validate")
    env = {key: value for key, value in os.environ.items() if key not in INTERPOLATED}
    shutil.copy(COMPOSE_FILE, tmp_path / "docker-compose.yml")
    shutil.copy(ENV_EXAMPLE, tmp_path / ".env")
    result = subprocess.run(
        [*cli, "-f", "docker-compose.yml", "config"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    resolved = yaml.safe_load(result.stdout)["services"]
    passwords = env_example()
    assert environment(resolved["postgres"])["POSTGRES_PASSWORD"] == passwords["POSTGRES_PASSWORD"]
    assert f":{passwords['APP_DB_PASSWORD']}@" in environment(resolved["api"])["DATABASE_URL"]
    assert f":{passwords['APP_REDIS_PASSWORD']}@" in environment(resolved["consumer0"])["REDIS_URL"]
    assert environment(resolved["redis"])["REDISCLI_AUTH"] == passwords["REDIS_ADMIN_PASSWORD"]


@pytest.mark.parametrize(
    ("original", "broken", "bad_key"),
    [
        ("    healthcheck:", "    healthchek:", "healthchek"),  # a typo in a service's key
        ("    condition: service_healthy", "    conditon: service_healthy", "conditon"),  # ...in a depends_on entry
    ],
)
def test_compose_rejects_a_typo(
    compose_config: Callable[[Path], subprocess.CompletedProcess[str]],
    tmp_path: Path,
    original: str,
    broken: str,
    bad_key: str,
) -> None:
    text = COMPOSE_FILE.read_text()
    assert original in text, f"{original!r} not in docker-compose.yml; update this test"
    copy = tmp_path / "docker-compose.yml"
    copy.write_text(text.replace(original, broken, 1))
    shutil.copy(ROOT / "Dockerfile", tmp_path / "Dockerfile")  # the build context stays plausible
    result = compose_config(copy)
    assert result.returncode != 0, f"the validator accepted an unknown key {bad_key!r}:\n{result.stdout}"
    assert bad_key in result.stdout + result.stderr, result.stdout + result.stderr
