"""Optional packages: which extra of unilog installs a module, and the one line a command ends with when one is
missing (exit code 3), before it starts anything.

The extras are read from unilog's own metadata (its distribution, ``unilog-outbox``: ``pyproject.toml``'s
``[project.optional-dependencies]``), so a package an extra gains (a dashboard server, say) is named without an edit
here; the table below covers only modules whose import name is not their distribution's, or that come with another
package (Werkzeug with Flask).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from functools import cache
from importlib import metadata

from ..config import DISTRIBUTION
from ..errors import MissingExtra

# import name -> the extra that installs it, where the metadata cannot tell (or names several: flask is in demo too)
_KNOWN = {
    "rich": "progress",
    "pyspark": "spark",
    "py4j": "spark",
    "pyarrow": "spark",
    "pandas": "spark",
    "flask": "dashboard",
    "werkzeug": "dashboard",
    "opentelemetry": "tracing",
    "django": "django",
}
_NOT_EXTRAS = ("dev",)  # everything is in dev: never the one to name
_OWN = DISTRIBUTION.replace("-", "_")  # an extra that names others (demo: unilog-outbox[embedded])


@cache
def _extras_by_module() -> dict[str, list[str]]:
    """import name (a distribution's name, normalized) -> the extras that list it, in pyproject.toml's order."""
    found: dict[str, list[str]] = {}
    try:
        requirements = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return found
    for requirement in requirements:
        name = re.match(r"[A-Za-z0-9._-]+", requirement)
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
        module = name.group(0).lower().replace("-", "_").replace(".", "_") if name else ""
        if extra and module and extra.group(1) not in _NOT_EXTRAS and module != _OWN:  # not an extra's extras
            found.setdefault(module, []).append(extra.group(1))
    return found


def extra_for(module: str, prefer: Sequence[str] = ()) -> str | None:
    """The extra that installs ``module`` (a dotted name: its top-level package counts): one of ``prefer`` (the
    command's own extras) if it lists the module, else the one known for it, else the first that lists it."""
    top = module.partition(".")[0].lower()
    listed = _extras_by_module().get(top, [])
    for extra in prefer:
        if extra in listed:
            return extra
    return _KNOWN.get(top) or (listed[0] if listed else None)


def missing(
    exc: ModuleNotFoundError, prefer: Sequence[str] = (), needed_by: str = "this command"
) -> MissingExtra | None:
    """The one-line error for ``exc`` if an extra of unilog installs the missing module; None if none does (then it
    is a bug or a broken install, and the traceback is the useful report)."""
    if not exc.name:
        return None
    extra = extra_for(exc.name, prefer)
    if extra is None:
        return None
    top = exc.name.partition(".")[0]
    return MissingExtra(f"{needed_by} needs {top!r}, which is not installed: {install(extra)}")


def install(extra: str) -> str:
    """The command that installs ``extra`` of unilog: ``pip install 'unilog-outbox[demo]'``."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def require(modules: Sequence[str], needed_by: str, prefer: Sequence[str] = (), hint: str = "") -> None:
    """Import ``modules`` now, so a missing one is one line (:class:`~unilog.errors.MissingExtra`, naming the
    extra, then ``hint``) before the command starts anything, not a traceback half-way."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            error = missing(exc, prefer, needed_by)
            if error is None:
                raise
            raise MissingExtra(f"{error}{hint}") from None
