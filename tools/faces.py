"""Generate the threaded face of each asyncio worker from its source: ``python tools/faces.py`` (``--check``: exit
1, naming them, if a generated file is stale).

The consumers' exactly-once sequences are written once, as asyncio code under ``unilog/consume/_async/``; this
rewrites each file with unasync's token renaming (``async``/``await`` dropped, ``__aenter__`` -> ``__enter__``, and
the names below) into ``unilog/consume/_sync/``, then formats it with ruff. The two faces cannot drift: a change
lands in the source, and ``tests/test_faces.py`` fails while the generated file does not match it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tokenize_rt
import unasync

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "unilog" / "consume" / "_async"
TARGET = ROOT / "unilog" / "consume" / "_sync"
RUFF = Path(sys.executable).parent / "ruff"

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
    "runtime_async": "runtime",  # unilog.runtime_async -> unilog.runtime
    "aio": "sync",  # unilog.store.aio -> unilog.store.sync, unilog.engine.aio -> unilog.engine.sync
    "asyncio": "time",  # the sources import only `sleep` from asyncio
}
RULE = unasync.Rule("/_async/", "/_sync/", additional_replacements=RENAMES)


def header(source: Path) -> str:
    rel = source.relative_to(ROOT).as_posix() if source.is_relative_to(ROOT) else source.name
    return f"# Generated from {rel} by tools/faces.py: do not edit.\n"


def generated(source: Path) -> str:
    """The threaded face of ``source``, formatted as the repository formats code."""
    tokens = tokenize_rt.src_to_tokens(source.read_text())
    # unasync's own token pass (its public entry point writes files beside the source; this one returns text)
    text = header(source) + tokenize_rt.tokens_to_src(list(RULE._unasync_tokens(tokens)))
    target = (TARGET / source.name).as_posix()
    text = _ruff(["check", "--fix-only", "--select", "I,F401", "--quiet", "--stdin-filename", target, "-"], text)
    return _ruff(["format", "--quiet", "--stdin-filename", target, "-"], text)


def _ruff(args: list[str], text: str) -> str:
    done = subprocess.run([str(RUFF), *args], input=text, capture_output=True, text=True, cwd=ROOT, check=False)
    if done.returncode not in (0, 1):
        raise SystemExit(f"faces: ruff {args[0]} failed: {done.stderr.strip()}")
    return done.stdout


def sources() -> list[Path]:
    return sorted(p for p in SOURCE.glob("*.py") if p.name != "__init__.py")


def stale() -> list[str]:
    """Generated files that do not match their sources (or are missing)."""
    out = []
    for source in sources():
        target = TARGET / source.name
        if not target.exists() or target.read_text() != generated(source):
            out.append(target.relative_to(ROOT).as_posix() if target.is_relative_to(ROOT) else str(target))
    return out


def main(argv: list[str]) -> int:
    if "--check" in argv:
        found = stale()
        for name in found:
            print(f"faces: {name} is stale: run `python tools/faces.py`")
        return 1 if found else 0
    for source in sources():
        (TARGET / source.name).write_text(generated(source))
        print(f"faces: wrote {(TARGET / source.name).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
