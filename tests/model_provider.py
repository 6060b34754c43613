"""A scripted OpenAI-compatible model provider on loopback, for tests of model calls through the
gateway: ``POST /v1/chat/completions`` and ``POST /v1/responses``, whole or streamed.

It records every request it saw (``Seen``: path, headers, body, the exact bytes it answered, and
whether the client hung up before the answer was over). The model name picks the behaviour:

- any name: an answer at once (a stream of a few events), with ``usage``;
- a name containing ``hang``: a stream that sends two events, then waits for the client to go;
- a name containing ``slow``: each event 0.3 s after the last;
- a name containing ``fail``: a 400 in OpenAI's error shape;
- a name containing ``gzip``: a whole answer gzipped, whatever the request's ``Accept-Encoding``.

Streams use ``\\n\\n`` between events, one event ``\\r\\n`` line endings and a comment, as
providers do, so a relay that changes a byte shows.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
from starlette.types import Receive, Scope, Send

#: Headers of every answer, which the gateway must pass on.
ANSWER_HEADERS: Final = [(b"x-request-id", b"req_scripted"), (b"openai-processing-ms", b"7")]


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    #: What the provider sent back, byte for byte (a stream: one item per event).
    sent: list[bytes] = field(default_factory=list)
    disconnected: anyio.Event = field(default_factory=anyio.Event)
    finished: bool = False


def chat_answer(model: str, n: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": 1_800_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello there.", "refusal": None},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 11 * n, "completion_tokens": 3 * n, "total_tokens": 14 * n},
        "system_fingerprint": "fp_scripted",
    }


def response_answer(model: str, n: int, status: str = "completed") -> dict[str, Any]:
    return {
        "id": f"resp_{n}",
        "object": "response",
        "created_at": 1_800_000_000,
        "model": model,
        "status": status,
        "output": [
            {
                "type": "message",
                "id": f"msg_{n}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Hello there.", "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 13 * n,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5 * n,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 18 * n,
        },
    }


def _data(obj: dict[str, Any], event: str | None = None, crlf: bool = False) -> bytes:
    text = (f"event: {event}\n" if event else "") + f"data: {json.dumps(obj)}\n\n"
    return (text.replace("\n", "\r\n") if crlf else text).encode()


def chat_events(model: str, n: int, include_usage: bool) -> list[bytes]:
    base = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": 1_800_000_000, "model": model}
    extra = {"usage": None} if include_usage else {}
    deltas = [{"role": "assistant", "content": ""}, {"content": "Hello"}, {"content": " there."}, {}]
    out = [b": scripted provider\n\n"]
    for i, delta in enumerate(deltas):
        finish = "stop" if i == len(deltas) - 1 else None
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        out.append(_data({**base, "choices": [choice], **extra}, crlf=i == 1))
    if include_usage:
        usage = {"prompt_tokens": 11 * n, "completion_tokens": 3 * n, "total_tokens": 14 * n}
        out.append(_data({**base, "choices": [], "usage": usage}))
    out.append(b"data: [DONE]\n\n")
    return out


def response_events(model: str, n: int) -> list[bytes]:
    created = {**response_answer(model, n, "in_progress"), "output": [], "usage": None}
    events: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": created}),
        ("response.output_text.delta", {"item_id": f"msg_{n}", "output_index": 0, "content_index": 0, "delta": "Hello"}),
        ("response.output_text.delta", {"item_id": f"msg_{n}", "output_index": 0, "content_index": 0, "delta": " there."}),
        ("response.completed", {"response": response_answer(model, n)}),
    ]
    return [
        _data({"type": kind, **payload, "sequence_number": i}, event=kind, crlf=i == 1)
        for i, (kind, payload) in enumerate(events)
    ]


class ScriptedProvider:
    def __init__(self) -> None:
        self.seen: list[Seen] = []

    def on(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path == path]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = json.loads(b"".join(chunks))
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        seen = Seen(scope["path"], headers, body)
        self.seen.append(seen)
        n = len(self.seen)
        model = str(body.get("model"))
        if "fail" in model:
            error = {"error": {"message": "scripted failure", "type": "invalid_request_error", "param": None, "code": "bad"}}
            await self._whole(send, seen, 400, json.dumps(error).encode())
            return
        if not body.get("stream"):
            answer = chat_answer(model, n) if seen.path.endswith("/chat/completions") else response_answer(model, n)
            await self._whole(send, seen, 200, json.dumps(answer).encode(), gzipped="gzip" in model)
            return
        if seen.path.endswith("/chat/completions"):
            options = body.get("stream_options") or {}
            events = chat_events(model, n, options.get("include_usage") is True)
        else:
            events = response_events(model, n)
        headers_out = [(b"content-type", b"text/event-stream; charset=utf-8"), *ANSWER_HEADERS]
        async with anyio.create_task_group() as tg:

            async def hang_up() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                seen.disconnected.set()
                tg.cancel_scope.cancel()

            tg.start_soon(hang_up)
            await send({"type": "http.response.start", "status": 200, "headers": headers_out})
            for i, event in enumerate(events):
                if "hang" in model and i == 2:
                    await anyio.sleep_forever()
                if "slow" in model and i:
                    await anyio.sleep(0.3)
                seen.sent.append(event)
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            seen.finished = True
            tg.cancel_scope.cancel()

    async def _whole(self, send: Send, seen: Seen, status: int, body: bytes, gzipped: bool = False) -> None:
        seen.sent.append(body)  # as it was before compression
        headers = [(b"content-type", b"application/json"), *ANSWER_HEADERS]
        if gzipped:
            body = gzip.compress(body)
            headers.append((b"content-encoding", b"gzip"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        seen.finished = True
