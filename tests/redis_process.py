"""Test helpers for Redis: reachability, key clean-up on the shared server, and private servers.

The shared Redis (``harness.redis_url()``) is never stopped or flushed: tests use unique key
prefixes there and delete their own keys. Tests that take Redis down start a private
``redis-server`` on a free loopback port, without persistence, and kill it themselves.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import redis

from harness import redis_url, service_missing
from ports import free_port


def unique_prefix(what: str = "hwtest") -> str:
    return f"{what}-{uuid.uuid4().hex[:12]}"


def redis_reachable(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def require_shared_redis() -> str:
    """The shared Redis URL; skips (or fails under HALTWIRE_REQUIRE_SERVICES=1) when it is down."""
    url = redis_url()
    if not redis_reachable(url):
        service_missing("Redis")
    return url


def delete_prefix(url: str, prefix: str) -> int:
    """Delete every key under ``prefix:`` on the shared server; returns how many."""
    client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        return int(client.delete(*keys)) if keys else 0
    except (redis.RedisError, OSError):
        return 0
    finally:
        client.close()


@contextlib.contextmanager
def shared_prefix(what: str = "hwtest") -> Iterator[tuple[str, str]]:
    """(shared Redis URL, a fresh key prefix); the prefix's keys are deleted afterwards."""
    url = require_shared_redis()
    prefix = unique_prefix(what)
    try:
        yield url, prefix
    finally:
        delete_prefix(url, prefix)


class RedisProcess:
    """A private ``redis-server`` on a fixed loopback port that a test may kill and restart."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.binary = shutil.which("redis-server")
        self.port = port if port is not None else free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        if self.binary is None:
            service_missing("redis-server (the binary)")
        assert self.binary is not None
        assert self.proc is None, "already running"
        log = (self.workdir / f"redis-{self.port}.log").open("ab")
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while not redis_reachable(self.url):
            if self.proc.poll() is not None:
                self.proc = None
                raise RuntimeError(f"redis-server on port {self.port} exited at start-up; see {log.name}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} did not answer within {timeout_s} s")
            time.sleep(0.02)

    def stop(self) -> None:
        """Kill the server (SIGKILL: a crash, nothing is saved) and wait until it is gone."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.kill()
        proc.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@contextlib.contextmanager
def private_redis(workdir: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(workdir)
    try:
        server.start()
        yield server
    finally:
        server.stop()



def script_commands_since_reset(client: redis.Redis) -> dict[str, int]:
    """How a store reached ``client``'s server since ``CONFIG RESETSTAT``: its scripts run
    (``evalsha``, ``eval``) or loaded (``script|load``) and the slots mapped (``cluster|...``),
    by name. (The commands the scripts run are counted by the server too, and left out.)"""
    stats: dict[str, dict[str, int]] = client.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in stats.items()}
    return {
        name: n
        for name, n in calls.items()
        if n and (name in ("evalsha", "eval", "script|load") or name.startswith("cluster|"))
    }
