"""Whether a dropped worker ends its sessions with its last reference: shared by the tests of workers dropped without
``close()`` (after a drain, a failed drain, a refused batch). A reference cycle would keep such a worker, its sessions
and the stream locks they hold, until some later full garbage collection; the next worker waited on its locks."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def refcounting_only() -> Iterator[None]:
    """Within: only reference counting frees objects (the cyclic collector is off), so a cycle keeps what it holds."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def dropped(action: Callable[[], Any], expected: type[BaseException] | None = None) -> Any:
    """Run ``action`` (which makes a worker and drops it); with ``expected``, it must raise that (caught here and
    not kept: a caller that keeps the error keeps the worker, rightly). Returns what it returned."""
    if expected is None:
        return action()
    try:
        action()
    except expected:
        return None
    raise AssertionError(f"{expected.__name__} did not reach the caller")


def assert_sessions_end(pg: Any, like: str, what: str, seconds: float = 10.0) -> None:
    """No session whose application name is LIKE ``like`` is left, within ``seconds``: a closed connection's server
    process ends a moment after the client let go of it (longer on a busy machine), so the test polls, with the
    collector still off: a cycle keeps the session for good, and this fails."""
    query = "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s"
    deadline = time.monotonic() + seconds
    while (left := pg.execute(query, (like,)).fetchone()[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == 0, f"{what}: {left} session(s) named like {like!r} still open after {seconds} s"
