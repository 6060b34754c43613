"""The client's side of one model call (``haltwire.gateway.model_calls``): the answer relayed as
it came, a whole body or stream events, what the answer said (its status, its usage, the
Responses API's last sequence number), and a refusal answered in OpenAI's shape: the response
if nothing was sent yet, else the stream's last event."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Final

from starlette.types import Send

from haltwire.gateway.models import error_event, event_data, refusal_response
from haltwire.gateway.usage import Tokens, event_tokens
from haltwire.refusal import Refusal

_SEQUENCE: Final = re.compile(rb'"sequence_number"\s*:\s*(\d+)')


async def respond(send: Send, r: Refusal) -> None:
    status, headers, body = refusal_response(r)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Relay:
    """The client's side of one call: what was sent to it, and what the answer said."""

    def __init__(self, send: Send, path: str, strip_usage: bool) -> None:
        self.send = send
        self.path = path
        #: Keep chat completions' usage-only last chunk from the client (the gateway asked for it).
        self.strip_usage = strip_usage
        self.started = False
        self.ended = False
        self.status = 0
        self.tokens: Tokens | None = None
        self.sequence: int | None = None
        #: Stream events relayed that carry a delta (about one output token each).
        self.deltas = 0
        #: Told the usage once it is read, before what carried it is relayed (then unset).
        self.on_tokens: Callable[[Tokens], Awaitable[None]] | None = None
        #: Told a whole answer's status before it is relayed.
        self.on_whole: Callable[[int], Awaitable[None]] | None = None

    async def _counted(self) -> None:
        hook, self.on_tokens = self.on_tokens, None
        if hook is not None and self.tokens is not None:
            await hook(self.tokens)

    def estimate(self, request_bytes: int) -> Tokens | None:
        """A stream that ended without its usage (cut by a stop, the deadline or the client, or
        broken off): counted from what was relayed, one output token per delta event and one
        input token per 4 bytes of the request (an estimate: the provider bills its own count)."""
        if not self.started or self.status != 200 or not self.deltas:
            return None
        return Tokens(-(-request_bytes // 4), self.deltas)

    async def whole(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        if self.on_tokens is not None:
            await self._counted()
        if self.on_whole is not None:
            await self.on_whole(status)
        self.started, self.status = True, status
        headers = [*headers, (b"content-length", str(len(body)).encode())]
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})
        self.ended = True

    async def start_stream(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started, self.status = True, status
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def events(self, events: list[bytes]) -> None:
        """Relay whole events: those of one read from the provider in one send, as each send
        is a write to the client's socket."""
        kept = []
        for event in events:
            if b'delta"' in event:
                self.deltas += 1
            if self.path == "/v1/responses" and (m := _SEQUENCE.search(event)) is not None:
                self.sequence = int(m.group(1))
            if b'"usage"' in event:
                tokens, usage_only = event_tokens(self.path, *event_data(event))
                if tokens is not None:
                    self.tokens = tokens
                if usage_only and self.strip_usage:
                    continue
            kept.append(event)
        if self.on_tokens is not None and self.tokens is not None:
            await self._counted()
        if kept:
            await self.send({"type": "http.response.body", "body": b"".join(kept), "more_body": True})

    async def end(self, last: bytes = b"") -> None:
        self.ended = True
        await self.send({"type": "http.response.body", "body": last, "more_body": False})

    async def refuse(self, r: Refusal) -> None:
        """Answer ``r``: as the response if nothing was sent, else as the stream's last event."""
        if not self.started:
            self.started = self.ended = True
            await respond(self.send, r)
        elif not self.ended:
            await self.end(error_event(r, self.path, self.sequence))
