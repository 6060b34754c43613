"""A private Redis Cluster for tests: three ``redis-server`` masters in cluster mode on loopback.

Each master has an ephemeral port, a temp dir and its own ``nodes.conf``; the slots are split
in three with ``CLUSTER ADDSLOTSRANGE`` and the nodes meet with ``CLUSTER MEET`` (no replicas).
The servers run with ``cluster-require-full-coverage no``, so a master that is down takes only
its own slots with it, and with ``appendfsync always``, so a master killed and restarted on its
port with its ``nodes.conf`` comes back with every count it had acknowledged.

Skipped without ``redis-server`` (failed under ``HALTWIRE_REQUIRE_SERVICES=1``).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import redis
from redis.crc import key_slot

from harness import service_missing
from redis_process import free_port

SLOTS = 16384
#: How long a master may stay unreachable before the others mark it failing (milliseconds).
NODE_TIMEOUT_MS = 1000


class ClusterNode:
    """One master: killed (a crash) and restarted on its port with its ``nodes.conf`` and AOF."""

    def __init__(self, binary: str, workdir: Path, port: int, bus_port: int) -> None:
        self.binary = binary
        self.port = port
        #: The cluster bus's port, set apart (by default it is port + 10000, often past 65535).
        self.bus_port = bus_port
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert self.proc is None, "already running"
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = (self.workdir / "redis.log").open("ab")
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", str(self.workdir),
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-port", str(self.bus_port),
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                "--cluster-require-full-coverage", "no",
                "--save", "",
                "--appendonly", "yes",
                "--appendfsync", "always",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()

    def client(self) -> Any:
        """A plain client of this node (``Any``: its raw cluster commands are untyped)."""
        return cast(Any, redis.Redis)(host="127.0.0.1", port=self.port, socket_timeout=2, socket_connect_timeout=2)

    def wait_answering(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} exited; see {self.workdir}/redis.log")
            c = self.client()
            try:
                if c.ping():
                    return
            except (redis.RedisError, OSError):
                pass
            finally:
                c.close()
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not answer within {timeout_s} s")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL (a crash) and wait until it is gone."""
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.kill()
            proc.wait(timeout=10)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class RedisClusterProcesses:
    """Three masters, slots split evenly; ``url`` names one node (the client finds the rest)."""

    def __init__(self, workdir: Path, masters: int = 3) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            service_missing("redis-server (the binary)")
        assert binary is not None
        self.nodes = [ClusterNode(binary, workdir / f"node-{i}", free_port(), free_port()) for i in range(masters)]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    @property
    def urls(self) -> list[str]:
        return [f"redis://127.0.0.1:{n.port}" for n in self.nodes]

    def start(self, timeout_s: float = 20.0) -> None:
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            node.wait_answering()
        n = len(self.nodes)
        for i, node in enumerate(self.nodes):
            c = node.client()
            try:
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", i * SLOTS // n, (i + 1) * SLOTS // n - 1)
                if i:
                    c.execute_command("CLUSTER", "MEET", "127.0.0.1", self.nodes[0].port, self.nodes[0].bus_port)
            finally:
                c.close()
        self.wait_ok(timeout_s)

    def wait_ok(self, timeout_s: float = 20.0) -> None:
        """Until every running master says the cluster is ok, knows every other master and where
        every slot is (else a client's first map of the slots sends commands astray: MOVED)."""
        deadline = time.monotonic() + timeout_s
        while not all(self._ok(node) for node in self.nodes if node.running):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test cluster was not ok within {timeout_s} s")
            time.sleep(0.05)

    def _ok(self, node: ClusterNode) -> bool:
        c = node.client()
        try:
            info = c.execute_command("CLUSTER", "INFO")
            text = info.decode() if isinstance(info, bytes) else str(info)
            fields = dict(line.split(":", 1) for line in text.split() if ":" in line)
            return (
                fields.get("cluster_state") == "ok"
                and fields.get("cluster_known_nodes") == str(len(self.nodes))
                and fields.get("cluster_slots_assigned") == str(SLOTS)
            )
        except (redis.RedisError, OSError):
            return False
        finally:
            c.close()

    def node_of(self, key: str) -> ClusterNode:
        """The master serving ``key``'s slot (the slots are split evenly at start)."""
        n, slot = len(self.nodes), key_slot(key.encode())
        return next(node for i, node in enumerate(self.nodes) if slot < (i + 1) * SLOTS // n)

    def restart(self, node: ClusterNode, timeout_s: float = 20.0) -> None:
        """Start a killed master again, on its port, with its nodes.conf and AOF."""
        node.start()
        node.wait_answering()
        self.wait_ok(timeout_s)

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster.from_url(self.url, socket_timeout=2, socket_connect_timeout=2)

    def flushall(self) -> None:
        for node in self.nodes:
            if node.running:
                c = node.client()
                try:
                    c.flushall()
                finally:
                    c.close()

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()


@contextlib.contextmanager
def redis_cluster(workdir: Path) -> Iterator[RedisClusterProcesses]:
    cluster = RedisClusterProcesses(workdir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
