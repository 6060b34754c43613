"""What one listening socket accepts (``haltwire.listener``) and the control plane's listeners.

Real sockets on loopback: half-open connections that never finish their request head (a
slowloris), a connection cap, the in-flight cap, and the admin listener that only operators,
tripwires and viewers may use (and the enforcement listener, gateways and executors), while the
agents' listener is flooded.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from control_harness import TOKEN, auth, config_dict
from gateway_processes import Processes, spawn_gateways, spawn_upstream, wait_ready
from haltwire.config import ConfigError
from haltwire.control import AdminOnly, EnforcementOnly, create_app, parse_control_config
from haltwire.listener import ON_DISCONNECT, InFlightCap, ListenerLimits, Parser
from haltwire.serve import serving

pytestmark = pytest.mark.anyio


async def half_open(port: int, n: int) -> list[anyio.abc.SocketStream]:
    """``n`` connections that send the start of a request head and then nothing."""
    streams = []
    for _ in range(n):
        stream = await anyio.connect_tcp("127.0.0.1", port)
        await stream.send(b"POST /v1/stops HTTP/1.1\r\nHost: x\r\n")
        streams.append(stream)
    return streams


async def closed_by_peer(stream: anyio.abc.SocketStream, within: float) -> bool:
    """Whether the server closes ``stream`` within ``within`` seconds (EOF or reset)."""
    with anyio.move_on_after(within):
        try:
            await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError, OSError):
            return True
        return True  # it answered something: not silent either way
    return False


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


PARSERS = pytest.mark.parametrize("parser", ["httptools", "h11"])


@PARSERS
async def test_a_connection_that_never_finishes_its_head_is_closed_and_one_past_the_cap_at_once(
    parser: Parser,
) -> None:
    async def ok(request: Request) -> Response:
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/", ok)])
    limits = ListenerLimits(max_connections=5, header_timeout_s=0.5, idle_timeout_s=30)
    async with serving(app, limits=limits, lifespan="off", parser=parser) as url:
        slow = await half_open(port_of(url), 5)
        past_cap = await half_open(port_of(url), 1)
        assert await closed_by_peer(past_cap[0], within=0.3), (
            "a connection past the cap is closed as accepted"
        )
        started = time.monotonic()
        assert all([await closed_by_peer(s, within=3) for s in slow]), "half-open connections are timed out"
        took = time.monotonic() - started
        assert took < 2.5, took
        async with httpx2.AsyncClient(timeout=5) as http:  # the slots are free again
            assert (await http.get(url)).json() == {"ok": True}
        for s in [*slow, *past_cap]:
            await s.aclose()


@PARSERS
async def test_a_request_being_answered_is_not_cut_by_the_header_timeout(parser: Parser) -> None:
    async def slow(request: Request) -> Response:
        await anyio.sleep(1.0)
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/", slow)])
    async with serving(
        app, limits=ListenerLimits(header_timeout_s=0.3), lifespan="off", parser=parser
    ) as url:
        async with httpx2.AsyncClient(timeout=5) as http:
            assert (await http.get(url)).json() == {"ok": True}
            assert (await http.get(url)).json() == {"ok": True}, "and the kept-alive connection serves again"
        # Kept alive and idle past the header timeout after an answer: closed (step 2 re-armed).
        stream = await anyio.connect_tcp("127.0.0.1", port_of(url))
        await stream.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await stream.receive()
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert await closed_by_peer(stream, within=3), "an idle kept-alive connection is timed out"
        await stream.aclose()


@PARSERS
async def test_a_connection_answered_again_and_again_outlives_its_first_deadline(parser: Parser) -> None:
    """Each answer moves the head deadline (the timer set at the opening does not close the
    connection while later answers keep it current); once idle, the last answer's deadline holds."""

    async def ok(request: Request) -> Response:
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/", ok)])
    async with serving(
        app, limits=ListenerLimits(header_timeout_s=0.4), lifespan="off", parser=parser
    ) as url:
        stream = await anyio.connect_tcp("127.0.0.1", port_of(url))
        started = time.monotonic()
        while time.monotonic() - started < 1.5:  # past three header timeouts, one request at a time
            await stream.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await stream.receive()
            assert answer.startswith(b"HTTP/1.1 200"), answer
            await anyio.sleep(0.1)
        idle_from = time.monotonic()
        assert await closed_by_peer(stream, within=3), "idle past the last answer's deadline: closed"
        assert 0.2 < time.monotonic() - idle_from < 1.5
        await stream.aclose()


