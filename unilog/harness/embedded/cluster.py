"""A throw-away real Redis Cluster: masters with one replica each, formed from the same ``redis-server`` binaries
the single servers use, with a small node timeout so a failover takes about a second.

The cluster is formed the way ``redis-cli --cluster create`` does it, with plain commands: every node meets the
first, the 16384 slots are split evenly over the masters (``CLUSTER ADDSLOTS``), each replica follows its master
(``CLUSTER REPLICATE``), and :meth:`EmbeddedRedisCluster.start` returns once every node reports ``cluster_state:ok``
and every replica is in sync.
"""

from __future__ import annotations

import random
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import redis

from .binaries import RedisBinary, find_redis
from .process import EmbeddedServerError, _new_temp_dir
from .redis import EmbeddedRedis

SLOTS = 16384


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too, so at most 55535."""
    for _ in range(200):
        port = random.randrange(20000, 55535)
        if _free(port) and _free(port + 10000):
            return port
    raise EmbeddedServerError("no free port pair (port, port + 10000) for a Redis Cluster node")


class EmbeddedRedisCluster:
    """``masters`` masters (3 by default), ``replicas`` replicas each; :attr:`url` names one node (clients discover
    the rest); :meth:`kill_master` kills the master that owns a key, for failover tests."""

    def __init__(
        self,
        base_dir: Path | None = None,
        *,
        masters: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 1000,
        binary: RedisBinary | None = None,
    ) -> None:
        self._own_dir = base_dir is None  # a folder of its own: removed on cleanup, with what the nodes left in it
        self.base_dir = base_dir or _new_temp_dir("unilog-cluster-")
        self.binary = binary or find_redis()
        self.masters_count, self.replicas_count = masters, replicas
        settings = {
            "cluster-enabled": "yes",
            "cluster-config-file": "nodes.conf",
            "cluster-node-timeout": str(node_timeout_ms),
            "cluster-require-full-coverage": "no",  # the other shards keep serving while one fails over
        }
        self._settings = settings
        self.nodes = self._new_nodes()

    def _new_nodes(self) -> list[EmbeddedRedis]:
        count = self.masters_count * (1 + self.replicas_count)
        return [
            EmbeddedRedis(self.base_dir / f"node{i}", port=_cluster_port(), binary=self.binary, settings=self._settings)
            for i in range(count)
        ]

    @property
    def url(self) -> str:
        """One node, as a plain ``redis://`` URL (for redis-py's own cluster client)."""
        return f"redis://127.0.0.1:{self.nodes[0].port}/0"

    @property
    def cluster_url(self) -> str:
        """The ``REDIS_URL`` unilog takes for this cluster: every node a starting point."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes) + "/0"

    def __enter__(self) -> EmbeddedRedisCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(cleanup=True)

    def start(self, timeout: float = 30.0) -> EmbeddedRedisCluster:
        """Start the nodes and form the cluster; a port taken meanwhile by another process (the free-port check
        races) or a formation that times out is retried twice, on fresh ports."""
        for attempt in range(3):
            try:
                for node in self.nodes:
                    node.start()
                self._form(timeout)
                return self
            except EmbeddedServerError:
                self.stop(cleanup=True)
                if attempt == 2:
                    raise
                self.nodes = self._new_nodes()
            except BaseException:
                self.stop(cleanup=True)
                raise
        raise AssertionError("unreachable")

    def _client(self, node: EmbeddedRedis) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=node.port, decode_responses=True, socket_timeout=10)

    def _form(self, timeout: float) -> None:
        first = self._client(self.nodes[0])
        for node in self.nodes[1:]:
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
        masters = self.nodes[: self.masters_count]
        for i, node in enumerate(masters):
            low, high = i * SLOTS // len(masters), (i + 1) * SLOTS // len(masters)
            self._client(node).execute_command("CLUSTER", "ADDSLOTS", *range(low, high))
        self._wait(lambda: all(len(self._known(n)) == len(self.nodes) for n in self.nodes), timeout, "nodes to meet")
        ids = [self._client(m).execute_command("CLUSTER", "MYID") for m in masters]
        for i, node in enumerate(self.nodes[self.masters_count :]):
            self._client(node).execute_command("CLUSTER", "REPLICATE", ids[i % len(masters)])
        self._wait(self._healthy, timeout, "the cluster to be ok with every replica in sync")

    def _known(self, node: EmbeddedRedis) -> list[str]:
        return [line for line in self._client(node).execute_command("CLUSTER", "NODES").splitlines() if line]

    def _healthy(self) -> bool:
        """Every node ok, every replica's link up, and every node's CLUSTER SLOTS (what clients discover) listing
        each range's replicas: Valkey leaves a replica out of it for a moment after its link comes up."""
        per_range = 1 + self.replicas_count  # the master and its replicas
        for node in self.nodes:
            client = self._client(node)
            if "cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
                return False
            info = client.info("replication")
            if info.get("role") == "slave" and info.get("master_link_status") != "up":
                return False
            if any(len(entry) - 2 < per_range for entry in client.execute_command("CLUSTER", "SLOTS")):
                return False
        return True

    @staticmethod
    def _wait(check: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if check():
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise EmbeddedServerError(f"the Redis Cluster did not form: timed out waiting for {what}")
            time.sleep(0.05)

    def master_of(self, key: str) -> EmbeddedRedis:
        """The node that owns ``key``'s slot now."""
        client = self._client(self.nodes[0])
        slot = client.execute_command("CLUSTER", "KEYSLOT", key)
        for low, high, master, *_ in client.execute_command("CLUSTER", "SLOTS"):
            if low <= slot <= high:
                port = int(master[1])
                return next(n for n in self.nodes if n.port == port)
        raise EmbeddedServerError(f"no node serves slot {slot}")

    def masters(self) -> list[EmbeddedRedis]:
        """The running nodes that are masters now."""
        return [n for n in self.nodes if n.pid is not None and self._role(n) == "master"]

    def _role(self, node: EmbeddedRedis) -> str:
        try:
            return str(self._client(node).info("replication").get("role"))
        except redis.RedisError:
            return "unreachable"

    def replicas_of(self, master: EmbeddedRedis) -> list[EmbeddedRedis]:
        """The running nodes that follow ``master`` now."""
        found = []
        for node in self.nodes:
            if node is master or node.pid is None:
                continue
            info = self._client(node).info("replication")
            if info.get("role") == "slave" and int(info.get("master_port", 0)) == master.port:
                found.append(node)
        return found

    def wait_failover(self, replicas: list[EmbeddedRedis], timeout: float = 30.0) -> EmbeddedRedis:
        """Wait until one of ``replicas`` (of a master that died) is promoted and every running node reports the
        cluster ok and names no stopped node as a range's master in ``CLUSTER SLOTS``: a node can say ok before the
        news reached it, and a client that learnt the slots from it connected to the dead master (a CI run's
        ``Error 111 connecting to`` it, right after this returned); return the new master."""
        running = [n for n in self.nodes if n.pid is not None]
        stopped = {n.port for n in self.nodes if n.pid is None}

        def settled(node: EmbeddedRedis) -> bool:
            client = self._client(node)
            if "cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
                return False
            return not any(int(master[1]) in stopped for _, _, master, *_ in client.execute_command("CLUSTER", "SLOTS"))

        def promoted() -> bool:
            return any(self._role(n) == "master" for n in replicas) and all(settled(n) for n in running)

        self._wait(promoted, timeout, "a replica to be promoted")
        return next(n for n in replicas if self._role(n) == "master")

    def wait_replica_online(self, node: EmbeddedRedis, timeout: float = 30.0) -> None:
        """Wait until restarted ``node`` follows a master with its link up and the cluster is ok everywhere."""

        def online() -> bool:
            info = self._client(node).info("replication")
            return info.get("role") == "slave" and info.get("master_link_status") == "up" and self._healthy()

        self._wait(online, timeout, f":{node.port} to rejoin as a replica")

    def stop(self, *, cleanup: bool = False) -> None:
        """Stop every node; ``cleanup=True`` also deletes the folder the cluster made (each node's own cleanup
        leaves the ``nodes.conf`` Redis wrote in it, and so the folder, behind: 54 of them after a day's runs)."""
        for node in self.nodes:
            node.stop(cleanup=cleanup)
        if cleanup and self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)
