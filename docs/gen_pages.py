"""Build pages at build time, so nothing is written twice: files kept elsewhere in the repository, and one reference
page per public module.

Run by the mkdocs-gen-files plugin (mkdocs.yml):

* ``COPIES``: the benchmark results (bench/RESULTS.md, the load-curve and soak plots), and the architecture guide,
  the contributing guide and the changelog at the repository's top level;
* ``MODULES``: the module reference, one page per public module (``reference/modules/<page>.md``), rendered by
  mkdocstrings from the module's docstrings. This dict is the one list: docs/hooks.py reads it to put the pages in the
  navigation, so when a module moves, change its path here and nowhere else (griffe reads the source files, so the
  path must be where the code is).
"""

from __future__ import annotations

from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parent.parent

# repository file -> page (or file) of the site
COPIES = {
    "bench/RESULTS.md": "benchmarks/results.md",
    "bench/load-curves.png": "benchmarks/load-curves.png",
    "bench/RESULTS-soak.png": "benchmarks/RESULTS-soak.png",  # the hour's soak, embedded in results.md
    "ARCHITECTURE.md": "architecture.md",
    "CONTRIBUTING.md": "contributing.md",
    "CHANGELOG.md": "changelog.md",
}

# page of the module reference -> the module it renders (a literal dict: docs/hooks.py reads it without running this)
MODULES = {
    "admin": "unilog.ops.admin",
    "archive": "unilog.spark.archive",
    "backfill": "unilog.produce.backfill",
    "cli": "unilog.cli",
    "compat": "unilog.contracts.compat",
    "contracts": "unilog.contracts",
    "dashboard": "unilog.ops.dashboard",
    "dlq": "unilog.ops.dlq",
    "exporter": "unilog.ops.exporter",
    "log": "unilog.log",
    "metrics": "unilog.metrics",
    "acl": "unilog.ops.acl",
    "runtime": "unilog.runtime",
    "reconcile": "unilog.spark.reconcile",
    "schema": "unilog.ops.schema",
    "spark": "unilog.spark",
    "status": "unilog.ops.status",
    "tracing": "unilog.tracing",
}

MODULE_PAGE = """\
# `{module}`

Generated from the module's docstrings when the site is built. The names a user needs first are imported from
`unilog` itself: see [the public API](../api.md).

::: {module}
    options:
      show_root_heading: false
      show_root_toc_entry: false
      heading_level: 2
      show_submodules: false
"""

INDEX_PAGE = """\
# Modules

One page per public module, generated from its docstrings. The facade, `import unilog`, is on
[the public API](../api.md) page; the `unilog` command is on [the command line](../cli.md) page.

{rows}
"""

for source, page in COPIES.items():
    with mkdocs_gen_files.open(page, "wb") as out:
        out.write((ROOT / source).read_bytes())
    if page.endswith(".md"):
        mkdocs_gen_files.set_edit_path(page, f"../{source}")

for page, module in MODULES.items():
    with mkdocs_gen_files.open(f"reference/modules/{page}.md", "w") as out:
        out.write(MODULE_PAGE.format(module=module))

with mkdocs_gen_files.open("reference/modules/index.md", "w") as out:
    rows = "\n".join(f"* [`{module}`]({page}.md)" for page, module in MODULES.items())
    out.write(INDEX_PAGE.format(rows=rows))
