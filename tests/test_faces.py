"""The threaded faces of the consumers and of the Redis adapter are generated from their asyncio sources
(``tools/faces.py``): a generated file that does not match its source fails here, naming the command that regenerates
it."""

from __future__ import annotations

import ast
import importlib.util
import shutil
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def faces() -> Any:
    spec = importlib.util.spec_from_file_location("faces", ROOT / "tools" / "faces.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_generated_face_matches_its_source() -> None:
    tool = faces()
    for source_dir, target_dir in tool.PAIRS:
        found = [p for p in tool.sources() if p.parent == source_dir]
        assert found, f"no asyncio sources in {source_dir}"
        assert {tool.target_of(p).parent for p in found} == {target_dir}
    assert tool.stale() == [], "run `python tools/faces.py`"


@pytest.mark.parametrize("pair", [0, 1, 2, 3, 4], ids=["runtime", "consume", "engine", "produce", "store"])
def test_the_check_catches_an_edited_source_and_a_face_left_behind(pair: int, tmp_path: Path) -> None:
    tool = faces()
    source_dir = tool.PAIRS[pair][0]
    assert len(tool.PAIRS) == 5
    source = next(p for p in tool.sources() if p.parent == source_dir)
    tool.PAIRS = [(tmp_path / "_async", tmp_path / "_sync")]
    for directory in tool.PAIRS[0]:
        directory.mkdir()
    copy = tool.PAIRS[0][0] / source.name
    copy.write_text(source.read_text())
    assert tool.stale() == [str(tool.PAIRS[0][1] / source.name)], "a missing face"
    assert tool.main([]) == 0 and tool.stale() == []
    copy.write_text(source.read_text() + "\nEDITED = 1\n")
    assert tool.stale() == [str(tool.PAIRS[0][1] / source.name)], "an edited source"
    copy.unlink()
    assert tool.stale() == [str(tool.PAIRS[0][1] / source.name)], "a face whose source is gone"
    assert tool.main([]) == 0 and tool.stale() == [] and not (tool.PAIRS[0][1] / source.name).exists()


SAMPLE = '''"""Uses AsyncConsumer, not AsyncConsumers; see unilog.consume._async.checkpoint and ``_async/``."""
from ...engine.aio import AsyncRedisStreams
from ...store import aio as store
from .._async import checkpoint
from ..._acompat import AEvent, asleep


class AsyncThing(AsyncConsumer):
    """An AsyncConsumer's twin."""

    async def go(self, stop: AEvent) -> None:
        gaiotto = aio_level = asyncio_like = AsyncConsumers = 1
        label = "AsyncConsumer await async"
        await (await self.links.redis()).register("s", "c", "0-0")
        x = (await self.f()) + 1
        async with self.lock() as held:
            async for item in self.items():
                await asleep(0.1)
        return [y async for y in self.items()], await store.connect_async("dsn")
'''


def test_the_generator_works_on_the_syntax_tree_and_renames_only_whole_names() -> None:
    """Only whole names of ``RENAMES`` change; strings other than docstrings, and names that merely contain a
    renamed one (or ``aio``/``asyncio``), stay as they are; parentheses that only held an ``await`` go."""
    out = faces().transform(SAMPLE, "unilog.consume._async")
    assert "gaiotto = aio_level = asyncio_like = AsyncConsumers = 1" in out
    assert 'label = "AsyncConsumer await async"' in out  # a string is data, not code
    assert '"""Uses Consumer, not AsyncConsumers; see unilog.consume._sync.checkpoint and ``_async/``."""' in out
    assert '"""An Consumer\'s twin."""' in out  # docstrings are renamed as whole words, grammar aside
    assert "class AsyncThing(Consumer):" in out  # AsyncThing is no name of RENAMES: it stays
    assert "from ...engine import RedisStreams" in out and "from ... import store" in out
    assert "from . import checkpoint" in out and "from ..._acompat import Event, sleep" in out
    assert 'self.links.redis().register("s", "c", "0-0")' in out  # no leftover parentheses
    assert "x = (self.f()) + 1" in out or "x = self.f() + 1" in out
    assert "with self.lock() as held:" in out and "for item in self.items():" in out and "sleep(0.1)" in out
    assert "[y for y in self.items()]" in out and 'store.connect("dsn")' in out
    asynchronous = (ast.AsyncFunctionDef, ast.Await, ast.AsyncWith, ast.AsyncFor)
    assert not [n for n in ast.walk(ast.parse(out)) if isinstance(n, asynchronous) or getattr(n, "is_async", 0)]


@pytest.mark.parametrize("line", ["import asyncio", "from asyncio import sleep", "import asyncio.tasks"])
def test_a_source_that_imports_asyncio_itself_is_refused(line: str) -> None:
    """What differs between the faces goes through ``unilog._acompat``'s pairs, never asyncio itself."""
    with pytest.raises(SystemExit, match="_acompat"):
        faces().transform(f"{line}\n", "unilog.consume._async")


def test_no_generated_face_says_it_is_the_asyncio_source() -> None:
    """Docstrings are written for both faces (each face's names come from the renames)."""
    tool = faces()
    for source in tool.sources():
        text = tool.target_of(source).read_text()
        for phrase in ("is written here", "asyncio source", "AsyncConsumer", "AsyncWorker", "AsyncLinks"):
            assert phrase not in text, (tool.target_of(source).name, phrase)


def test_the_adapter_declarations_survive_generation() -> None:
    """Each generated method declares the commands its asyncio source declares (``@issues`` is copied with it)."""
    from unilog.engine import RedisStreams
    from unilog.engine.aio import AsyncRedisStreams
    from unilog.engine.commands import commands_of, declared, methods_of

    source = methods_of(AsyncRedisStreams)
    assert {"read", "explained", "autoclaim", "_pending_but_gone", "aclose"} <= set(source)
    for name, method in source.items():
        twin = getattr(RedisStreams, "close" if name == "aclose" else name)
        assert declared(twin) == declared(method), name
        assert commands_of(twin, RedisStreams) == commands_of(method, AsyncRedisStreams), name


def test_the_store_and_the_adapter_offer_each_face_the_same_names() -> None:
    """The generated code names ``unilog.store`` and ``unilog.engine`` where the source names their ``aio`` twins:
    every function and method the asyncio face offers, the threaded face offers under the same name."""
    from unilog import engine, store
    from unilog.engine import aio as engine_aio
    from unilog.store import aio as store_aio

    used = {n for n in dir(store_aio) if not n.startswith("_") and callable(getattr(store_aio, n))}
    used -= {"connect_options", "schema_verdict", "unreachable", "checkpoint_from_row", "save_params"}
    used -= {"Checkpoint", "AsyncIterator", "Any"}  # helpers
    used = {"connect" if n == "connect_async" else n for n in used}
    assert used <= set(dir(store)), sorted(used - set(dir(store)))
    methods = {n for n in dir(engine_aio.AsyncRedisStreams) if not n.startswith("_") and n != "aclose"}
    assert {"read", "read_group", "dead_letter", "register", "heartbeat", "wait_for_entries"} <= methods
    missing = {n for n in methods if not hasattr(engine.RedisStreams, n)}
    assert missing == set()
    assert set(engine_aio.__all__) == {"AsyncRedisStreams", "Entry", "connect_async", "ping"}
    assert callable(engine.ping) and callable(engine.connect)


# A drift planted by hand in the threaded face of each former twin (the copies that used to be kept in step by hand:
# ``store/aio.py`` beside ``store/connection.py``, ``checkpoints.py``, ``groups.py`` and ``locks.py``;
# ``engine/aio.py`` beside ``engine/connection.py``; the two node connections of ``engine/nodes.py``; the links'
# ``pg()`` and ``close()`` that ``unilog.django`` re-implemented): (the generated file, its text, the drift).
DRIFTS = {
    "store.check_schema returns early": (
        "unilog/store/_sync/connection.py",
        "    row = conn.execute(HAS_VERSION_TABLE",
        "    return\n    row = conn.execute(HAS_VERSION_TABLE",
    ),
    "store.lock_checkpoint takes no lock": (
        "unilog/store/_sync/checkpoints.py",
        "return read_checkpoint(conn, name, lock=True)",
        "return read_checkpoint(conn, name)",
    ),
    "store.claim_identities claims every identity": (
        "unilog/store/_sync/groups.py",
        "return claimed_from_row(row, identities)",
        "return set(identities)",
    ),
    "store.release_partition_lock locks instead": (
        "unilog/store/_sync/locks.py",
        "conn.execute(PARTITION_UNLOCK, (key,))",
        "conn.execute(PARTITION_LOCK, (key,))",
    ),
    "engine.connect retries a timed-out command": (
        "unilog/engine/_sync/connection.py",
        "retry_on_timeout=False",
        "retry_on_timeout=True",
    ),
    "node_connection reuses a failed connection": (
        "unilog/engine/_sync/nodes.py",
        "        conn.disconnect()\n        raise",
        "        raise",
    ),
    "the links (Django's too) skip the schema check": (
        "unilog/runtime/_sync/loop.py",
        "                store.check_schema(conn)\n",
        "                pass\n",
    ),
}


@pytest.mark.parametrize("drift", sorted(DRIFTS))
def test_a_drift_planted_in_a_former_twin_fails_the_check(
    drift: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check, run over a copy of the tree, reports the threaded face a hand edit made drift from its source;
    only the pairs that generate it are checked (none, if the file were no pair's: the test then fails)."""
    path, text, planted = DRIFTS[drift]
    tool = faces()
    shutil.copytree(ROOT / "unilog", tmp_path / "unilog", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)  # ruff formats the copy as it formats the tree
    target = tmp_path / path
    tool.ROOT = tmp_path
    tool.PAIRS = [
        (tmp_path / source.relative_to(ROOT), tmp_path / face.relative_to(ROOT))
        for source, face in tool.PAIRS
        if face == (ROOT / path).parent
    ]
    assert tool.stale() == [], "the copy is in step before the drift"
    assert target.read_text().count(text) == 1, "the generated face changed: plant the drift anew"
    target.write_text(target.read_text().replace(text, planted))
    assert tool.main(["--check"]) == 1
    assert capsys.readouterr().out.splitlines() == [f"faces: {path} is stale: run `python tools/faces.py`"]


def test_the_django_links_reuse_the_links() -> None:
    """Django's links lend Django's session and give it back; opening, checking and closing are the links' own
    (generated) code, so a drift in it is a drift of the links the face check sees. Read from the syntax tree: importing
    ``unilog.django`` here would add its consumer to the workers other tests count."""
    tree = ast.parse((ROOT / "unilog" / "django" / "__init__.py").read_text())
    links = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "_DjangoLinks")
    assert [ast.unparse(base) for base in links.bases] == ["Links"]
    own = {n.name for n in links.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    assert own == {"__init__", "session", "end_session"}
