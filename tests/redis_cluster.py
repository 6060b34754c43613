"""A private Redis Cluster for tests: three ``redis-server`` masters in cluster mode on loopback,
and optionally a replica of each (``replicas=1``), so that a master killed is failed over.

Each node has an ephemeral port, a temp dir and its own ``nodes.conf``; the slots are split
in three with ``CLUSTER ADDSLOTSRANGE``, the nodes meet with ``CLUSTER MEET``, and each replica
follows its master with ``CLUSTER REPLICATE``. The servers run with
``cluster-require-full-coverage no``, so a master that is down takes only its own slots with
it, and with ``appendfsync always``, so a master killed and restarted on its port with its
``nodes.conf`` comes back with every count it had acknowledged. With replicas, the others mark a
killed master failed after ``NODE_TIMEOUT_MS`` and its replica takes its slots over (a failover,
about two seconds here); a killed master restarted later comes back as a replica of it.

Skipped without ``redis-server`` (failed under ``HALTWIRE_REQUIRE_SERVICES=1``).
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import redis
from redis.crc import key_slot

from harness import service_missing
from ports import free_ports

SLOTS = 16384
#: How long a master may stay unreachable before the others mark it failing (milliseconds).
NODE_TIMEOUT_MS = 1000


class ClusterNode:
    """One node: killed (a crash) and restarted on its port with its ``nodes.conf`` and AOF."""

    def __init__(self, binary: str, workdir: Path, port: int, bus_port: int) -> None:
        self.binary = binary
        self.port = port
        #: The cluster bus's port, set apart (by default it is port + 10000, often past 65535).
        self.bus_port = bus_port
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.frozen = False

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
                "--repl-diskless-sync-delay", "0",  # a replica syncs at once, not after 5 s
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
        self.frozen = False
        if proc is not None:
            proc.kill()
            proc.wait(timeout=10)

    def freeze(self) -> None:
        """SIGSTOP: a host that hangs (connections open, nothing answered, no reset), not a crash."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
        self.frozen = False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def answering(self) -> bool:
        """Running and not frozen."""
        return self.running and not self.frozen

    def read(self, key: str) -> tuple[bytes | None, str]:
        """``key``'s value on this node, a replica too (``READONLY``), and the node's role after
        the read ("master" or "slave"): a replica's value read while it was one."""
        c = cast(Any, redis.Redis)(
            host="127.0.0.1",
            port=self.port,
            socket_timeout=2,
            socket_connect_timeout=2,
            single_connection_client=True,
        )
        try:
            c.execute_command("READONLY")
            value = c.get(key)
            return value, str(c.execute_command("ROLE")[0].decode())
        finally:
            c.close()

    def id(self) -> str:
        """Its node id (``CLUSTER MYID``)."""
        c = self.client()
        try:
            return str(c.execute_command("CLUSTER", "MYID").decode())
        finally:
            c.close()


