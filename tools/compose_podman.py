"""Run docker-compose.yml for real under Podman, where there is no Docker engine and no image registry.

    python tools/compose_podman.py images      # prepare Podman, build the base, the stand-ins and the app image
    python tools/compose_podman.py up          # ... then bring the fleet up and wait until every check passes
    eval "$(python tools/compose_podman.py env)"   # then docker-compose ps / logs / run work in this shell
    python tools/compose_podman.py down        # take it down (its volumes, its socket and its health checks)

``--project NAME`` (default ``unilogpodman``) picks the compose project: ``down`` touches only that one.

What it does, and why (docs/guides/compose.md says what was run):

- Podman refuses to start containers in a sandbox that refuses the default rlimits: ``/etc/containers/containers.conf``
  gets ``[containers] default_ulimits = []`` when it has no ``default_ulimits`` and may be written.
- No image can be pulled, so a Debian bookworm base is made by ``debootstrap --variant=minbase`` from the machine's
  Debian mirror and imported as ``localhost/debian:bookworm-slim``; the stand-ins for ``postgres:16``, ``redis:7``,
  ``python:3.11-slim`` and ``prom/prometheus`` (compose/standins/) are built FROM it with Debian's packages. Each is
  built only when its tag is missing (``--rebuild`` forces it). The app image is always built (Podman's layer cache
  makes an unchanged dependency layer free), without Spark (``SPARK=0``), with the machine's trust store mounted so
  pip can verify PyPI.
- Compose is Debian's ``docker-compose`` 1.29 against ``podman system service``: it honours ``depends_on``
  conditions, which podman-compose ignores. ``up`` leaves a keeper process per project (``keep``, detached) that
  serves Podman's Docker API on the project's socket and runs the health checks while the stack is up: Podman 4.3
  runs them from systemd timers only, so without it a container restarted later would stay "starting" forever.
  ``env`` prints the variables ``docker-compose`` needs to reach that stack (socket, project, file, passwords).
- The compose variables come from ``.env`` when it exists, else ``.env.example``.

Only the command line and ``podman``/``docker-compose`` are used: no unilog import, so it runs from any Python 3.11.
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import functools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
STANDINS = ROOT / "compose" / "standins"
CONTAINERS_CONF = Path("/etc/containers/containers.conf")

BASE_IMAGE = "localhost/debian:bookworm-slim"
# compose variable -> (stand-in tag, its folder under compose/standins)
STANDIN_IMAGES = {
    "POSTGRES_IMAGE": ("localhost/unilog-postgres:15", "postgres"),
    "REDIS_IMAGE": ("localhost/unilog-redis:7", "redis"),
    "PYTHON_IMAGE": ("localhost/unilog-python:3.11", "python"),
    "PROMETHEUS_IMAGE": ("localhost/unilog-prometheus:2", "prometheus"),
}
APP_IMAGE = "localhost/unilog-rocket-rides:podman"
PROJECT = "unilogpodman"
# the fleet the test runs: every long-running service but the Spark consumer (its image needs Java and pyspark, about
# 700 MB more) and the simulator (the test posts its own rides); the init services come with their dependants
FLEET = (
    "api",
    "streamer",
    "streamer2",
    "consumer0",
    "consumer1",
    "group0a",
    "group0b",
    "exporter",
    "dashboard",
    "prometheus",
)
DEFAULT_MIRROR = "http://deb.debian.org/debian"


class Unusable(Exception):
    """Podman, debootstrap or docker-compose is missing or cannot run containers here; the message says which."""


def run(cmd: Sequence[str], timeout: float = 600, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """``cmd``, its output captured; raises with the command's last output if it fails."""
    result = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        tail = (result.stdout + result.stderr)[-3000:]
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {result.returncode}:\n{tail}")
    return result


def check_tools() -> None:
    """Raise :class:`Unusable` unless podman, debootstrap and docker-compose are installed and Podman runs."""
    for tool in ("podman", "debootstrap", "docker-compose"):
        if shutil.which(tool) is None:
            raise Unusable(f"{tool} is not installed (Debian: apt-get install podman debootstrap docker-compose)")
    try:
        subprocess.run(["podman", "info"], capture_output=True, timeout=60, check=True)
    except (subprocess.SubprocessError, OSError) as exc:
        raise Unusable(f"podman cannot run here: {exc}") from None


