"""``unilog acl --aclfile``: an ACL file for ``redis-server --aclfile`` (the compose file's redis-users service).

The same users as the ``ACL SETUSER`` lines (tests/test_acl_commands.py runs each kind under them), as ``user`` lines
holding the password's SHA-256 rather than the password, and a ``default`` user line: off unless an administrator's
password is given, because Redis would otherwise create the default user with no password and every right.
tests/test_compose_podman.py starts Redis with such a file and runs the fleet under its users.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys

from cli import one_line

from unilog.cli import ExitCode


def acl(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "unilog", "acl", "--streams", "rides", "--password", "s3cret", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_the_file_holds_hashes_and_turns_the_default_user_off() -> None:
    plain = acl().stdout.splitlines()
    result = acl("--aclfile")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    digest = hashlib.sha256(b"s3cret").hexdigest()
    assert "s3cret" not in result.stdout
    assert len(lines) == len(plain) + 1
    for setuser, line in zip(plain, lines, strict=False):
        # the same user and rules, as a file line with the hash in place of the password
        assert line == setuser.replace("ACL SETUSER ", "user ", 1).replace(">s3cret", f"#{digest}"), line
    assert lines[-1] == "user default reset off"


def test_an_administrator_keeps_the_default_user() -> None:
    lines = acl("--aclfile", "--admin-password", "adm").stdout.splitlines()
    digest = hashlib.sha256(b"adm").hexdigest()
    assert lines[-1] == f"user default reset on #{digest} ~* &* +@all"


def test_admin_password_without_aclfile_is_refused_in_one_line() -> None:
    result = acl("--admin-password", "adm")
    assert result.returncode == ExitCode.CONFIG
    assert "--admin-password is for --aclfile" in one_line(result)
