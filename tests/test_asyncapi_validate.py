"""Issue 47, item 5: ``unilog asyncapi --validate [FILE]`` validates a document with the official parser in one
command, run here as a user runs it: the installed ``unilog`` console script, from a folder of the user's own.

It finds node (or says in one line what to install: exit code 3), finds ``@asyncapi/parser`` in
``$ASYNCAPI_PARSER_DIR`` or its cache folder (``$XDG_CACHE_HOME/unilog/asyncapi-parser``) or installs it there with
npm (or names the npm command in one line: exit code 3), and exits 0 for a valid document, 18
(``ASYNCAPI_INVALID``) for one with errors, each named on its own line. The parser comes from the suite's cache
folder (test_asyncapi.py's ``parser_dir``); the slow test installs it afresh through the command.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_asyncapi import hand_made, log, parser_dir, urls  # noqa: F401 (log and parser_dir are fixtures)
from test_console_script import console_script

from unilog import Settings
from unilog.cli import ExitCode


def user_env(**given: str) -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH, no parser folder unless ``given``."""
    drop = ("PYTHONPATH", "ASYNCAPI_PARSER_DIR", "DATABASE_URL", "REDIS_URL")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **given}


def unilog(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [console_script(), "asyncapi", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


def documents(folder: Path) -> tuple[Path, Path]:
    """A valid document and a broken one: no info.version, and an operation sending another channel's message."""
    good = folder / "good.json"
    good.write_text(json.dumps(hand_made()))
    broken = hand_made()
    del broken["info"]["version"]
    broken["operations"]["rides.publish"]["messages"] = [{"$ref": "#/channels/main/messages/Paid_v1"}]
    bad = folder / "bad.json"
    bad.write_text(json.dumps(broken))
    return good, bad


def only_node(folder: Path) -> str:
    """A PATH with node on it and nothing else (no npm)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed here")
    folder.mkdir()
    (folder / "node").symlink_to(node)
    return str(folder)


def test_a_valid_document_passes_and_a_broken_one_fails_naming_its_errors(parser_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    documents(tmp_path)  # good.json and bad.json, named as a user names them, relative to the folder
    env = user_env(ASYNCAPI_PARSER_DIR=str(parser_dir))
    passed = unilog(tmp_path, env, "--validate", "good.json")
    assert passed.returncode == ExitCode.OK, passed.stdout + passed.stderr
    assert passed.stdout.strip().endswith("good.json: valid AsyncAPI 3.0.0"), passed.stdout
    failed = unilog(tmp_path, env, "--validate", "bad.json")
    assert failed.returncode == ExitCode.ASYNCAPI_INVALID == 18, failed.stdout + failed.stderr
    assert 'must have required property "version"' in failed.stdout
    assert "asyncapi3-operation-messages-from-referred-channel" in failed.stdout
    assert (
        failed.stderr.strip()
        == "unilog: error: bad.json is not a valid AsyncAPI document: the parser's errors are listed above"
    )
    missing = unilog(tmp_path, env, "--validate", "nowhere.json")
    assert (
        missing.returncode == ExitCode.CONFIG
        and missing.stderr.strip() == "unilog: error: cannot read nowhere.json: no such file"
    )


def test_the_parser_is_found_in_unilogs_cache_folder(parser_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    """No ASYNCAPI_PARSER_DIR and no npm on PATH: the parser in ``$XDG_CACHE_HOME/unilog/asyncapi-parser`` is used."""
    good = documents(tmp_path)[0]
    cache = tmp_path / "cache"
    (cache / "unilog").mkdir(parents=True)
    (cache / "unilog" / "asyncapi-parser").symlink_to(parser_dir, target_is_directory=True)
    env = user_env(PATH=only_node(tmp_path / "bin"), XDG_CACHE_HOME=str(cache))
    result = unilog(tmp_path, env, "--validate", str(good))
    assert result.returncode == ExitCode.OK, result.stdout + result.stderr
    assert "installing" not in result.stderr and "valid AsyncAPI 3.0.0" in result.stdout


def test_without_node_one_line_says_what_to_install(tmp_path: Path) -> None:
    good, _ = documents(tmp_path)
    (tmp_path / "empty-bin").mkdir()
    result = unilog(tmp_path, user_env(PATH=str(tmp_path / "empty-bin")), "--validate", str(good))
    assert result.returncode == ExitCode.CONFIG, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    line = result.stderr.strip()
    assert line.startswith("unilog: error: unilog asyncapi --validate runs the official AsyncAPI parser on Node.js")
    assert "apt-get install nodejs npm" in line, line


def test_without_npm_and_without_the_parser_one_line_names_the_npm_command(tmp_path: Path) -> None:
    good, _ = documents(tmp_path)
    env = user_env(PATH=only_node(tmp_path / "bin"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    result = unilog(tmp_path, env, "--validate", str(good))
    assert result.returncode == ExitCode.CONFIG, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    folder = tmp_path / "cache" / "unilog" / "asyncapi-parser"
    assert f"npm is not installed to fetch it: npm install --prefix {folder} @asyncapi/parser@3" in result.stderr


def test_the_logs_own_document_is_validated_as_it_is_built(
    log: Settings,  # noqa: F811
    parser_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    env = user_env(ASYNCAPI_PARSER_DIR=str(parser_dir))
    result = unilog(tmp_path, env, "--validate", "--title", "Rides", *urls(log))
    assert result.returncode == ExitCode.OK, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1] == "the log's AsyncAPI document: valid AsyncAPI 3.0.0", result.stdout
    assert not [line for line in result.stdout.splitlines() if line.startswith(("error", "warning"))], result.stdout
    written = unilog(tmp_path, env, "--validate", "--out", "log.json", *urls(log))
    assert written.returncode == ExitCode.OK, written.stdout + written.stderr
    assert "written to log.json" in written.stdout and "log.json: valid AsyncAPI 3.0.0" in written.stdout
    assert json.loads((tmp_path / "log.json").read_text())["asyncapi"] == "3.0.0"


@pytest.mark.slow(light=True)
def test_the_parser_is_installed_into_the_cache_folder_on_first_use(tmp_path: Path) -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed (apt-get install nodejs npm)")
    good, _ = documents(tmp_path)
    env = user_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    first = unilog(tmp_path, env, "--validate", str(good))
    if first.returncode == ExitCode.CONFIG and "offline?" in first.stderr:
        pytest.skip(f"npm could not install the parser here: {first.stderr.strip()}")
    assert first.returncode == ExitCode.OK, first.stdout + first.stderr
    folder = tmp_path / "cache" / "unilog" / "asyncapi-parser"
    said = f"unilog: installing the AsyncAPI parser (@asyncapi/parser@3) into {folder} with npm, once"
    assert first.stderr.strip() == said, first.stderr
    again = unilog(tmp_path, env, "--validate", str(good))
    assert again.returncode == ExitCode.OK and again.stderr == "", again.stderr
