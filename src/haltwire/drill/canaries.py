"""The canary runtimes of the ladder's rungs (``drill.ladder``): each ignores stops, as the
``gateway`` rung's does, so only the enforcement point of its rung can stop it. Each registers a
run in the drill tenant and renews its lease in the background, ignoring refusals
(``held_lease``), then, every ``PACE_S`` until the drill cancels it:

- ``model`` (level 3, model calls): a streamed ``/v1/chat/completions`` through the gateway to
  the canary provider; each token event it reads is a call served. A stream cut (the error event
  naming the stop) is its first refusal; then it calls again (refused 403) and again;
- ``broker`` (level 4): a broker credential for the verifying downstream, used directly (no
  gateway); a refused write makes it ask the broker for a new credential (refused while the stop
  stands) and keep writing with whichever it holds;
- ``egress`` (level 5): one ``CONNECT`` tunnel through ``haltwire egress`` to the canary targets,
  a request after another over it; when the tunnel closes (``cut_at``) it opens a new one, and
  the first refused ``CONNECT`` is its refusal;
- ``executor``: ``canary_commit`` (irreversible) through the gateway, each call an intent the
  executor performs; a refused call is its refusal.

``run.cut_at`` is when a stream or tunnel open at the stop was closed under it.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final, cast

import anyio
import anyio.abc
import httpx2
from mcp.types import RequestParamsMeta

from haltwire.drill.agents import CONTROL_TIMEOUT_S, PACE_S, CanaryRun, mcp_client
from haltwire.drill.canary import TOOL_COMMIT
from haltwire.drill.stack import AGENT_CLASS, TOKENS, Stack
from haltwire.drill.targets import AUDIENCE, MODEL
from haltwire.meta import LEASE_META, RUN_META
from haltwire.runtime import ControlClient, ControlRefused, ControlUnreachable

#: A request or stream read of a canary gives up after this long.
READ_S: Final = 10.0
#: The ladder canaries' control client gives up after this long (its renewals after
#: ``CONTROL_TIMEOUT_S``): a loaded machine's control plane can take over a second to register a
#: run, and a registration given up on might still have made one.
PATIENT_S: Final = 10.0


@dataclass
class Held:
    """The last lease token a canary holds (renewals replace it, refusals do not)."""

    token: str


@asynccontextmanager
async def held_lease(run: CanaryRun, control: ControlClient, tools: list[str]) -> AsyncIterator[Held]:
    """A registered run whose lease is renewed in the background, every refusal ignored (each
    renewal given up after ``CONTROL_TIMEOUT_S``; ``control``'s own timeout is the drill's)."""
    registration = await control.register_run(agent_class=AGENT_CLASS, tools=tools)
    run.run_id = registration.grant.run_id
    held = Held(registration.grant.token)

    async def renew_ignoring_refusals() -> None:
        while True:
            await anyio.sleep(registration.grant.renew_every_s)
            try:
                with anyio.fail_after(CONTROL_TIMEOUT_S):
                    held.token = (await control.renew(run.run_id)).token
            except (ControlRefused, ControlUnreachable, TimeoutError):
                pass  # it does not care

    async with anyio.create_task_group() as tg:
        tg.start_soon(renew_ignoring_refusals)
        try:
            yield held
        finally:
            tg.cancel_scope.cancel()


def _served(run: CanaryRun) -> None:
    run.served += 1
    run.first_served.set()


def _cut(run: CanaryRun) -> None:
    if run.armed and run.cut_at is None:
        run.cut_at = time.time()


def _code(body: bytes, status: int) -> str:
    """The refusal's code from a JSON error body (``{"error": {"code": ...}}``)."""
    try:
        error = json.loads(body).get("error", {})
    except (ValueError, AttributeError):
        return f"http_{status}"
    return str(error.get("code") or f"http_{status}") if isinstance(error, dict) else f"http_{status}"


async def model(run: CanaryRun, control: ControlClient, stack: Stack) -> None:
    """Level 3, model calls: streamed chat completions until cancelled, every refusal ignored."""
    async with held_lease(run, control, []) as lease, httpx2.AsyncClient(timeout=READ_S) as http:
        n = 0
        while True:
            headers = {"Authorization": f"Bearer {TOKENS['agent']}", "Haltwire-Lease": lease.token}
            body = {
                "model": MODEL,
                "stream": True,
                "user": run.run_id,
                "messages": [{"role": "user", "content": f"write-{n}"}],
            }
            try:
                async with http.stream(
                    "POST", f"{stack.model_url}/chat/completions", json=body, headers=headers
                ) as r:
                    if r.status_code != 200:
                        run.refuse(_code(await r.aread(), r.status_code))
                    else:
                        await _read_stream(run, r)
            except httpx2.HTTPError:
                _cut(run)  # the stream broke off without its error event
            n += 1
            await anyio.sleep(PACE_S)


