"""The consumers' threaded face is generated from their asyncio source (``tools/faces.py``): a generated file that
does not match its source fails here, naming the command that regenerates it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def faces() -> Any:
    spec = importlib.util.spec_from_file_location("faces", ROOT / "tools" / "faces.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_generated_face_matches_its_source() -> None:
    tool = faces()
    assert tool.sources(), "no asyncio sources found"
    assert tool.stale() == [], "run `python tools/faces.py`"


def test_the_check_catches_an_edited_source(tmp_path: Path) -> None:
    tool = faces()
    source = tool.sources()[0]
    tool.SOURCE, tool.TARGET = tmp_path / "_async", tmp_path / "_sync"
    tool.SOURCE.mkdir()
    tool.TARGET.mkdir()
    copy = tool.SOURCE / source.name
    copy.write_text(source.read_text())
    (tool.TARGET / source.name).write_text(tool.generated(copy))
    assert tool.stale() == []
    copy.write_text(source.read_text().replace("One source, two faces", "One source, edited"))
    assert tool.stale() == [str(tool.TARGET / source.name)]


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
    methods = {n for n in vars(engine_aio.AsyncRedisStreams) if not n.startswith("_") and n != "aclose"}
    missing = {n for n in methods if not hasattr(engine_sync.RedisStreams, n)}
    assert missing == set()
    assert sys.modules["unilog.store.sync"] is store_sync