class RedisClusterProcesses:
    """Three masters, slots split evenly, and ``replicas`` of each; ``url`` names one node (the
    client finds the rest). ``nodes`` are every node, the masters first (as started: a failover
    changes who is master, ``serving`` asks the cluster)."""

    def __init__(self, workdir: Path, masters: int = 3, replicas: int = 0) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            service_missing("redis-server (the binary)")
        assert binary is not None
        count = masters * (1 + replicas)
        self.nodes = [
            ClusterNode(binary, workdir / f"node-{i}", *free_ports(2)) for i in range(count)
        ]
        self.masters = self.nodes[:masters]
        #: Each replica, with the master it was started to follow.
        self.replicas = [(node, self.masters[i % masters]) for i, node in enumerate(self.nodes[masters:])]

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
        n = len(self.masters)
        for i, node in enumerate(self.nodes):
            c = node.client()
            try:
                if i < n:
                    c.execute_command("CLUSTER", "ADDSLOTSRANGE", i * SLOTS // n, (i + 1) * SLOTS // n - 1)
                if i:
                    c.execute_command("CLUSTER", "MEET", "127.0.0.1", self.nodes[0].port, self.nodes[0].bus_port)
            finally:
                c.close()
        self.wait_ok(timeout_s)
        for replica, master in self.replicas:
            c = replica.client()
            try:
                c.execute_command("CLUSTER", "REPLICATE", master.id())
            finally:
                c.close()
        self.wait_replicating(timeout_s)
        self.wait_ok(timeout_s)

    def wait_replicating(self, timeout_s: float = 20.0) -> None:
        """Until every running replica's link to its master is up and every master streams its
        writes to its replicas: a write on each is acknowledged by all of them (``WAIT``). After a
        diskless sync Redis 7.0 holds a replica's stream until the replica's first acknowledgement,
        up to a second later: a count taken before then is on the master only."""
        deadline = time.monotonic() + timeout_s
        while not all(self._linked(node) for node in self.nodes if node.answering):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test cluster's replicas were not in sync within {timeout_s} s")
            time.sleep(0.05)
        for node in self.nodes:
            if not node.answering:
                continue
            c = node.client()
            try:
                info = c.info("replication")
                if info.get("role") != "master" or not info.get("connected_slaves"):
                    continue
                key = self._key_on(node)
                c.set(key, "1")
                c.delete(key)
                ms = max(1, round((deadline - time.monotonic()) * 1000))
                if c.execute_command("WAIT", info["connected_slaves"], ms) < info["connected_slaves"]:
                    raise RuntimeError(f"the replicas of port {node.port} did not acknowledge a write")
            finally:
                c.close()

    @staticmethod
    def _linked(node: ClusterNode) -> bool:
        """A master, or a replica whose link to its master is up."""
        c = node.client()
        try:
            info = c.info("replication")
            return bool(info.get("role") == "master" or info.get("master_link_status") == "up")
        except (redis.RedisError, OSError):
            return False
        finally:
            c.close()

    def wait_ok(self, timeout_s: float = 20.0) -> None:
        """Until every running node says the cluster is ok, knows every other node and where
        every slot is (else a client's first map of the slots sends commands astray: MOVED)."""
        deadline = time.monotonic() + timeout_s
        while not all(self._ok(node) for node in self.nodes if node.answering):
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
        """The master serving ``key``'s slot at start (the slots are split evenly among them)."""
        n, slot = len(self.masters), key_slot(key.encode())
        return next(node for i, node in enumerate(self.masters) if slot < (i + 1) * SLOTS // n)

    def replica_of(self, master: ClusterNode) -> ClusterNode:
        """A running replica of ``master`` now (its ``INFO replication``)."""
        for node in self.nodes:
            if node.answering and node is not master:
                c = node.client()
                try:
                    info = c.info("replication")
                finally:
                    c.close()
                if info.get("role") == "slave" and info.get("master_port") == master.port:
                    return node
        raise LookupError(f"no replica of port {master.port}")

    def owners(self, asked: ClusterNode) -> dict[ClusterNode, list[tuple[int, int]]]:
        """The masters serving slots as ``asked`` (a running node) sees them now (``CLUSTER
        NODES``), with their ranges of slots; a master marked failed serves none."""
        c = asked.client()
        try:
            raw = c.execute_command("CLUSTER", "NODES")
        finally:
            c.close()
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        owners: dict[ClusterNode, list[tuple[int, int]]] = {}
        for line in text.splitlines():
            # id address flags master ping-sent pong-recv config-epoch link-state slot...
            fields = line.split(" ")
            address, flags, state, ranges = fields[1], fields[2].split(","), fields[7], fields[8:]
            if "master" not in flags or "fail" in flags or state != "connected":
                continue
            port = int(address.split("@")[0].rsplit(":", 1)[1])
            node = next(n for n in self.nodes if n.port == port)
            for r in ranges:
                first, _, last = r.partition("-")
                if first.isdigit():  # not a slot on the move ("[slot->-id]")
                    owners.setdefault(node, []).append((int(first), int(last or first)))
        return owners

    def serving(self, key: str, asked: ClusterNode | None = None) -> ClusterNode | None:
        """The master serving ``key``'s slot as ``asked`` (a running node, by default the first)
        sees it now; None while the slot's master is marked failed."""
        slot = key_slot(key.encode())
        owners = self.owners(asked or next(n for n in self.nodes if n.answering))
        return next((node for node, ranges in owners.items() if any(a <= slot <= b for a, b in ranges)), None)

    def _key_on(self, master: ClusterNode) -> str:
        """A key of one of the slots ``master`` serves."""
        ranges = self.owners(master)[master]
        return next(
            key
            for key in (f"hwtest-sync-{i}" for i in itertools.count())
            if any(a <= key_slot(key.encode()) <= b for a, b in ranges)
        )

    def wait_failed_over(self, key: str, killed: ClusterNode, timeout_s: float = 20.0) -> ClusterNode:
        """Until every answering node sees a master other than ``killed`` serving ``key``'s slot; that master."""
        deadline = time.monotonic() + timeout_s
        while True:
            seen = {self.serving(key, n) for n in self.nodes if n.answering}
            if len(seen) == 1 and None not in seen and killed not in seen:
                promoted = seen.pop()
                assert promoted is not None
                return promoted
            if time.monotonic() > deadline:
                raise RuntimeError(f"no failover of {key!r}'s slot within {timeout_s} s")
            time.sleep(0.02)

    def restart(self, node: ClusterNode, timeout_s: float = 20.0) -> None:
        """Start a killed node again, on its port, with its nodes.conf and AOF (a master failed
        over comes back as a replica of the one that took its slots)."""
        node.start()
        node.wait_answering()
        self.wait_ok(timeout_s)

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster.from_url(self.url, socket_timeout=2, socket_connect_timeout=2)

    def flushall(self) -> None:
        for node in self.nodes:
            if node.answering:
                c = node.client()
                try:
                    if c.info("replication").get("role") == "master":
                        c.flushall()
                finally:
                    c.close()

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()  # a frozen one too


@contextlib.contextmanager
def redis_cluster(workdir: Path, replicas: int = 0) -> Iterator[RedisClusterProcesses]:
    cluster = RedisClusterProcesses(workdir, replicas=replicas)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