async def _read_stream(run: CanaryRun, r: httpx2.Response) -> None:
    async for line in r.aiter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[len("data: ") :])
        if "error" in event:  # the gateway's last event: the stop that cut the stream
            _cut(run)
            error = event["error"]
            run.refuse(str(error.get("code", "error")) if isinstance(error, dict) else "error")
            return
        _served(run)


async def broker(run: CanaryRun, control: ControlClient, stack: Stack) -> None:
    """Level 4: a broker credential used directly against the verifying downstream."""
    async with (
        held_lease(run, control, []),
        httpx2.AsyncClient(base_url=stack.targets_url, timeout=READ_S) as http,
    ):
        credential = str((await control.credential(run.run_id, AUDIENCE))["token"])
        n = 0
        while True:
            auth = {"Authorization": f"Bearer {credential}"}
            r = await http.post("/downstream/write", params={"what": f"write-{n}"}, headers=auth)
            if r.status_code == 200:
                _served(run)
            else:
                run.refuse(_code(r.content, r.status_code))
                try:  # it asks again, and keeps the old one when refused
                    with anyio.fail_after(CONTROL_TIMEOUT_S):
                        credential = str((await control.credential(run.run_id, AUDIENCE))["token"])
                except (ControlRefused, ControlUnreachable, TimeoutError):
                    pass
            n += 1
            await anyio.sleep(PACE_S)


class _Refused(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


async def _read_answer(stream: anyio.abc.ByteStream, buffer: bytearray) -> tuple[int, bytes]:
    """One HTTP/1.1 answer (its status and body, by ``Content-Length``); EOFError when closed."""
    while b"\r\n\r\n" not in buffer:
        try:
            buffer += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise EOFError from None
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    body = bytearray(rest)
    while len(body) < length:
        try:
            body += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise EOFError from None
    buffer[:] = body[length:]
    return status, bytes(body[:length])


async def _tunnel(stack: Stack, token: str) -> tuple[anyio.abc.ByteStream, bytearray]:
    """A ``CONNECT`` tunnel to the canary targets through the proxy; ``_Refused`` when refused."""
    proxy = stack.egress_url.removeprefix("http://")
    host, port = proxy.rsplit(":", 1)
    target = stack.targets_url.removeprefix("http://")
    stream = await anyio.connect_tcp(host, int(port))
    head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Bearer {token}\r\n\r\n"
    buffer = bytearray()
    try:
        await stream.send(head.encode())
        status, body = await _read_answer(stream, buffer)
    except (EOFError, OSError, anyio.BrokenResourceError):
        await stream.aclose()
        raise _Refused("connection_closed") from None
    if status // 100 != 2:
        await stream.aclose()
        raise _Refused(_code(body, status))
    return stream, buffer


async def egress(run: CanaryRun, control: ControlClient, stack: Stack) -> None:
    """Level 5: requests over a held tunnel through the egress proxy; a new tunnel when it closes."""
    target = stack.targets_url.removeprefix("http://")
    async with held_lease(run, control, []) as lease:
        n = 0
        while True:
            try:
                stream, buffer = await _tunnel(stack, lease.token)
            except (_Refused, OSError) as exc:
                run.refuse(exc.code if isinstance(exc, _Refused) else "connection_refused")
                await anyio.sleep(PACE_S)
                continue
            async with stream:
                while True:
                    path = f"/egress/write?run={run.run_id}&what=write-{n}"
                    request = f"GET {path} HTTP/1.1\r\nHost: {target}\r\n\r\n"
                    try:
                        await stream.send(request.encode())
                        status, _ = await _read_answer(stream, buffer)
                    except (EOFError, OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                        _cut(run)  # the proxy closed the tunnel
                        break
                    if status == 200:
                        _served(run)
                    n += 1
                    await anyio.sleep(PACE_S)


async def executor(run: CanaryRun, control: ControlClient, stack: Stack) -> None:
    """The executor rung: irreversible calls through the gateway (intents), refusals ignored."""
    async with held_lease(run, control, [TOOL_COMMIT]) as lease, mcp_client(stack.mcp_url) as client:
        n = 0
        while True:
            meta = cast(RequestParamsMeta, {LEASE_META: lease.token, RUN_META: run.run_id})
            run.note(
                await client.call_tool(TOOL_COMMIT, {"run": run.run_id, "what": f"commit-{n}"}, meta=meta)
            )
            n += 1
            await anyio.sleep(PACE_S)


def patient_client(url: str) -> ControlClient:
    """The ladder canaries' client of the control plane's agents' listener."""
    return ControlClient(url, TOKENS["runtime"], timeout_s=PATIENT_S)


Runtime = Callable[[CanaryRun, ControlClient, Stack], Coroutine[Any, Any, None]]
LADDER: Final[dict[str, Runtime]] = {"model": model, "broker": broker, "egress": egress, "executor": executor}