def prepare_podman(conf: Path = CONTAINERS_CONF) -> None:
    """Give containers no default rlimits (this sandbox refuses Podman's), unless the file already decides."""
    text = conf.read_text() if conf.exists() else ""
    if not re.search(r"^\s*default_ulimits\s*=", text, re.MULTILINE):
        _set_in_conf(conf, text, "containers", "default_ulimits = []")


def prepare_runtime(conf: Path = CONTAINERS_CONF) -> None:
    """Podman's default runtime, crun, refuses to create a container on a host whose cgroups are in hybrid mode (v1
    controllers beside a cgroup2 mount: "cgroups in hybrid mode not supported"); runc runs them. When a container of
    the base cannot start for that reason, runc is installed and the file names no runtime, it gets ``[engine]
    runtime = "runc"``; a container that cannot start for any other reason makes Podman :class:`Unusable` here."""
    probe = subprocess.run(["podman", "run", "--rm", BASE_IMAGE, "true"], capture_output=True, text=True, timeout=300)
    if probe.returncode == 0:
        return
    output = " ".join((probe.stdout + probe.stderr).split())
    text = conf.read_text() if conf.exists() else ""
    named = re.search(r"^\s*runtime\s*=", text, re.MULTILINE)
    if "cgroups in hybrid mode" not in output or shutil.which("runc") is None or named:
        raise Unusable(f"podman cannot start a container here: {output[-300:]}")
    _set_in_conf(conf, text, "engine", 'runtime = "runc"')
    again = subprocess.run(["podman", "run", "--rm", BASE_IMAGE, "true"], capture_output=True, text=True, timeout=300)
    if again.returncode != 0:
        tail = " ".join((again.stdout + again.stderr).split())[-300:]
        raise Unusable(f"podman cannot start a container here, with runc either: {tail}")


def _set_in_conf(conf: Path, text: str, section: str, line: str) -> None:
    """Add ``line`` under ``[section]`` of containers.conf (``text``, its content), the section made if missing."""
    parser = configparser.ConfigParser()
    with contextlib.suppress(configparser.Error):
        parser.read_string(text)
    if parser.has_section(section):
        text = re.sub(rf"^\[{section}\]\s*$", f"[{section}]\n{line}", text, count=1, flags=re.M)
    else:
        text += f"\n[{section}]\n{line}\n"
    try:
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(text)
    except OSError as exc:
        raise Unusable(f"{conf} needs `{line}` under [{section}] and cannot be written: {exc}") from None


def image_exists(tag: str) -> bool:
    return subprocess.run(["podman", "image", "exists", tag], capture_output=True, timeout=60).returncode == 0


def image_id(tag: str) -> str:
    result = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else ""


