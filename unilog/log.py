"""Logging set-up for unilog processes.

Library modules only call ``structlog.get_logger(__name__)``; :func:`configure_logging` is called once, by a
process entry point (the CLI, the demo services), never on import. Output is JSON lines when stdout is not a
terminal (for log shippers and honcho) and readable console lines when it is.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def configure_logging(*, level: str = "info", json: bool | None = None, stream: Any = None) -> None:
    """Configure structlog (and the stdlib root logger) for this process.

    ``json=None`` picks JSON when ``stream`` is not a TTY. Safe to call more than once: the last call wins.
    """
    out = stream or sys.stdout
    use_json = not _isatty(out) if json is None else json
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
