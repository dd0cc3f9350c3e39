"""A real Redis Cluster for the tests that need one (``yield from embedded_cluster()`` in a fixture of any scope)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from unilog.harness.embedded import EmbeddedRedisCluster, ServerNotFound


def embedded_cluster() -> Iterator[EmbeddedRedisCluster]:
    """Three masters, three replicas from the harness, stopped after; skips the test without a redis-server."""
    try:
        server = EmbeddedRedisCluster().start()
    except ServerNotFound as exc:
        pytest.skip(f"no redis-server to start: {exc}")
    yield server
    server.stop(cleanup=True)
