"""The few things the two faces of a worker truly do differently, in pairs the generator swaps.

``tools/faces.py`` renames each asyncio name here to its threaded twin (``AEvent`` -> ``Event``, ``asleep`` ->
``sleep``, ``asleep_until`` -> ``sleep_until``), so the loop, the links and the workers written once as asyncio
code under ``_async/`` run unchanged in threads. Each pair has one contract, stated on the threaded half.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

Event = threading.Event  # what stops a threaded worker: set it from any thread
AEvent = asyncio.Event  # what stops an asyncio worker: set it from the worker's event loop

sleep = time.sleep
asleep = asyncio.sleep


def sleep_until(event: threading.Event, seconds: float) -> bool:
    """Wait until ``event`` is set or ``seconds`` passed; return whether it is set."""
    return event.wait(seconds)


async def asleep_until(event: asyncio.Event, seconds: float) -> bool:
    """:func:`sleep_until` in an event loop."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
    return event.is_set()


__all__ = ["AEvent", "Event", "asleep", "asleep_until", "sleep", "sleep_until"]