async def test_a_request_is_told_when_its_client_is_gone_and_only_then() -> None:
    """``ON_DISCONNECT``: told at once when the client went before the request asked; told when
    the connection is lost mid-answer; not told once its answer was written and it forgot."""
    told: dict[str, list[str]] = {}
    asked: dict[str, anyio.Event] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        name = scope["path"].strip("/")
        on_disconnect = scope["extensions"][ON_DISCONNECT]
        told[name] = []
        if name == "late":
            await anyio.sleep(0.5)  # the client has gone meanwhile
        forget = on_disconnect(lambda: told[name].append("gone"))
        asked.setdefault(name, anyio.Event()).set()
        if name == "answered":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})
            forget()
            return
        await anyio.sleep(2)
        forget()

    async with serving(app, limits=ListenerLimits(), lifespan="off", parser="httptools") as url:
        for name in ("late", "mid", "answered"):
            asked[name] = anyio.Event()
            stream = await anyio.connect_tcp("127.0.0.1", port_of(url))
            await stream.send(f"GET /{name} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            if name == "answered":
                assert (await stream.receive()).startswith(b"HTTP/1.1 200")
            elif name == "mid":
                await asked[name].wait()
            await stream.aclose()
            with anyio.fail_after(3):
                await asked[name].wait()
            await anyio.sleep(0.1)
        assert told == {"late": ["gone"], "mid": ["gone"], "answered": []}


async def test_past_the_in_flight_cap_a_request_is_answered_503_at_once_and_streams_are_exempt() -> None:
    release = anyio.Event()

    async def held(request: Request) -> Response:
        await release.wait()
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/held", held), Route("/v1/watch", held)])
    capped = InFlightCap(app, 2, frozenset({"/v1/watch"}))
    async with serving(capped, lifespan="off") as url, httpx2.AsyncClient(base_url=url, timeout=5) as http:
        answers: list[int] = []

        async def call(path: str) -> None:
            answers.append((await http.get(path)).status_code)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "/held")
            tg.start_soon(call, "/held")
            tg.start_soon(call, "/v1/watch")  # not counted
            while capped.in_flight < 2:
                await anyio.sleep(0.01)
            busy = await http.get("/held")
            assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
            assert busy.json()["error"]["code"] == "busy" and busy.json()["error"]["retryable"] is True
            release.set()
        assert answers == [200, 200, 200]
        assert capped.in_flight == 0


@asynccontextmanager
async def control_with_admin(tmp_path: Path, agents: ListenerLimits) -> AsyncIterator[tuple[str, str]]:
    """The control plane's app on the agents' and the admin listener, in one process: (agents, admin)."""
    config = parse_control_config(config_dict({"backend": "sqlite", "path": str(tmp_path / "c.db")}, 0.2))
    app = create_app(config)
    async with serving(app, limits=agents) as agent_url:
        async with serving(
            AdminOnly(app), limits=ListenerLimits(max_connections=16), lifespan="off"
        ) as admin_url:
            yield agent_url, admin_url


async def test_the_admin_listener_serves_operators_tripwires_and_viewers_only(tmp_path: Path) -> None:
    async with control_with_admin(tmp_path, ListenerLimits()) as (_, admin):
        async with httpx2.AsyncClient(base_url=admin, timeout=5) as http:
            stop = {"scope": "agent:a1", "reason": "runaway"}
            assert (await http.post("/v1/stops", json=stop, headers=auth("operator"))).status_code == 201
            assert (await http.post("/v1/stops", json=stop, headers=auth("tripwire"))).status_code == 201
            assert (await http.get("/v1/stops", headers=auth("viewer"))).status_code == 200
            for role in ("agent", "gateway", "executor"):
                r = await http.get("/v1/stops", headers=auth(role))
                assert r.status_code == 403 and "admin listener" in r.json()["error"]["message"], role
            assert (await http.get("/v1/stops")).status_code == 401, "the routes' own 401"
            assert (await http.get("/healthz")).status_code == 200


async def test_the_enforcement_listener_serves_gateways_and_executors_only(tmp_path: Path) -> None:
    config = parse_control_config(config_dict({"backend": "sqlite", "path": str(tmp_path / "c.db")}, 0.2))
    app = create_app(config)
    async with serving(app) as _, serving(EnforcementOnly(app), lifespan="off") as enforcement:
        async with httpx2.AsyncClient(base_url=enforcement, timeout=5) as http:
            for role in ("gateway", "executor"):
                async with http.stream("GET", "/v1/watch", headers=auth(role)) as r:
                    assert r.status_code == 200, role
            for role in ("agent", "operator", "tripwire", "viewer"):
                r = await http.get("/v1/stops", headers=auth(role))
                assert r.status_code == 403 and "enforcement listener" in r.json()["error"]["message"], role
            assert (await http.get("/v1/stops")).status_code == 401, "the routes' own 401"
            assert (await http.get("/healthz")).status_code == 200


