"""Bring files kept elsewhere in the repository into the site at build time, so they are not duplicated in docs/.

Run by the mkdocs-gen-files plugin (mkdocs.yml): the benchmark results (bench/RESULTS.md, the load-curve and soak plots)
and the architecture and contributing guides at the repository's top level.
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
}

for source, page in COPIES.items():
    with mkdocs_gen_files.open(page, "wb") as out:
        out.write((ROOT / source).read_bytes())
    if page.endswith(".md"):
        mkdocs_gen_files.set_edit_path(page, f"../{source}")
