"""Render an AsyncAPI document of a log at build time: reference/asyncapi.md (its channels, operations, messages
with their payloads' fields, and named schemas, as Markdown tables) and reference/asyncapi.json (the document).

Run by the mkdocs-gen-files plugin (mkdocs.yml). The record types come from ``CONTRACTS``, the demo's: a module name
(imported as ``unilog asyncapi --module`` imports it) or a ``.py`` file of the repository (loaded by path); the
environment variable ``UNILOG_DOCS_CONTRACTS`` overrides it. No server is needed: the document has the streams of the
types and the streamer's ``send`` operations; the consumers the page names are ``READERS``, the demo's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import mkdocs_gen_files

from unilog.contracts.asyncapi import Reader, build_document
from unilog.ops.asyncapi import markdown, module_types

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS = "unilog_demo.records"  # the Rocket Rides demo's record types (services/records.py)
STREAM = "rocket-rides-log"  # the demo's stream (services/rides.py), read by its consumers and its group
READERS = [*(Reader(STREAM, name) for name in ("consumer0", "consumer1", "spark0")), Reader(STREAM, "group0", "group")]
PAGE, RAW = "reference/asyncapi.md", "reference/asyncapi.json"

INTRO = """\
This page is generated when the site is built, from the record types of the Rocket Rides demo (`{source}`,
`services/records.py` in the repository) and the consumers it runs, by the same code as `unilog asyncapi`
([the command line](cli.md#unilog-asyncapi)), which writes the document of a real log from its registered types,
streams, consumers and groups. The official parser,
`@asyncapi/parser`, validates such a document: `node tools/validate_asyncapi.mjs FILE`.

"""


def module_name(source: str) -> str:
    """The module to read the contracts from: ``source`` itself, or the ``.py`` file it names, loaded by path."""
    if not source.endswith(".py"):
        return source
    name = "unilog_docs_contracts"
    spec = importlib.util.spec_from_file_location(name, ROOT / source)
    assert spec is not None and spec.loader is not None, source
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # contracts_in finds it by name
    spec.loader.exec_module(module)
    return name


source = os.environ.get("UNILOG_DOCS_CONTRACTS", CONTRACTS)
types = module_types([module_name(source)], set(), registered=True)
document = build_document(types, title="Rocket Rides", version="1.0.0", default_stream=STREAM, readers=READERS)
with mkdocs_gen_files.open(RAW, "w") as out:
    json.dump(document, out, indent=2)
with mkdocs_gen_files.open(PAGE, "w") as out:
    page = markdown(document, "asyncapi.json")
    title, _, rest = page.partition("\n\n")
    out.write(f"{title}\n\n{INTRO.format(source=source)}{rest}")