def debian_mirror() -> str:
    """The machine's Debian mirror (the first ``.../debian`` URI in its APT sources), else deb.debian.org."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        with contextlib.suppress(OSError):
            for match in re.finditer(r"(https?://\S+/debian)/?(?:\s|$)", path.read_text()):
                return match.group(1)
    return DEFAULT_MIRROR


def build_base(tag: str = BASE_IMAGE) -> None:
    """A minimal Debian bookworm root made by debootstrap, imported as ``tag`` (the .debs it kept are dropped)."""
    with tempfile.TemporaryDirectory(prefix="unilog-rootfs-", dir="/var/tmp") as folder:
        root = Path(folder) / "bookworm"
        run(["debootstrap", "--variant=minbase", "bookworm", str(root), debian_mirror()], timeout=900)
        for deb in (root / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        try:
            run(["podman", "import", "-q", "-", tag], stdin=tar.stdout, timeout=600)
        finally:
            if tar.stdout:
                tar.stdout.close()
            tar.wait()


def build_images(rebuild: bool = False) -> dict[str, float]:
    """The base, the stand-ins (each when missing or ``rebuild``) and the app image; seconds each build took."""
    check_tools()
    prepare_podman()
    took: dict[str, float] = {}
    if rebuild or not image_exists(BASE_IMAGE):
        took[BASE_IMAGE] = replace_image(BASE_IMAGE, build_base)
    prepare_runtime()  # the stand-ins' builds run containers of the base
    for tag, folder in STANDIN_IMAGES.values():
        if rebuild or not image_exists(tag):
            # no trust-store mount here: their packages' scripts write /etc/ssl/certs (and they need no pip)
            argv = ["podman", "build", "-q", "--build-arg", f"BASE={BASE_IMAGE}", "-t", tag, str(STANDINS / folder)]
            took[tag] = replace_image(tag, functools.partial(run, argv))
    app = [
        *("podman", "build", "-q", "-v", "/etc/ssl/certs:/etc/ssl/certs:ro"),
        *("--build-arg", f"PYTHON_IMAGE={STANDIN_IMAGES['PYTHON_IMAGE'][0]}", "--build-arg", "SPARK=0"),
        *("-t", APP_IMAGE, str(ROOT)),
    ]
    took[APP_IMAGE] = replace_image(APP_IMAGE, functools.partial(run, app, timeout=1200))
    return took


def replace_image(tag: str, build: Callable[[], object]) -> float:
    """Build ``tag``; remove the image it named before, untagged now (its own layers only). Seconds taken."""
    started, before = time.monotonic(), image_id(tag)
    build()
    if before and before != image_id(tag):
        subprocess.run(["podman", "rmi", before], capture_output=True, timeout=120)
    return time.monotonic() - started


# -- the keeper: Podman's Docker API socket and the health checks, for as long as the stack is up ---------------------


def state_folder(project: str) -> Path:
    """Where a project's keeper keeps its socket, pid, log and the compose environment (``env``)."""
    return Path(tempfile.gettempdir()) / "unilog-podman" / project


def keeper_pid(folder: Path) -> int | None:
    """The pid of the keeper running for ``folder``'s project, None if there is none (or it died)."""
    try:
        pid = int((folder / "keeper.pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def start_keeper(project: str) -> str:
    """The project's keeper (a detached ``keep`` process: it outlives this one), started unless it runs; the
    DOCKER_HOST of its socket once that exists."""
    folder = state_folder(project)
    socket = folder / "podman.sock"
    if keeper_pid(folder) is None:
        folder.mkdir(parents=True, exist_ok=True)
        socket.unlink(missing_ok=True)
        with (folder / "keeper.log").open("a") as log:
            keeper = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "keep", "--project", project],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # not ended with this process's session, nor by its Ctrl-C
            )
        (folder / "keeper.pid").write_text(str(keeper.pid))
    deadline = time.monotonic() + 30
    while not socket.exists():
        if keeper_pid(folder) is None or time.monotonic() > deadline:
            raise RuntimeError(f"the Podman socket did not appear: see {folder / 'keeper.log'}")
        time.sleep(0.2)
    return f"unix://{socket}"


def stop_keeper(project: str) -> None:
    """End the project's keeper (its socket goes with it) and remove its folder."""
    folder = state_folder(project)
    pid = keeper_pid(folder)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while keeper_pid(folder) is not None and time.monotonic() < deadline:
            time.sleep(0.2)
    shutil.rmtree(folder, ignore_errors=True)


def keep(project: str, tick: float = 2.0) -> int:
    """The keeper's loop: ``podman system service`` on the project's socket (restarted if it dies), and every
    container's health check run as Docker would run it, until SIGTERM. Podman 4.3 runs health checks from systemd
    timers only, so without this a container restarted later stays "starting" forever."""
    folder = state_folder(project)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    service: subprocess.Popen[bytes] | None = None
    last_run: dict[str, float] = {}
    try:
        while not stop.is_set():
            if service is None or service.poll() is not None:
                service = subprocess.Popen(
                    ["podman", "system", "service", "--time=0", f"unix://{folder / 'podman.sock'}"],
                    stdin=subprocess.DEVNULL,
                )
            with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
                run_due_health_checks(project, last_run)
            stop.wait(tick)
    finally:
        if service is not None and service.poll() is None:
            service.terminate()
            try:
                service.wait(timeout=20)
            except subprocess.TimeoutExpired:
                service.kill()
    return 0


