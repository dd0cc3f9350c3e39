"""The threaded faces of the consumers and of the Redis adapter are generated from their asyncio sources
(``tools/faces.py``): a generated file that does not match its source fails here, naming the command that regenerates
it."""

from __future__ import annotations

import importlib.util
import sys
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


@pytest.mark.parametrize("pair", [0, 1], ids=["consume", "engine"])
def test_the_check_catches_an_edited_source_and_a_face_left_behind(pair: int, tmp_path: Path) -> None:
    tool = faces()
    source_dir = tool.PAIRS[pair][0]
    assert len(tool.PAIRS) == 2
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
    """The generated code imports ``store.sync`` and ``engine.sync`` where the source imports their ``aio`` twins."""
    from unilog.engine import aio as engine_aio
    from unilog.engine import sync as engine_sync
    from unilog.store import aio as store_aio
    from unilog.store import sync as store_sync

    used = {n for n in dir(store_aio) if not n.startswith("_") and callable(getattr(store_aio, n))}
    used -= {"connect_async", "connect_options", "schema_verdict", "unreachable", "checkpoint_from_row", "save_params"}
    used -= {"Checkpoint", "AsyncIterator", "Any", "read_checkpoint"}  # helpers
    assert used <= set(store_sync.__all__), sorted(used - set(store_sync.__all__))
    methods = {n for n in dir(engine_aio.AsyncRedisStreams) if not n.startswith("_") and n != "aclose"}
    assert {"read", "read_group", "dead_letter", "register"} <= methods
    missing = {n for n in methods if not hasattr(engine_sync.RedisStreams, n)}
    assert missing == set()
    assert set(engine_aio.__all__) == {"AsyncRedisStreams", "Entry", "connect_async"}
    assert set(engine_sync.__all__) == {"RedisStreams", "Entry"}
    assert sys.modules["unilog.store.sync"] is store_sync
