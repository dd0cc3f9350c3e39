"""``unilog asyncapi --validate``: check an AsyncAPI document with the official parser, ``@asyncapi/parser`` v3 from
npm, run by Node.js on the validator that ships in this package (``validate_asyncapi.mjs``, package data).

What it needs it finds, installs, or names in one line (:class:`~unilog.errors.MissingTool`, exit code 3):

* ``node``, 18 or later, on ``PATH``;
* the parser, in ``$ASYNCAPI_PARSER_DIR`` if set, else in unilog's cache folder (``$XDG_CACHE_HOME/unilog/
  asyncapi-parser``, by default ``~/.cache/unilog/asyncapi-parser``). If it is not there, ``npm install --prefix
  FOLDER @asyncapi/parser@3`` installs it there once, saying so in one line on stderr; without ``npm``, the line names
  what to install.

The parser's diagnostics go to stdout, one line each; a document with an error raises
:class:`~unilog.errors.AsyncAPIInvalid` (exit code 18).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import AsyncAPIInvalid, MissingTool

PARSER = "@asyncapi/parser"
PARSER_MAJOR = 3
NODE_MAJOR = 18  # the oldest Node.js @asyncapi/parser 3 runs on
VALIDATOR = "validate_asyncapi.mjs"
INSTALL_NODE = "install Node.js 18 or later with npm (Debian, Ubuntu: apt-get install nodejs npm; or nodejs.org)"


def _say(line: str) -> None:
    print(f"unilog: {line}", file=sys.stderr, flush=True)


def parser_folder(env: Mapping[str, str]) -> Path:
    """Where the parser is looked for, and installed if it is not there."""
    given = env.get("ASYNCAPI_PARSER_DIR")
    if given:
        return Path(given).expanduser()
    cache = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "unilog" / "asyncapi-parser"


def parser_installed(folder: Path) -> bool:
    """Whether ``folder`` holds ``@asyncapi/parser`` of the major version the validator is written for."""
    package = folder / "node_modules" / "@asyncapi" / "parser" / "package.json"
    try:
        version = str(json.loads(package.read_text(encoding="utf-8")).get("version", ""))
    except (OSError, ValueError):
        return False
    return version.split(".")[0] == str(PARSER_MAJOR)


def find_node(env: Mapping[str, str]) -> str:
    """The ``node`` program on ``env``'s ``PATH``, checked to be recent enough."""
    node = shutil.which("node", path=env.get("PATH", os.defpath))
    if node is None:
        raise MissingTool(f"unilog asyncapi --validate runs the official AsyncAPI parser on Node.js: {INSTALL_NODE}")
    try:
        shown = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
        major = int(shown.lstrip("v").split(".")[0])
    except (OSError, ValueError, subprocess.SubprocessError):
        raise MissingTool(f"{node} does not run as Node.js: {INSTALL_NODE}") from None
    if major < NODE_MAJOR:
        raise MissingTool(f"{node} is Node.js {shown}, the AsyncAPI parser needs {NODE_MAJOR} or later: {INSTALL_NODE}")
    return node


def ensure_parser(folder: Path, env: Mapping[str, str], say: Callable[[str], None] = _say) -> None:
    """Install the parser into ``folder`` with npm unless it is there already (one line says so)."""
    if parser_installed(folder):
        return
    spec = f"{PARSER}@{PARSER_MAJOR}"
    command = f"npm install --prefix {folder} {spec}"
    npm = shutil.which("npm", path=env.get("PATH", os.defpath))
    if npm is None:
        raise MissingTool(f"the AsyncAPI parser is not in {folder} and npm is not installed to fetch it: {command}")
    say(f"installing the AsyncAPI parser ({spec}) into {folder} with npm, once")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(
            [npm, "install", "--prefix", str(folder), "--no-audit", "--no-fund", "--loglevel=error", spec],
            capture_output=True, text=True, timeout=900, env=dict(env),
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        raise MissingTool(f"{command} failed: {exc}") from None
    if result.returncode != 0 or not parser_installed(folder):
        last = (result.stderr.strip().splitlines() or ["no parser installed"])[-1]
        raise MissingTool(f"{command} failed (offline? set ASYNCAPI_PARSER_DIR to a folder that has it): {last}")


def prepare(env: Mapping[str, str] | None = None) -> Validator:
    """Find node and the parser (installing the parser if need be) before anything else is done."""
    env = dict(os.environ if env is None else env)
    node = find_node(env)
    folder = parser_folder(env)
    ensure_parser(folder, env)
    return Validator(node, folder, env)


@dataclass(frozen=True)
class Validator:
    """node and the parser's folder, found by :func:`prepare`."""

    node: str
    folder: Path
    env: Mapping[str, str]

    def validate(self, document: Path, name: str | None = None) -> None:
        """Validate the AsyncAPI document in ``document`` (JSON or YAML), called ``name`` in the verdict line;
        print the parser's diagnostics, and raise :class:`~unilog.errors.AsyncAPIInvalid` if one is an error."""
        shown = name or str(document)
        with resources.as_file(resources.files(__package__ or "unilog.ops") / VALIDATOR) as script:
            sys.stdout.flush()
            result = subprocess.run(
                [self.node, str(script), str(document), shown],
                stdout=None, stderr=subprocess.PIPE, text=True, timeout=600,
                env={**self.env, "ASYNCAPI_PARSER_DIR": str(self.folder)},
            )  # fmt: skip
        if result.returncode == 1:
            raise AsyncAPIInvalid(f"{shown} is not a valid AsyncAPI document: the parser's errors are listed above")
        if result.returncode != 0:
            said = " ".join(result.stderr.split()) or f"node exited with {result.returncode}"
            raise MissingTool(f"the AsyncAPI validator could not run: {said[:500]}")
