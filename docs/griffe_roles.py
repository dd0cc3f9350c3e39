"""A Griffe extension for the API reference: Sphinx roles in docstrings become Markdown code spans.

unilog's docstrings name other objects the Sphinx way (:class:`~unilog.errors.InvalidRecord`, :meth:`connect`);
mkdocstrings renders Markdown, where those would show as ":class:" followed by the name. Each role becomes the code
span Sphinx would show: the last component for a ``~`` target, the whole target otherwise.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|data|exc|mod|obj|const):`(~?)([^`]+)`")


def _code(match: re.Match[str]) -> str:
    short, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


class SphinxRoles(griffe.Extension):
    """Rewrite the Sphinx roles of every docstring once the package is loaded."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_code, obj.docstring.value)
