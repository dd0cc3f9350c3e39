"""An MkDocs hook (mkdocs.yml, ``hooks:``): the module reference's pages in the navigation, from docs/gen_pages.py's
``MODULES``, the one list of them.

The nav entry ``reference/modules/index.md`` becomes a section: that index page, then one page per module, titled
with the module's path. ``MODULES`` is read from the file's syntax tree (a literal dict), as importing the script
would run it outside a build.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

INDEX = "reference/modules/index.md"


def modules() -> dict[str, str]:
    tree = ast.parse((Path(__file__).parent / "gen_pages.py").read_text())
    for node in tree.body:
        target = (
            node.target
            if isinstance(node, ast.AnnAssign)
            else (node.targets[0] if isinstance(node, ast.Assign) else None)
        )
        if isinstance(target, ast.Name) and target.id == "MODULES" and node.value is not None:
            return ast.literal_eval(node.value)
    raise RuntimeError("docs/gen_pages.py has no MODULES dict")


def _expand(items: list[Any]) -> list[Any]:
    out = []
    for item in items:
        if isinstance(item, dict):
            ((title, value),) = item.items()
            if value == INDEX:
                pages = [INDEX, *({module: f"reference/modules/{page}.md"} for page, module in modules().items())]
                item = {title: pages}
            elif isinstance(value, list):
                item = {title: _expand(value)}
        out.append(item)
    return out


def on_config(config: Any, **kwargs: Any) -> Any:
    config["nav"] = _expand(config["nav"])
    return config