def run_due_health_checks(project: str, last_run: dict[str, float]) -> None:
    """Run each running project container's check that is due: at its interval once healthy, at every call while
    starting or unhealthy (so the fleet comes up sooner); containers without a check are left alone."""
    names = run(
        ["podman", "ps", "--filter", f"label=com.docker.compose.project={project}", "--format", "{{.Names}}"]
    ).stdout.split()
    if not names:
        return
    listed = run(["podman", "inspect", "--format", "{{.Name}} {{.State.Health.Status}}", *names]).stdout
    for line in listed.splitlines():
        name, _, state = line.strip().partition(" ")
        if state not in ("starting", "unhealthy", "healthy"):
            continue
        due = last_run.get(name, 0.0) + (health_interval(name) if state == "healthy" else 0.0)
        if time.monotonic() >= due:
            subprocess.run(["podman", "healthcheck", "run", name], capture_output=True, timeout=60)
            last_run[name] = time.monotonic()


@functools.lru_cache(maxsize=256)
def health_interval(name: str) -> float:
    """Seconds between a container's health checks (its compose ``interval``; 30 s, Docker's default, if unset).
    Cached by name: compose recreates a container under a new name only when its configuration changes."""
    result = subprocess.run(
        ["podman", "inspect", "--format", "{{.Config.Healthcheck.Interval}}", name],
        capture_output=True,
        text=True,
        timeout=60,
    )
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|µs|ns|m|s)", result.stdout.strip())  # Go's duration: 1m30s
    seconds = sum(float(number) * units[unit] for number, unit in parts)
    return seconds if seconds > 0 else 30.0


def health(name: str) -> str:
    """A container's health ("healthy", "starting", "unhealthy"), "" without a check, "gone" if it does not exist."""
    result = subprocess.run(
        ["podman", "inspect", "--format", "{{.State.Health.Status}}", name], capture_output=True, text=True, timeout=60
    )
    return result.stdout.strip() if result.returncode == 0 else "gone"


# -- a stack: a project's compose environment on its keeper's socket ---------------------------------------------------


class Stack:
    """A compose project run under Podman: its name and the environment every ``docker-compose`` call needs."""

    def __init__(self, project: str, env: dict[str, str]) -> None:
        self.project = project
        self.env = env

    def container(self, service: str) -> str:
        """The container docker-compose 1.29 names for ``service`` (the first replica)."""
        return f"{self.project}_{service}_1"

    def compose(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return run(["docker-compose", *args], timeout=timeout, env=self.env, cwd=ROOT)


def env_file_values(path: Path) -> dict[str, str]:
    """The ``NAME=value`` lines of a compose env file (comments and blank lines skipped, no quote handling)."""
    values = {}
    for line in path.read_text().splitlines():
        name, sep, value = line.strip().partition("=")
        if sep and not name.startswith("#") and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            values[name] = value
    return values


def open_stack(project: str, ports: dict[str, int], env_file: Path | None = None) -> Stack:
    """The project's keeper started (or found) and its compose environment: the env file's values of the variables
    the compose file reads (default: ``.env`` if it exists, else ``.env.example``), the stand-in images, the app
    image and the host ports. It is also written to the keeper's folder as shell exports, for :func:`print_env`."""
    env_file = env_file or next(p for p in (ROOT / ".env", ROOT / ".env.example") if p.exists())
    used = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", COMPOSE_FILE.read_text()))
    # only what the compose file reads: the env file also holds honcho's DATABASE_URL, which `env` must not export
    compose_vars = {name: value for name, value in env_file_values(env_file).items() if name in used}
    compose_vars.update({name: tag for name, (tag, _) in STANDIN_IMAGES.items()})
    compose_vars.update({f"{name.upper()}_PORT": str(port) for name, port in ports.items()})
    compose_vars.update(
        DOCKER_HOST=start_keeper(project),
        COMPOSE_PROJECT_NAME=project,
        COMPOSE_FILE=str(COMPOSE_FILE),
        APP_IMAGE=APP_IMAGE,
    )
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in sorted(compose_vars.items()))
    (state_folder(project) / "env").write_text(exports)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("COMPOSE_", "DOCKER_"))}
    return Stack(project, {**env, **compose_vars})


