"""OpenTelemetry spans for tool calls (``[tracing]``): named and attributed after the MCP semantic
conventions, ``error.type`` the refusal's code, parented by ``params._meta.traceparent``; and
nothing of OpenTelemetry imported when tracing is off."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from haltwire.gateway.tracing import CallTracer
from harness import TOKENS, config_dict, connect, running_gateway, running_upstream
from leases_harness import client

pytestmark = pytest.mark.anyio

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def traced(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "tracing": {"enabled": True, "exporter": "none"}}


def in_memory() -> tuple[CallTracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return CallTracer(provider), exporter


def only(spans: tuple[ReadableSpan, ...]) -> ReadableSpan:
    assert len(spans) == 1, [s.name for s in spans]
    return spans[0]


@pytest.mark.parametrize("path", ["fast", "sdk"])
async def test_a_call_carrying_a_traceparent_is_a_child_of_that_trace(path: str) -> None:
    tracer, exporter = in_memory()
    async with running_upstream() as (_, up), running_gateway(traced(config_dict(up))) as (app, url):
        assert app.gateway.tracer is not None, "[tracing] enabled builds a tracer"
        app.gateway.tracer = tracer
        async with client(url, path=path) as c:
            meta = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
            result = await c.call_tool("lookup_order", {"order_id": "A-1"}, meta=meta)  # type: ignore[arg-type]
            assert not result.is_error
    span = only(exporter.get_finished_spans())
    assert span.name == "tools/call lookup_order"
    assert span.context is not None and span.parent is not None
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert format(span.parent.span_id, "016x") == PARENT_ID
    attributes = dict(span.attributes or {})
    assert attributes["mcp.method.name"] == "tools/call"
    assert attributes["gen_ai.tool.name"] == "lookup_order"
    assert attributes["gen_ai.operation.name"] == "execute_tool"
    assert "jsonrpc.request.id" in attributes
    assert "error.type" not in attributes


async def test_a_refused_call_has_the_refusal_code_as_its_error_type() -> None:
    tracer, exporter = in_memory()
    data = traced(config_dict("", limits={"budget": 1}))
    async with running_upstream() as (_, up):
        data["upstreams"][0]["url"] = f"{up}/mcp"
        async with running_gateway(data) as (app, url):
            app.gateway.tracer = tracer
            async with connect(url, TOKENS["ops-bot"]) as c:
                await c.call_tool("lookup_order", {"order_id": "A-1"})
                refused = await c.call_tool("lookup_order", {"order_id": "A-1"})
                assert refused.is_error
    first, second = exporter.get_finished_spans()
    assert first.parent is None, "no traceparent: a root span"
    assert "error.type" not in (first.attributes or {})
    assert (second.attributes or {})["error.type"] == "budget_exhausted"
    assert second.status.status_code.name == "ERROR"


def test_without_tracing_no_tracer_is_imported() -> None:
    # The mcp SDK imports OpenTelemetry's API and redis part of its SDK on their own; haltwire's
    # tracing and the SDK's tracer are left out.
    script = """
import sys
from haltwire.gateway import create_app, parse_config
create_app(parse_config({"gateway": {"development": True}, "upstreams": [{"name": "u", "url": "http://127.0.0.1:9/mcp"}]}))
loaded = sorted(m for m in sys.modules if m in ("haltwire.gateway.tracing", "opentelemetry.sdk.trace"))
print(loaded)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