def test_the_enforcement_listener_has_a_port_of_its_own() -> None:
    section = parse_control_config({}).control
    assert (section.admin_port_for(8700), section.enforcement_port_for(8700)) == (8701, 8702)
    assert section.enforcement_port_for(0) == 0
    for clash in ({"port": 9000, "enforcement_port": 9000}, {"admin_port": 9001, "enforcement_port": 9001}):
        with pytest.raises(ConfigError, match="enforcement listener needs a port of its own"):
            parse_control_config({"control": clash})
    assert parse_control_config({"control": {"enforcement_host": "10.0.0.1", "enforcement_port": 8700}})


async def test_a_stop_through_the_admin_listener_is_answered_while_the_agents_listener_is_flooded(
    tmp_path: Path,
) -> None:
    agents = ListenerLimits(max_connections=200, header_timeout_s=30)
    async with control_with_admin(tmp_path, agents) as (agent_url, admin_url):
        flood = await half_open(port_of(agent_url), 260)  # the cap, and 60 past it
        try:
            async with httpx2.AsyncClient(timeout=3) as http:
                with pytest.raises(httpx2.TransportError):  # the agents' listener takes nobody new
                    await http.get(f"{agent_url}/healthz")
                started = time.monotonic()
                r = await http.post(
                    f"{admin_url}/v1/stops",
                    json={"scope": "agent:a1", "reason": "under siege"},
                    headers={"Authorization": f"Bearer {TOKEN['operator']}"},
                )
                assert r.status_code == 201, r.text
                assert time.monotonic() - started < 2.0
        finally:
            for s in flood:
                await s.aclose()


def test_listeners_that_cannot_fit_in_the_open_file_limit_are_a_config_error() -> None:
    script = (
        "import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (512, 512))\n"
        "from haltwire.config import ConfigError\n"
        "from haltwire.listener import ListenerLimits, check_descriptors\n"
        "print(check_descriptors([ListenerLimits(max_connections=300)]))\n"
        "try:\n"
        "    check_descriptors([ListenerLimits(max_connections=300), ListenerLimits(max_connections=100)])\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
        "try:\n"  # a gateway's Redis pool counts too
        "    check_descriptors([ListenerLimits(max_connections=300)], 100)\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    fits, problem, pooled = out.stdout.strip().splitlines()
    assert fits == "512"
    assert "may hold 400 connections" in problem and "only 512 files" in problem
    assert "may hold 300 connections (and 100 to Redis)" in pooled and "only 512 files" in pooled


class _Segments(asyncio.Protocol):
    """The client's side of one connection: each read of the socket, as it came."""

    def __init__(self) -> None:
        self.reads: list[bytes] = []
        self.closed = anyio.Event()

    def data_received(self, data: bytes) -> None:
        self.reads.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()


#: The end of ``/healthz``'s answer: its body.
_HEALTHY = b'{"ok":true}'


async def test_an_answers_head_and_body_leave_in_one_write_and_a_close_sends_them_first(
    procs: Processes,
) -> None:
    """uvicorn writes an answer's head and body apart; the listener sends them in one segment (one
    wakeup of the client). The server (a gateway) is a process of its own, so that two writes
    would reach the client apart."""
    up = spawn_upstream(procs, "upstream")
    (gateway,) = spawn_gateways(procs, "cork", 1, upstream=up, backend="memory")
    wait_ready(procs, gateway.name, gateway.readyz)
    seen = _Segments()
    transport, _ = await asyncio.get_running_loop().create_connection(lambda: seen, "127.0.0.1", gateway.port)
    for n in range(1, 21):
        transport.write(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        with anyio.fail_after(5):
            while len(seen.reads) < n:
                await anyio.sleep(0.001)
        await anyio.sleep(0.01)  # a body written apart would have come by now
        assert len(seen.reads) == n, seen.reads[-2:]  # head and body in one segment
        assert seen.reads[-1].startswith(b"HTTP/1.1 200") and seen.reads[-1].endswith(_HEALTHY)
    # The last answer of a connection (HTTP/1.0: no keep-alive) is sent whole before the close.
    transport.write(b"GET /healthz HTTP/1.0\r\nhost: 127.0.0.1\r\n\r\n")
    with anyio.fail_after(5):
        await seen.closed.wait()
    transport.close()
    last = b"".join(seen.reads[20:])
    assert last.startswith(b"HTTP/1.1 200") and last.endswith(_HEALTHY)
