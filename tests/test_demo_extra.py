"""``unilog demo`` and ``unilog chaos`` after a bare ``pip install unilog-outbox`` (issue 28): they name
``pip install 'unilog-outbox[demo]'`` in one line, exit code 3, before starting any server; and an API that does not come
up is reported at once, with its log's last line, in a log that is kept (never a path to a deleted file).

The check is tested without uninstalling anything: :func:`unilog.harness.app.missing_modules` with module names that
do not exist, and the commands with it made to report everything missing."""

from __future__ import annotations

import dataclasses
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import structlog

from unilog import UnilogError
from unilog.cli import ExitCode, main
from unilog.harness import app as harness_app
from unilog.harness import chaos as harness_chaos
from unilog.harness import demo as harness_demo
from unilog.harness.app import missing_modules
from unilog.harness.chaos.runner import wait_for_api
from unilog.harness.embedded import free_port
from unilog.harness.supervisor import Fleet, ProcessSpec


def test_missing_modules_names_exactly_those_that_cannot_be_imported() -> None:
    missing = ["no_such_module_for_unilog", "no_such_parent_for_unilog.child", "unilog.no_such_module"]
    assert missing_modules(["json", *missing, "unilog", "unilog.produce.encoding"]) == missing
    assert missing_modules([]) == []


def _main(argv: list[str]) -> int:
    """The command in this process; logging back to its defaults after (main configures it onto the test's captured
    stdout, which pytest closes)."""
    try:
        return main(argv)
    finally:
        structlog.reset_defaults()
        logging.basicConfig(level=logging.WARNING, force=True)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["demo"], "gunicorn, flask, pydantic"),
        (["demo", "--api", "fastapi", "--dashboard"], "uvicorn, fastapi, greenlet, pydantic, flask"),
        (["chaos"], "gunicorn, flask, pydantic"),
        (["chaos", "--api", "fastapi"], "uvicorn, fastapi, greenlet, pydantic"),
    ],
)
def test_demo_and_chaos_without_the_demo_extra_stop_before_starting_anything(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    """As after ``pip install unilog-outbox``: nothing the run needs from the demo extra can be imported."""
    monkeypatch.setattr(harness_app, "missing_modules", lambda names: list(names))

    def started(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("the command started its servers before checking the demo extra")

    monkeypatch.setattr(harness_demo, "run_demo", started)
    monkeypatch.setattr(harness_chaos, "run_chaos", started)
    assert _main(argv) == ExitCode.CONFIG
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "pip install 'unilog-outbox[demo]'" in lines[0] and f"(no {named})" in lines[0], lines[0]


def test_with_the_demo_extra_installed_the_check_passes() -> None:
    pytest.importorskip("gunicorn")
    pytest.importorskip("uvicorn")
    from unilog_demo.commands import require_demo_extra

    require_demo_extra("demo", "flask", "flask")
    require_demo_extra("chaos", "fastapi")


def test_an_api_that_exits_is_reported_at_once_with_its_logs_last_line(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path / "logs")
    script = "import sys; print('starting'); print('ModuleNotFoundError: No module named gunicorn'); sys.exit(3)"
    fleet.start(ProcessSpec("api", [sys.executable, "-c", script]))
    try:
        with pytest.raises(UnilogError) as caught:
            wait_for_api(free_port(), fleet, timeout=120)
    finally:
        fleet.stop_all()
    message = str(caught.value)
    assert "\n" not in message and "it exited with code 3" in message, message  # not "no answer ... in 120 s"
    assert "its log's last line: ModuleNotFoundError: No module named gunicorn" in message, message
    assert f"whole log: {tmp_path / 'logs' / 'api.log'}" in message, message


def test_the_demo_keeps_the_log_its_error_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's own temporary log folder, with an API that cannot start: the log the error names is there."""
    from unilog_demo.fleet import APP

    monkeypatch.chdir(tmp_path)
    broken = dataclasses.replace(APP, api="no_such_api_module_for_unilog:app")
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(UnilogError, match="the API did not come up") as caught, open(tmp_path / "out", "w") as out:
            harness_demo.run_demo(broken, duration=1, faults=False, spark=False, out=out)
    finally:
        for signum, handler in handlers.items():  # the demo stops on Ctrl-C; pytest must again
            signal.signal(signum, handler)
    log = Path(str(caught.value).rpartition("whole log: ")[2])
    assert log.is_file() and log.read_text().strip(), caught.value
    assert "no_such_api_module_for_unilog" in log.read_text()
