"""Run docker-compose.yml for real under Podman, where there is no Docker engine and no image registry.

    python tools/compose_podman.py images      # prepare Podman, build the base, the stand-ins and the app image
    python tools/compose_podman.py up          # ... then bring the fleet up and wait until every check passes
    python tools/compose_podman.py down        # take it down (and its volumes)

What it does, and why (docs/guides/compose.md says what was run):

- Podman refuses to start containers in a sandbox that refuses the default rlimits: ``/etc/containers/containers.conf``
  gets ``[containers] default_ulimits = []`` when it has no ``default_ulimits`` and may be written.
- No image can be pulled, so a Debian bookworm base is made by ``debootstrap --variant=minbase`` from the machine's
  Debian mirror and imported as ``localhost/debian:bookworm-slim``; the stand-ins for ``postgres:16``, ``redis:7`` and
  ``python:3.11-slim`` (compose/standins/) are built FROM it with Debian's packages. Each is built only when its tag
  is missing (``--rebuild`` forces it). The app image is always built (Podman's layer cache makes an unchanged
  dependency layer free), without Spark (``SPARK=0``), with the machine's trust store mounted so pip can verify PyPI.
- Compose is Debian's ``docker-compose`` 1.29 against ``podman system service`` on a private socket: it honours
  ``depends_on`` conditions, which podman-compose ignores. Podman 4.3 runs no health checks without systemd, so a
  loop runs ``podman healthcheck run`` for every container that has one and is not healthy yet.

Only the command line and ``podman``/``docker-compose`` are used: no unilog import, so it runs from any Python 3.11.
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
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
    if re.search(r"^\s*default_ulimits\s*=", text, re.MULTILINE):
        return
    parser = configparser.ConfigParser()
    with contextlib.suppress(configparser.Error):
        parser.read_string(text)
    if parser.has_section("containers"):
        text = re.sub(r"^\[containers\]\s*$", "[containers]\ndefault_ulimits = []", text, count=1, flags=re.M)
    else:
        text += "\n[containers]\ndefault_ulimits = []\n"
    try:
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(text)
    except OSError as exc:
        raise Unusable(f"{conf} needs `default_ulimits = []` under [containers] and cannot be written: {exc}") from None


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


@contextlib.contextmanager
def podman_service(folder: Path) -> Iterator[str]:
    """``podman system service`` on a socket in ``folder`` for as long as the block runs; yields DOCKER_HOST."""
    socket = folder / "podman.sock"
    log = (folder / "podman-service.log").open("w")
    service = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{socket}"], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 30
        while not socket.exists():
            if service.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"podman system service did not start: see {folder / 'podman-service.log'}")
            time.sleep(0.2)
        yield f"unix://{socket}"
    finally:
        service.terminate()
        try:
            service.wait(timeout=20)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait()
        log.close()


def compose_env(docker_host: str, ports: dict[str, int], **extra: str) -> dict[str, str]:
    """The environment ``docker-compose`` runs in: the service's socket, the stand-ins, the app image, host ports."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("COMPOSE_", "DOCKER_"))}
    env.update({name: tag for name, (tag, _) in STANDIN_IMAGES.items()})
    env.update({f"{name.upper()}_PORT": str(port) for name, port in ports.items()})
    env.update(DOCKER_HOST=docker_host, APP_IMAGE=APP_IMAGE, COMPOSE_PROJECT_NAME=PROJECT, **extra)
    return env


def compose(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return run(["docker-compose", "-f", str(COMPOSE_FILE), *args], timeout=timeout, env=env, cwd=ROOT)


def container(service: str) -> str:
    """The container docker-compose 1.29 names for ``service`` (the first replica)."""
    return f"{PROJECT}_{service}_1"


def health(name: str) -> str:
    """A container's health ("healthy", "starting", "unhealthy"), "" without a check, "gone" if it does not exist."""
    result = subprocess.run(
        ["podman", "inspect", "--format", "{{.State.Health.Status}}", name], capture_output=True, text=True, timeout=60
    )
    return result.stdout.strip() if result.returncode == 0 else "gone"


def check_health_once() -> dict[str, str]:
    """Run the health check of every project container that has one and is not healthy; their states by name."""
    listed = run(
        ["podman", "ps", "--filter", f"label=com.docker.compose.project={PROJECT}", "--format", "{{.Names}}"]
    ).stdout.split()
    states = {}
    for name in listed:
        state = health(name)
        if state in ("starting", "unhealthy"):
            subprocess.run(["podman", "healthcheck", "run", name], capture_output=True, timeout=60)
            state = health(name)
        states[name] = state
    return states


def up(env: dict[str, str], services: Sequence[str] = FLEET, timeout: float = 300) -> float:
    """``docker-compose up -d`` while the health checks run by hand; returns once every service is healthy."""
    started = time.monotonic()
    process = subprocess.Popen(
        ["docker-compose", "-f", str(COMPOSE_FILE), "up", "-d", "--no-build", *services],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_healthy(services, started + timeout, process)
    finally:
        if process.poll() is None:
            process.kill()
        output = process.communicate()[0]
    if process.returncode != 0:
        raise RuntimeError(f"docker-compose up exited {process.returncode}:\n{output[-3000:]}")
    return time.monotonic() - started


def wait_healthy(services: Sequence[str], deadline: float, process: subprocess.Popen[str] | None = None) -> None:
    """Run health checks until every one of ``services`` is healthy (and ``process``, if given, has exited)."""
    while True:
        states = check_health_once()
        pending = {s: states.get(container(s), "not created") for s in services}
        pending = {s: state for s, state in pending.items() if state != "healthy"}
        if not pending and (process is None or process.poll() is not None):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"not healthy in time: {pending}")
        time.sleep(2)


def down(env: dict[str, str]) -> None:
    compose(env, "down", "-v", "--remove-orphans", timeout=300)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/compose_podman.py", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("images", "up", "down"))
    parser.add_argument("--rebuild", action="store_true", help="rebuild the base and the stand-ins too")
    parser.add_argument("--api-port", type=int, default=5000)
    args = parser.parse_args(argv)
    try:
        if args.command in ("images", "up"):
            for tag, seconds in build_images(rebuild=args.rebuild).items():
                print(f"built {tag} in {seconds:.0f} s")
        if args.command == "images":
            return 0
        folder = Path(tempfile.mkdtemp(prefix="unilog-podman-"))
        with podman_service(folder) as host:
            env = compose_env(host, {"api": args.api_port})
            if args.command == "up":
                print(f"fleet healthy in {up(env):.0f} s; the API on http://127.0.0.1:{args.api_port}/rides")
            else:
                down(env)
    except (Unusable, RuntimeError, TimeoutError) as exc:
        print(f"compose_podman: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