def up(stack: Stack, services: Sequence[str] = FLEET, timeout: float = 300) -> float:
    """``docker-compose up -d`` of ``services``; returns once each is healthy (the keeper runs the checks)."""
    started = time.monotonic()
    process = subprocess.Popen(
        ["docker-compose", "up", "-d", "--no-build", *services],
        env=stack.env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_healthy(stack, services, started + timeout, process)
    finally:
        if process.poll() is None:
            process.kill()
        output = process.communicate()[0]
    if process.returncode != 0:
        raise RuntimeError(f"docker-compose up exited {process.returncode}:\n{output[-3000:]}")
    return time.monotonic() - started


def wait_healthy(
    stack: Stack, services: Sequence[str], deadline: float, process: subprocess.Popen[str] | None = None
) -> None:
    """Wait until every one of ``services`` is healthy (and ``process``, if given, has exited). It runs no check
    itself: the keeper does, as long as the stack is up."""
    while True:
        pending = {s: health(stack.container(s)) for s in services}
        pending = {s: state for s, state in pending.items() if state != "healthy"}
        if not pending and (process is None or process.poll() is not None):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"not healthy in time: {pending}")
        time.sleep(1)


def down(stack: Stack) -> None:
    """Take the project down with its volumes, then end its keeper. Only this project: never another's."""
    try:
        stack.compose("down", "-v", "--remove-orphans", timeout=300)
    finally:
        stop_keeper(stack.project)


# Prometheus's pages, by UI: the official image (prom/prometheus >= 2.34, and 3.x) serves them at the root; Debian's
# package (the stand-in, 2.42) is built without the React UI and serves the classic pages under /classic/ only.
PROMETHEUS_PAGES = ("alerts", "targets", "rules")
PROMETHEUS_UI_PREFIXES = ("/", "/classic/")


def prometheus_pages(base_url: str, timeout: float = 10) -> list[str]:
    """The URLs of Prometheus's alerts, targets and rules pages that answer on the Prometheus at ``base_url``: those
    of the first UI (root, then /classic/) whose alerts page answers 200; the root ones if neither does."""
    for prefix in PROMETHEUS_UI_PREFIXES:
        try:
            with urllib.request.urlopen(f"{base_url}{prefix}alerts", timeout=timeout) as response:
                if response.status == 200:
                    return [f"{base_url}{prefix}{page}" for page in PROMETHEUS_PAGES]
        except (urllib.error.URLError, OSError):
            continue
    return [f"{base_url}/{page}" for page in PROMETHEUS_PAGES]


def print_env(project: str) -> int:
    exports = state_folder(project) / "env"
    if keeper_pid(state_folder(project)) is None or not exports.exists():
        print(f"compose_podman: no stack {project!r} is up (python tools/compose_podman.py up)", file=sys.stderr)
        return 1
    print(exports.read_text(), end="")
    return 0


USAGE = """the stack stays up, its socket and health checks with it; in this shell, from the repository:
  eval "$(python tools/compose_podman.py env{flag})"
  docker-compose ps
  docker-compose logs --tail 20 consumer0
  docker-compose exec exporter unilog status
  python tools/compose_podman.py down{flag}
(`run` works only for a service that is not running: Podman refuses the link docker-compose gives it otherwise)"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/compose_podman.py", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("images", "up", "env", "down", "keep"))
    parser.add_argument("--rebuild", action="store_true", help="rebuild the base and the stand-ins too")
    parser.add_argument("--project", default=PROJECT, help="the compose project (default %(default)s)")
    parser.add_argument("--api-port", type=int, default=5000)
    parser.add_argument("--prometheus-port", type=int, default=9090)
    args = parser.parse_args(argv)
    if args.command == "keep":
        return keep(args.project)
    if args.command == "env":
        return print_env(args.project)
    try:
        if args.command in ("images", "up"):
            for tag, seconds in build_images(rebuild=args.rebuild).items():
                print(f"built {tag} in {seconds:.0f} s")
        if args.command == "images":
            return 0
        stack = open_stack(args.project, {"api": args.api_port, "prometheus": args.prometheus_port})
        if args.command == "down":
            down(stack)
            return 0
        print(f"fleet healthy in {up(stack):.0f} s: the API on http://127.0.0.1:{args.api_port}/rides; Prometheus's")
        print("alerts, targets and rules: " + "  ".join(prometheus_pages(f"http://127.0.0.1:{args.prometheus_port}")))
        print(USAGE.format(flag="" if args.project == PROJECT else f" --project {args.project}"))
    except (Unusable, RuntimeError, TimeoutError) as exc:
        print(f"compose_podman: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
