"""A handler that cannot be loaded (issue 28): whatever stops its import (a syntax error, an exception at import
time, a missing dependency, a missing module or attribute) is one line and exit code 6 (``HANDLER``), never a
traceback; and a reference that names a module says that a handler reference is ``module:function``. Each runs
``unilog consume`` as a user does, in a working directory holding the broken module (the loader searches it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli import one_line, unilog

from unilog import Settings
from unilog.cli import ExitCode

BROKEN_MODULES = {
    "a syntax error": (
        "def handle(conn, records)\n    pass\n",
        "mine:handle",
        "SyntaxError in {path}, line 1",
    ),
    "an exception at import time": (
        "import os\n\nSETTING = os.environ['UNILOG_TEST_NO_SUCH_SETTING']\n",
        "mine:handle",
        "importing it raised KeyError: 'UNILOG_TEST_NO_SUCH_SETTING' at {path}, line 3",
    ),
    "a missing dependency": (
        "import unilog_test_no_such_dependency\n\n\ndef handle(conn, records):\n    pass\n",
        "mine:handle",
        "it imports 'unilog_test_no_such_dependency', which cannot be found",
    ),
    "a missing attribute": (
        "def handel(conn, records):\n    pass\n",
        "mine:handle",
        "'mine' has no 'handle' ('mine:handle')",
    ),
    "a missing module": (None, "nomine:handle", "no module named 'nomine'"),
}


@pytest.mark.parametrize("kind", BROKEN_MODULES)
def test_a_handler_that_cannot_be_imported_is_one_line_and_the_handler_exit_code(
    settings: Settings, tmp_path: Path, kind: str
) -> None:
    source, ref, expected = BROKEN_MODULES[kind]
    if source is not None:
        (tmp_path / "mine.py").write_text(source)
    result = unilog(settings, "consume", ref, "--name", "c", "--once", cwd=tmp_path)
    assert result.returncode == ExitCode.HANDLER, result.stderr
    line = one_line(result)
    assert line.startswith("unilog: error: ") and expected.format(path=tmp_path / "mine.py") in line, line


@pytest.mark.parametrize("imports_it", [False, True], ids=["module-not-imported", "module-imported-by-package"])
def test_a_reference_to_a_module_says_a_handler_reference_is_module_function(
    settings: Settings, tmp_path: Path, imports_it: bool
) -> None:
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("from . import consumers\n" if imports_it else "")
    (tmp_path / "myapp" / "consumers.py").write_text("def handle(conn, records):\n    pass\n")
    result = unilog(settings, "consume", "myapp.consumers", "--name", "c", "--once", cwd=tmp_path)
    assert result.returncode == ExitCode.HANDLER, result.stderr
    line = one_line(result)
    assert "'myapp.consumers' is a module: a handler reference is module:function" in line, line
    assert "like 'myapp.consumers:handle'" in line and "has no" not in line, line
    done = unilog(settings, "consume", "myapp.consumers:handle", "--name", "c", "--once", cwd=tmp_path)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ("consume", "handlers.cli_handler", "--name", "c", "--once"),
        ("consumer", "rebuild", "c", "handlers.cli_handler", "--reset-state", "handlers:cli_handler"),
        ("consumer", "rebuild", "c", "handlers:cli_handler", "--reset-state", "handlers.cli_handler"),
    ],
    ids=["consume", "rebuild-handler", "rebuild-reset-state"],
)
def test_a_dotted_reference_is_refused_with_the_colon_form_it_meant(settings: Settings, argv: tuple[str, ...]) -> None:
    """``handlers.cli_handler`` (a mistyped ``handlers:cli_handler``) was accepted: the docs say module:function and
    the code now says the same, in one line that names the reference it meant, and consumes nothing."""
    result = unilog(settings, *argv)
    assert result.returncode == ExitCode.HANDLER, result.stderr
    line = one_line(result)
    assert "'handlers.cli_handler' is not module:function" in line and "'handlers:cli_handler'" in line, line
    assert "handled" not in result.stdout, result.stdout
