"""A network namespace whose only reachable address is the egress proxy's (issue 15's recipe,
``docs/egress.md``), made and removed by the test itself with iproute2.

``isolated_namespace`` creates, with names unique to the call:

- a network namespace ``hwe-XXXXXX`` holding one end of a veth pair (``hwnXXXXXX``) with
  ``NS_IP/30``: no default route, no other interface up, so from inside it only ``HOST_IP``
  (the pair's other end, in the host's namespace) is reachable;
- ``HOST_IP/30`` on the host end (``hwhXXXXXX``), where the proxy listens;
- ``TARGET_IP/32`` on the host end too: an address of the host where a target listens, which
  the namespace has no route to (so a direct connection fails: network unreachable).

Everything is removed when the block exits, whatever happened in it (``ip netns del``, which
also removes the pair). It needs root and ``ip``: without them the test is skipped, and fails
under ``HALTWIRE_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from harness import service_missing


@dataclass(frozen=True)
class Namespace:
    name: str
    host_ip: str
    ns_ip: str
    target_ip: str

    def argv(self, *command: str) -> list[str]:
        """``command`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *command]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@contextmanager
def isolated_namespace() -> Iterator[Namespace]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        service_missing("root and iproute2 (ip netns, veth pairs)")
    tag = secrets.token_hex(3)
    a, b = secrets.randbelow(250) + 2, secrets.randbelow(60) * 4
    ns = Namespace(f"hwe-{tag}", f"10.231.{a}.{b + 1}", f"10.231.{a}.{b + 2}", f"10.232.{a}.{b + 1}")
    host, inner = f"hwh{tag}", f"hwn{tag}"
    try:
        try:
            _ip("netns", "add", ns.name)
        except (subprocess.CalledProcessError, OSError) as exc:
            service_missing(f"a network namespace (ip netns add: {exc})")
        _ip("link", "add", host, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", ns.name)
        _ip("addr", "add", f"{ns.host_ip}/30", "dev", host)
        _ip("addr", "add", f"{ns.target_ip}/32", "dev", host)
        _ip("link", "set", host, "up")
        _ip("netns", "exec", ns.name, "ip", "addr", "add", f"{ns.ns_ip}/30", "dev", inner)
        _ip("netns", "exec", ns.name, "ip", "link", "set", inner, "up")
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns.name], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", host], capture_output=True, timeout=10)


#: Run inside the namespace: each (host, port) of argv[1] connected to, and a name resolved.
_PROBE = """
import json, socket, sys
out = {}
for name, (host, port) in json.loads(sys.argv[1]).items():
    try:
        socket.create_connection((host, port), timeout=2).close()
        out[name] = "connected"
    except OSError as exc:
        out[name] = f"{type(exc).__name__}: {exc}"
try:
    socket.getaddrinfo(sys.argv[2], 80, type=socket.SOCK_STREAM)
    out["dns"] = "resolved"
except OSError as exc:
    out["dns"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


#: Run inside the namespace: a CONNECT tunnel through the proxy (argv: proxy host, port, target,
#: Proxy-Authorization), a GET inside it; prints "served", then "closed" when the tunnel ends.
TUNNEL = """
import socket, sys
host, port, target, auth = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
s = socket.create_connection((host, port), timeout=10)
s.sendall(f"CONNECT {target} HTTP/1.1\\r\\nHost: {target}\\r\\nProxy-Authorization: {auth}\\r\\n\\r\\n".encode())
head = b""
while b"\\r\\n\\r\\n" not in head:
    head += s.recv(4096)
assert head.startswith(b"HTTP/1.1 200"), head
s.sendall(f"GET /tunnelled HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n".encode())
got = b""
while b"hello from /tunnelled" not in got:
    got += s.recv(4096)
print("served", flush=True)
s.settimeout(30)
while s.recv(4096):
    pass
print("closed", flush=True)
"""


def probe(ns: Namespace, targets: dict[str, tuple[str, int]], name: str) -> dict[str, str]:
    """From inside ``ns``: for each of ``targets`` "connected" or why not, and ``dns``: whether
    ``name`` resolves."""
    argv = ns.argv(sys.executable, "-c", _PROBE, json.dumps(targets), name)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    out: dict[str, str] = json.loads(done.stdout)
    return out


def run_inside(ns: Namespace, argv: Sequence[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """``argv`` inside ``ns`` with ``env`` added to a copy of this process's environment (any
    proxy variables of its own removed)."""
    base = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    return subprocess.run(ns.argv(*argv), capture_output=True, timeout=30, env=base | env)
