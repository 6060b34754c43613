"""Helpers for tests of the egress proxy: the proxy in-process on loopback following a real
control plane, target servers that record what they see (an HTTP app, a TCP echo), a raw
CONNECT client, curl through the proxy, and the refusal body of an answer."""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import tomli_w
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from haltwire.control import create_app, parse_control_config
from haltwire.egress import EgressProxy, parse_config
from haltwire.serve import bind, serving
from leases_harness import LEASES
from ports import free_port
from runs_harness import SECRET
from runs_harness import config_dict as runs_config
from stops_harness import HEARTBEAT_S, STALENESS_S

#: The audience of broker credentials meant for the egress proxy.
EGRESS_AUDIENCE = "haltwire-egress"


def egress_config(control: str, profiles: dict[str, list[str]], agents: dict[str, str]) -> dict[str, Any]:
    return {
        "egress": {"development": True, "profiles": profiles, "agents": agents, "header_timeout_s": 1.0},
        "control": {"url": control, "token": "tok-gateway", "staleness_s": STALENESS_S},
        "leases": LEASES,
    }


@asynccontextmanager
async def leasing_plane(db: Path) -> AsyncIterator[str]:
    """A control plane that grants leases (agent ``a1``, agent classes ``default`` and ``fast``)
    and broker credentials for ``EGRESS_AUDIENCE``, with a fast heartbeat; yields its URL.
    ``plane_egress_config`` is a proxy's config that verifies its leases."""
    data = runs_config({"backend": "sqlite", "path": str(db)})
    data["control"]["heartbeat_s"] = HEARTBEAT_S
    data["broker"] = {"ttl_s": 600, "audiences": [EGRESS_AUDIENCE, "orders"], "generate": True}
    async with serving(create_app(parse_control_config(data)), graceful_s=1) as url:
        yield url


def plane_egress_config(control: str, allow: list[str], *, broker: bool = False) -> dict[str, Any]:
    """A proxy following ``leasing_plane`` at ``control``, agent ``a1`` allowed ``allow``."""
    config = egress_config(control, {"web": allow}, {"a1": "web"})
    config["leases"] = {"keys": [{"kid": "k1", "secret": SECRET}]}
    if broker:
        config["broker"] = {"jwks_url": control + "/.well-known/jwks.json", "audience": EGRESS_AUDIENCE}
    return config


@asynccontextmanager
async def running_egress(
    config: dict[str, Any], *, clock: Callable[[], float] | None = None
) -> AsyncIterator[tuple[EgressProxy, int]]:
    """The proxy on a free loopback port until the block exits; yields it and its port."""
    proxy = EgressProxy(parse_config(config), **({"clock": clock} if clock is not None else {}))
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.run, bind("127.0.0.1", 0))
        try:
            yield proxy, port
        finally:
            tg.cancel_scope.cancel()


async def _hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse(f"hello from target {request.url.path}")


async def _headers(request: Request) -> JSONResponse:
    """The request's headers as the target saw them."""
    return JSONResponse(dict(request.headers))


async def _length(request: Request) -> PlainTextResponse:
    """How many body bytes the target received."""
    return PlainTextResponse(str(len(await request.body())))


@asynccontextmanager
async def http_target() -> AsyncIterator[int]:
    """An HTTP server on loopback answering ``hello from target PATH``; yields its port."""
    app = Starlette(
        routes=[
            Route("/headers", _headers),
            Route("/length", _length, methods=["POST"]),
            Route("/{path:path}", _hello),
        ]
    )
    async with serving(app, lifespan="off") as url:
        yield int(url.rsplit(":", 1)[1])


@dataclass
class Echo:
    """A TCP echo server on loopback that records each connection's opening and closing."""

    port: int = 0
    #: "echo": send back what comes; "silent": read and never answer; "hang-up": close at once.
    mode: str = "echo"
    opened: int = 0
    closed: int = 0
    received: int = 0
    changed: anyio.Event = field(default_factory=anyio.Event)

    def _note(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    async def serve(self, stream: anyio.abc.SocketStream) -> None:
        self.opened += 1
        self._note()
        try:
            async with stream:
                while self.mode != "hang-up":
                    data = await stream.receive()
                    self.received += len(data)
                    if self.mode == "echo":
                        await stream.send(data)
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            pass
        finally:
            self.closed += 1
            self._note()

    async def until_closed(self, n: int, within: float) -> None:
        with anyio.fail_after(within):
            while self.closed < n:
                await self.changed.wait()


@asynccontextmanager
async def echo_target(mode: str = "echo") -> AsyncIterator[Echo]:
    echo = Echo(mode=mode)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    echo.port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, echo.serve)
        try:
            yield echo
        finally:
            tg.cancel_scope.cancel()


