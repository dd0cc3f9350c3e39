"""Logging set-up for unilog processes, and :class:`Once` for warnings a retry would repeat.

Library modules only call ``structlog.get_logger(__name__)``; :func:`configure_logging` is called once, by a
process entry point (the CLI, the demo services), never on import. Output is JSON lines when stdout is not a
terminal (for log shippers and honcho) and readable console lines when it is.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Hashable
from typing import Any

from .config import hidden


def configure_logging(*, level: str = "info", json: bool | None = None, stream: Any = None) -> None:
    """Configure structlog (and the stdlib root logger) for this process.

    ``json=None`` picks JSON when ``stream`` is not a TTY. Safe to call more than once: the last call wins. A process
    whose first use of structlog is this call with JSON output imports structlog without ``rich`` (``import structlog``
    imports it for its console renderer's tracebacks: about 0.13 s of CPU of each command's start that JSON never
    uses; issue 45); that renderer then formats tracebacks plainly, should a later call pick it.
    """
    out = stream or sys.stdout
    use_json = not _isatty(out) if json is None else json
    with hidden("rich") if use_json else hidden():
        import structlog

    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any
    if use_json:
        renderer = structlog.processors.JSONRenderer()
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=_isatty(out))
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=out, force=True)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Once:
    """Which conditions a warning was already logged for, so a warning that every retry of the same work would
    repeat is logged once per condition: ``if warned.first(key): log.warning(...)``. Keep it where it outlives the
    retries (on the worker or its settings, not on a batch); :meth:`clear` a condition that has ended, so it is
    logged again if it comes back."""

    def __init__(self) -> None:
        self._seen: set[Hashable] = set()

    def first(self, condition: Hashable) -> bool:
        """True the first time ``condition`` is seen (since it was cleared), False after."""
        if condition in self._seen:
            return False
        self._seen.add(condition)
        return True

    def clear(self, condition: Hashable | None = None) -> None:
        """Forget ``condition`` (None: every condition)."""
        if condition is None:
            self._seen.clear()
        else:
            self._seen.discard(condition)
