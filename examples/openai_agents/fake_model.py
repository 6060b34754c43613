"""A scripted stand-in for the OpenAI Responses API: just enough of ``POST /v1/responses``.

It plays a runaway agent's model. Every turn it reads the tool results it was sent and asks
for one more ``lookup_order`` call (A-1, A-2, ...), without end, the way a model stuck in a
loop keeps calling tools until something outside it stops the run. It never calls out to
any network. It answers whole (``Runner.run``) or streamed (``stream: true``, as
``Runner.run_streamed`` asks): the same function call as Responses stream events, one every
``event_s``. From turn ``hold_turn`` on, a stream sends its first events and then holds
open, as a model generating a long answer does, until the client hangs up: a stop can land
while the model is streaming.

``read`` records each tool result the model got, in order: what the model read; ``streams``
each stream it opened, with the events it sent and whether the client hung up on it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

#: Events a held stream sends before it holds: the response, its function call begun, and the
#: first piece of the call's arguments.
HELD_AFTER = 4


@dataclass
class Stream:
    """One streamed answer, as the provider saw it."""

    turn: int
    #: The events sent, each as its ``type``, in order.
    sent: list[str] = field(default_factory=list)
    #: Set when it holds (``HELD_AFTER`` events sent, the model "still generating").
    holding: anyio.Event = field(default_factory=anyio.Event)
    #: Set when the client hung up before the stream's end (the gateway closed its request).
    disconnected: anyio.Event = field(default_factory=anyio.Event)
    finished: bool = False


class _EventStream(Response):
    """Server-sent events from ``events``, one every ``event_s``; a ``None`` holds the stream
    open until the client goes. The client hanging up is recorded in ``stream``."""

    media_type = "text/event-stream"

    def __init__(
        self, events: list[dict[str, Any] | None], stream: Stream, event_s: float, held: anyio.Event
    ) -> None:
        super().__init__(media_type=self.media_type)
        self.events, self.stream, self.event_s, self.held = events, stream, event_s, held
        self.raw_headers = [h for h in self.raw_headers if h[0] != b"content-length"]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        stream = self.stream
        async with anyio.create_task_group() as tg:

            async def hang_up() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                stream.disconnected.set()
                tg.cancel_scope.cancel()

            tg.start_soon(hang_up)
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            for event in self.events:
                if event is None:
                    stream.holding.set()
                    self.held.set()
                    await anyio.sleep_forever()
                    continue
                if stream.sent and self.event_s:
                    await anyio.sleep(self.event_s)
                data = json.dumps({**event, "sequence_number": len(stream.sent)}, separators=(",", ":"))
                body = f"event: {event['type']}\ndata: {data}\n\n".encode()
                await send({"type": "http.response.body", "body": body, "more_body": True})
                stream.sent.append(str(event["type"]))
            await send({"type": "http.response.body", "body": b""})
            stream.finished = True
            tg.cancel_scope.cancel()


class FakeResponses:
    def __init__(
        self,
        *,
        think_s: float = 0.0,
        tool: str = "lookup_order",
        event_s: float = 0.0,
        hold_turn: int | None = None,
    ) -> None:
        #: How long each turn "thinks" before answering, as a real model takes a while.
        self.think_s = think_s
        self.tool = tool
        #: Between two events of a stream.
        self.event_s = event_s
        #: The first turn whose stream holds open after its first events (``None``: none does).
        self.hold_turn = hold_turn
        #: Each tool result the model was sent, in the order it first read them.
        self.read: list[str] = []
        #: How many requests the model answered (or began to).
        self.answered = 0
        #: Each stream the model opened, in order.
        self.streams: list[Stream] = []
        #: Set when a stream first holds (see ``Stream.holding``).
        self.holding = anyio.Event()
        self._seen: set[str] = set()

    @property
    def held(self) -> Stream | None:
        """The first stream that held open, if one did."""
        return next((s for s in self.streams if s.holding.is_set()), None)

    def _read(self, items: list[dict[str, Any]]) -> None:
        # The SDK resends the whole conversation each turn; count each tool result once.
        for item in items:
            if item.get("type") == "function_call_output" and item["call_id"] not in self._seen:
                self._seen.add(item["call_id"])
                output = item.get("output")
                self.read.append(output if isinstance(output, str) else json.dumps(output))

    def _answer(self, model: str, n: int) -> dict[str, Any]:
        call = {
            "type": "function_call",
            "id": f"fc_{n}",
            "call_id": f"call_{n}",
            "name": self.tool,
            "arguments": json.dumps({"order_id": f"A-{n}"}),
            "status": "completed",
        }
        return {
            "id": f"resp_{n}",
            "object": "response",
            "created_at": int(time.time()),
            "model": model,
            "status": "completed",
            "output": [call],
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": 10 * n,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 8,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 10 * n + 8,
            },
        }

    def _events(self, answer: dict[str, Any], hold: bool) -> list[dict[str, Any] | None]:
        """The answer as the Responses API streams it; ``None`` where the stream holds."""
        call = answer["output"][0]
        started = {**answer, "status": "in_progress", "output": [], "usage": None}
        arguments = call["arguments"]
        half = len(arguments) // 2
        where = {"item_id": call["id"], "output_index": 0}
        events: list[dict[str, Any] | None] = [
            {"type": "response.created", "response": started},
            {"type": "response.in_progress", "response": started},
            {"type": "response.output_item.added", "output_index": 0, "item": {**call, "arguments": "", "status": "in_progress"}},
            {"type": "response.function_call_arguments.delta", **where, "delta": arguments[:half]},
            {"type": "response.function_call_arguments.delta", **where, "delta": arguments[half:]},
            {"type": "response.function_call_arguments.done", **where, "arguments": arguments},
            {"type": "response.output_item.done", "output_index": 0, "item": call},
            {"type": "response.completed", "response": answer},
        ]
        if hold:
            events.insert(HELD_AFTER, None)
        return events

    async def _responses(self, request: Request) -> Response:
        body = await request.json()
        items = body.get("input")
        self._read(items if isinstance(items, list) else [])
        self.answered += 1
        n = self.answered
        if self.think_s:
            await anyio.sleep(self.think_s)
        answer = self._answer(str(body.get("model", "fake")), n)
        if not body.get("stream"):
            return JSONResponse(answer)
        stream = Stream(n)
        self.streams.append(stream)
        hold = self.hold_turn is not None and n >= self.hold_turn
        return _EventStream(self._events(answer, hold), stream, self.event_s, self.holding)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/responses", self._responses, methods=["POST"])])
