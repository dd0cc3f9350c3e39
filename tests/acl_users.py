"""Creating the Redis ACL users `unilog acl` prints, on the test's Redis: shared by the ACL tests."""

from __future__ import annotations

import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from unilog import Settings

KINDS = ("streamer", "consumer", "group", "operator")


@contextmanager
def acl_users(settings: Settings, rds: Any, streams: Sequence[str], password: str) -> Iterator[dict[str, str]]:
    """The users `unilog acl --streams ...` prints (run as users run it), created on the test's Redis; their URLs by
    kind. Deleted afterwards. Skips the test when the test's Redis user may not create users."""
    prefix = f"t{uuid.uuid4().hex[:6]}-"
    argv = ["acl", "--streams", ",".join(streams), "--prefix", prefix, "--password", password]
    printed = subprocess.run(
        [sys.executable, "-m", "unilog", *argv], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert len(printed) == len(KINDS)
    try:
        for line in printed:
            rds.execute_command(*shlex.split(line))
    except redis.ResponseError as exc:  # a Redis given by URL whose user may not manage ACLs
        pytest.skip(f"the test's Redis user may not create ACL users: {exc}")
    parts = urlsplit(settings.redis_url)
    host = parts.netloc.rpartition("@")[2]
    try:
        yield {kind: urlunsplit(parts._replace(netloc=f"{prefix}{kind}:{password}@{host}")) for kind in KINDS}
    finally:
        for kind in KINDS:
            rds.execute_command("ACL", "DELUSER", f"{prefix}{kind}")
