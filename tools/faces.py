"""Generate the threaded face of each asyncio source from it: ``python tools/faces.py`` (``--check``: exit 1, naming
them, if a generated file is stale, missing, or left behind by a source that is gone).

Two places write code once, as asyncio, for both faces: the consumers' exactly-once sequences
(``unilog/consume/_async/``) and the Redis adapter's methods both faces have (``unilog/engine/_async/``). Each pair
in :data:`PAIRS` rewrites every source file with unasync's token renaming (``async``/``await`` dropped,
``__aenter__`` -> ``__enter__``, ``asynccontextmanager`` -> ``contextmanager``, and the names below) into its
``_sync/`` twin, then formats it with ruff. Decorators are copied as they are (the adapter's ``@issues``
declarations with them). The two faces cannot drift: a change lands in the source, and ``tests/test_faces.py``
fails while a generated file does not match it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tokenize_rt
import unasync

ROOT = Path(__file__).resolve().parent.parent
# (asyncio source directory, generated threaded directory)
PAIRS: list[tuple[Path, Path]] = [
    (ROOT / "unilog" / "consume" / "_async", ROOT / "unilog" / "consume" / "_sync"),
    (ROOT / "unilog" / "engine" / "_async", ROOT / "unilog" / "engine" / "_sync"),
]
RUFF = Path(sys.executable).parent / "ruff"
HEADER = "# Generated from "

# asyncio name -> threaded name; each asyncio module named here has a threaded twin of the same shape
RENAMES = {
    "AsyncConsumer": "Consumer",
    "AsyncGroupConsumer": "GroupConsumer",
    "AsyncWorker": "Worker",
    "AsyncLinks": "Links",
    "AsyncRedisStreams": "RedisStreams",
    "AsyncConnection": "Connection",
    "AsyncHandler": "Handler",
    "AsyncIterator": "Iterator",
    # the Redis adapter's shared classes (unilog/engine/_async/ -> unilog/engine/_sync/) and its client's type
    "AsyncAdapter": "Adapter",
    "AsyncReadingCore": "ReadingCore",
    "AsyncGroupsCore": "GroupsCore",
    "AsyncLettersCore": "LettersCore",
    "AsyncRetentionCore": "RetentionCore",
    "AsyncClient": "Client",
    "async_node_connection": "node_connection",  # unilog.engine.nodes: a key's node's connection, of each face
    "aclose": "close",  # redis-py's asyncio client closes with aclose(), the threaded one with close()
    "runtime_async": "runtime",  # unilog.runtime_async -> unilog.runtime
    "aio": "sync",  # unilog.store.aio -> unilog.store.sync, unilog.engine.aio -> unilog.engine.sync
    "asyncio": "time",  # the sources import only `sleep` from asyncio
}
RULE = unasync.Rule("/_async/", "/_sync/", additional_replacements=RENAMES)


def header(source: Path) -> str:
    rel = source.relative_to(ROOT).as_posix() if source.is_relative_to(ROOT) else source.name
    return f"{HEADER}{rel} by tools/faces.py: do not edit.\n"


def target_of(source: Path) -> Path:
    """Where the threaded face of ``source`` goes: the same name in its pair's generated directory."""
    for source_dir, target_dir in PAIRS:
        if source.parent == source_dir:
            return target_dir / source.name
    raise ValueError(f"{source} is in no source directory of tools/faces.py")


def generated(source: Path) -> str:
    """The threaded face of ``source``, formatted as the repository formats code."""
    tokens = tokenize_rt.src_to_tokens(source.read_text())
    # unasync's own token pass (its public entry point writes files beside the source; this one returns text)
    text = header(source) + tokenize_rt.tokens_to_src(list(RULE._unasync_tokens(tokens)))
    target = target_of(source).as_posix()
    text = _ruff(["check", "--fix-only", "--select", "I,F401", "--quiet", "--stdin-filename", target, "-"], text)
    return _ruff(["format", "--quiet", "--stdin-filename", target, "-"], text)


def _ruff(args: list[str], text: str) -> str:
    done = subprocess.run([str(RUFF), *args], input=text, capture_output=True, text=True, cwd=ROOT, check=False)
    if done.returncode not in (0, 1):
        raise SystemExit(f"faces: ruff {args[0]} failed: {done.stderr.strip()}")
    return done.stdout


def sources() -> list[Path]:
    """Every asyncio source file, of every pair."""
    return sorted(p for source_dir, _ in PAIRS for p in source_dir.glob("*.py") if p.name != "__init__.py")


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def orphans() -> list[Path]:
    """Generated files whose source is gone (a renamed or deleted source leaves its old face behind)."""
    wanted = {target_of(source) for source in sources()}
    return sorted(
        p
        for _, target_dir in PAIRS
        for p in target_dir.glob("*.py")
        if p not in wanted and p.read_text().startswith(HEADER)
    )


def stale() -> list[str]:
    """Generated files that do not match their sources, are missing, or have no source left."""
    out = []
    for source in sources():
        target = target_of(source)
        if not target.exists() or target.read_text() != generated(source):
            out.append(_name(target))
    return out + [_name(p) for p in orphans()]


def main(argv: list[str]) -> int:
    if "--check" in argv:
        found = stale()
        for name in found:
            print(f"faces: {name} is stale: run `python tools/faces.py`")
        return 1 if found else 0
    for source in sources():
        target = target_of(source)
        target.write_text(generated(source))
        print(f"faces: wrote {_name(target)}")
    for orphan in orphans():
        orphan.unlink()
        print(f"faces: removed {_name(orphan)} (its source is gone)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
