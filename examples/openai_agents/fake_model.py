"""A scripted stand-in for the OpenAI Responses API: just enough of ``POST /v1/responses``.

It plays a runaway agent's model. Every turn it reads the tool results it was sent and asks
for one more ``lookup_order`` call (A-1, A-2, ...), without end, the way a model stuck in a
loop keeps calling tools until something outside it stops the run. It never calls out to
any network; it answers non-streaming requests only (``Runner.run`` makes those).

``read`` records each tool result the model got, in order: what the model read.
"""

from __future__ import annotations

import json
import time
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


class FakeResponses:
    def __init__(self, *, think_s: float = 0.0, tool: str = "lookup_order") -> None:
        #: How long each turn "thinks" before answering, as a real model takes a while.
        self.think_s = think_s
        self.tool = tool
        #: Each tool result the model was sent, in the order it first read them.
        self.read: list[str] = []
        #: How many requests the model answered.
        self.answered = 0
        self._seen: set[str] = set()

    def _read(self, items: list[dict[str, Any]]) -> None:
        # The SDK resends the whole conversation each turn; count each tool result once.
        for item in items:
            if item.get("type") == "function_call_output" and item["call_id"] not in self._seen:
                self._seen.add(item["call_id"])
                output = item.get("output")
                self.read.append(output if isinstance(output, str) else json.dumps(output))

    def _answer(self, model: str) -> dict[str, Any]:
        self.answered += 1
        n = self.answered
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

    async def _responses(self, request: Request) -> Response:
        body = await request.json()
        if body.get("stream"):
            return JSONResponse({"error": {"message": "this fake model does not stream"}}, status_code=400)
        items = body.get("input")
        self._read(items if isinstance(items, list) else [])
        if self.think_s:
            await anyio.sleep(self.think_s)
        return JSONResponse(self._answer(str(body.get("model", "fake"))))

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/responses", self._responses, methods=["POST"])])