def basic(run: str, token: str) -> str:
    return "Basic " + base64.b64encode(f"{run}:{token}".encode()).decode()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def error(self) -> dict[str, Any]:
        error: dict[str, Any] = json.loads(self.body)["error"]
        return error


async def read_head(stream: anyio.abc.SocketStream) -> tuple[int, dict[str, str], bytes]:
    """The status and headers of a response, and the bytes read past its head."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += await stream.receive()
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, rest


async def connect_via(
    proxy_port: int, target: str, authorization: str | None
) -> tuple[anyio.abc.SocketStream, Answer]:
    """A raw ``CONNECT target``: the open stream (a tunnel when the status is 200) and the answer."""
    stream = await anyio.connect_tcp("127.0.0.1", proxy_port)
    lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
    if authorization is not None:
        lines.append(f"Proxy-Authorization: {authorization}")
    await stream.send(("\r\n".join(lines) + "\r\n\r\n").encode())
    status, headers, rest = await read_head(stream)
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        rest += await stream.receive()
    return stream, Answer(status, headers, rest)


async def curl(*args: str) -> Answer:
    """curl with ``args`` (give it ``-x``, ``--proxy-user`` and the URL): the final answer."""
    argv = ["curl", "-s", "-i", "--max-time", "10", "--noproxy", "", *args]
    done = await anyio.to_thread.run_sync(lambda: subprocess.run(argv, capture_output=True, timeout=20))
    # With -p (a tunnel), curl prints the CONNECT's answer first, and any 1xx: keep the final one.
    return parse_answer(done.stdout, (done.returncode, done.stderr))


@asynccontextmanager
async def egress_command(directory: Path, config: dict[str, Any]) -> AsyncIterator[int]:
    """``python -m haltwire egress --config FILE --port N`` as a process; yields N once it listens."""
    path = directory / "egress.toml"
    path.write_text(tomli_w.dumps(config))
    port = free_port()
    log = directory / "egress.log"
    with log.open("ab") as out:
        proc = await anyio.open_process(
            [sys.executable, "-m", "haltwire", "egress", "--config", str(path), "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    try:
        with anyio.fail_after(30):
            while "haltwire egress" not in log.read_text():
                assert proc.returncode is None, log.read_text()
                await anyio.sleep(0.05)
        yield port
    finally:
        if proc.returncode is None:
            proc.terminate()
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await proc.wait()
        if proc.returncode is None:
            proc.kill()
            with anyio.CancelScope(shield=True):
                await proc.wait()


async def curl_with_env(env: dict[str, str], *args: str) -> Answer:
    """curl as a run's subprocess: no ``-x``; the proxy is what ``env`` (added to this process's
    environment) says."""
    argv = ["curl", "-s", "-i", "--max-time", "10", *args]
    full = {k: v for k, v in os.environ.items() if k.lower() not in PROXY_NAMES} | env
    done = await anyio.to_thread.run_sync(
        lambda: subprocess.run(argv, capture_output=True, timeout=20, env=full)
    )
    return parse_answer(done.stdout, (done.returncode, done.stderr))


PROXY_NAMES = ("https_proxy", "http_proxy", "no_proxy", "all_proxy")


def parse_answer(raw: bytes, done: object = None) -> Answer:
    """The final answer of ``curl -i`` output (the CONNECT's answer and any 1xx skipped)."""
    while raw.startswith((b"HTTP/1.1 200 Connection established", b"HTTP/1.1 1")):
        raw = raw.partition(b"\r\n\r\n")[2]
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines and lines[0].startswith("HTTP/"), (done, raw[:300])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return Answer(int(lines[0].split()[1]), headers, body)


def run_command(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """``python -m haltwire ARGS`` to its end (for its exit status and message)."""
    argv = [sys.executable, "-m", "haltwire", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def tls_client_hello(server_name: str | None) -> bytes:
    """The first flight of a real TLS client (Python's ssl, OpenSSL): its ClientHello record(s),
    naming ``server_name`` in SNI (None: no SNI)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()
