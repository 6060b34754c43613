"""What reading a body costs: ``haltwire.jsonwire.loads`` (the strict parser every request body and
every upstream answer goes through, twice per tool call) on a ``tools/call`` request, on a 15 KB
answer, and on the same answer as text (an SSE event's data, which the upstream client decodes),
against orjson's own parse of the same bytes.

Run from the repository root::

    .venv/bin/python benchmarks/jsonwire.py

The best of seven rounds, in µs per body. No target: a figure to compare two versions by
(``PYTHONPATH=<an exported src> .venv/bin/python benchmarks/jsonwire.py``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson

from haltwire import jsonwire

REQUEST = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 12345,
        "method": "tools/call",
        "params": {
            "name": "lookup_order",
            "arguments": {"order_id": "A-1001"},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"},
        },
    }
).encode()
_ROWS = [
    {"order_id": f"A-{i}", "status": "shipped", "total": 12.5 + i, "items": ["widget", "gadget"], "note": "keep upright"}
    for i in range(60)
]
ANSWER = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {"content": [{"type": "text", "text": json.dumps(_ROWS)}], "structuredContent": {"orders": _ROWS}},
    }
).encode()


def best_us(parse: Callable[[Any], Any], body: bytes | str) -> float:
    n = 20_000 if len(body) < 1_000 else 2_000
    best = float("inf")
    for _ in range(7):
        started = time.perf_counter()
        for _ in range(n):
            parse(body)
        best = min(best, (time.perf_counter() - started) / n)
    return best * 1e6


def main() -> int:
    print(f"jsonwire.loads against orjson.loads, best of 7 rounds (Python {sys.version.split()[0]})")
    bodies: list[tuple[str, bytes | str]] = [
        ("tools/call request", REQUEST),
        ("answer", ANSWER),
        ("answer as SSE text", ANSWER.decode()),
    ]
    for name, body in bodies:
        ours, theirs = best_us(jsonwire.loads, body), best_us(orjson.loads, body)
        size = len(body.encode()) if isinstance(body, str) else len(body)
        print(f"    {name:<20} {size:>6} B   jsonwire {ours:8.1f} µs   orjson {theirs:8.1f} µs   {ours / theirs:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
