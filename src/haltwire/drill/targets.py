"""The canary targets beyond the MCP canary upstream, one process recording every side effect
with its time, as ``drill.canary`` does, so the drill counts on the target's own word:

- the **canary model provider** (``POST /v1/chat/completions``, streamed, behind the gateway's
  ``[[models]]``): one token event every ``PACE_S`` until the client goes (or ``MAX_TOKENS``);
  each event is recorded, then sent, so an event the stop cut before it left is still counted.
  The run is the body's ``user`` field;
- the **verifying downstream** (``POST /downstream/write?what=W``, level 4): accepts only a
  broker credential that ``haltwire.credentials.CredentialVerifier`` accepts for ``AUDIENCE``
  (401 with the refusal's code otherwise, 503 while the watch is stale); each accept is recorded
  for the credential's run;
- the **network target** (``GET /egress/write?run=R&what=W``, level 5, reached through
  ``haltwire egress``): each request it sees is recorded.

In this order, for each of them: the time is taken (``time.time()``), ``(time, run, what)``
appended to the record, the answer sent. ``GET /record[?run=ID]`` serves the record as the
canary upstream does. Run it with ``python -m haltwire.drill.targets --port N --control URL
--jwks URL --token T``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

import anyio
import httpx2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from haltwire.credentials import CredentialRefused, CredentialVerifier
from haltwire.identity import bearer_token

#: The model the canary provider serves, and the audience of the verifying downstream.
MODEL: Final = "canary-model"
AUDIENCE: Final = "drill-downstream"
#: One streamed token every this long; a stream ends (``[DONE]``) after this many.
PACE_S: Final = 0.02
MAX_TOKENS: Final = 2000
#: How long it waits at start for the control plane, which starts beside it.
UP_S: Final = 60.0


def _event(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


class Targets:
    """The record, and the three targets that write it."""

    def __init__(self, verifier: CredentialVerifier | None) -> None:
        self.effects: list[tuple[float, str, str]] = []
        self.verifier = verifier

    def note(self, run: str, what: str) -> None:
        self.effects.append((time.time(), run, what))

    async def provider(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The streamed chat completion: a token every ``PACE_S``, each recorded before it is sent."""
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = json.loads(b"".join(chunks) or b"{}")
        run = str(body.get("user", ""))
        base = {"id": "chatcmpl-canary", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
        headers = [(b"content-type", b"text/event-stream")]
        async with anyio.create_task_group() as tg:

            async def hang_up() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()  # the gateway cut the stream: generate nothing more

            tg.start_soon(hang_up)
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            for n in range(MAX_TOKENS):
                choice = {"index": 0, "delta": {"content": f"t{n} "}, "finish_reason": None}
                self.note(run, f"token-{n}")
                await send(
                    {
                        "type": "http.response.body",
                        "body": _event({**base, "choices": [choice]}),
                        "more_body": True,
                    }
                )
                await anyio.sleep(PACE_S)
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
            tg.cancel_scope.cancel()

    async def downstream(self, request: Request) -> Response:
        """Level 4: a write accepted only with a credential the verifier accepts."""
        token = bearer_token(request.headers.get("authorization"))
        if token is None or self.verifier is None:
            return _refused("credential_missing", "send a haltwire run credential as the bearer token", 401)
        try:
            claims = await self.verifier.verify(token)
        except CredentialRefused as exc:
            return _refused(exc.code, exc.message, 503 if exc.retryable else 401)
        self.note(claims.run, request.query_params.get("what", ""))
        return JSONResponse({"written": True, "run": claims.run})

    async def network(self, request: Request) -> Response:
        """Level 5: every request that reached this target."""
        self.note(request.query_params.get("run", ""), request.query_params.get("what", ""))
        return Response("written", media_type="text/plain")

    async def record(self, request: Request) -> Response:
        run = request.query_params.get("run")
        effects = [e for e in self.effects if run is None or e[1] == run]
        return JSONResponse({"effects": [list(e) for e in effects]})

    def app(self) -> Starlette:
        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            if self.verifier is None:
                yield
                return
            await _jwks_once_up(self.verifier)
            async with self.verifier.running():  # the JWKS fetched, the stops replayed
                yield

        return Starlette(
            routes=[
                Route("/v1/chat/completions", _Asgi(self), methods=["POST"]),
                Route("/downstream/write", self.downstream, methods=["POST"]),
                Route("/egress/write", self.network, methods=["GET"]),
                Route("/record", self.record, methods=["GET"]),
            ],
            lifespan=lifespan,
        )


async def _jwks_once_up(verifier: CredentialVerifier) -> None:
    """Until the control plane, starting beside this process, serves its JWKS (at most ``UP_S``)."""
    with anyio.fail_after(UP_S):
        while True:
            try:
                await verifier.keys.fetch()
                return
            except (httpx2.HTTPError, ValueError):
                await anyio.sleep(0.1)


class _Asgi:
    """The provider as a raw ASGI app (Starlette gives a plain function a ``Request``)."""

    def __init__(self, targets: Targets) -> None:
        self.targets = targets

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.targets.provider(scope, receive, send)


def _refused(code: str, message: str, status: int) -> Response:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m haltwire.drill.targets", description="the canary targets"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--control", help="the control plane's enforcement listener (the watch)")
    parser.add_argument("--jwks", help="the broker's JWKS URL")
    parser.add_argument("--token", help="a control-plane token sent every stop")
    parser.add_argument("--staleness", type=float, default=2.0)
    args = parser.parse_args(argv)
    import uvicorn

    verifier = None
    if args.control and args.token:
        verifier = CredentialVerifier.connect(
            args.control, args.token, AUDIENCE, jwks_url=args.jwks, staleness_s=args.staleness
        )
    uvicorn.run(Targets(verifier).app(), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
