"""OpenTelemetry spans for tool calls (``[tracing]``, the ``otel`` extra), after the MCP semantic
conventions: a server span named ``tools/call TOOL`` with ``mcp.method.name``,
``gen_ai.tool.name``, ``gen_ai.operation.name = execute_tool``, ``jsonrpc.request.id``,
``mcp.session.id`` when there is one, and ``error.type``: the refusal's code for a refused call,
``tool_error`` for an error result, the JSON-RPC error's code for one. Its parent is the W3C
context the call carries in ``params._meta`` (``traceparent``, ``tracestate``).

Only ``create_app`` imports this module, and only when ``[tracing] enabled``: without it, neither
this module nor the SDK's tracer is loaded (the mcp SDK loads OpenTelemetry's API on its own),
and a call pays one ``None`` check.
"""

from __future__ import annotations

import os
from typing import Any, Final

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Span, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from haltwire.config import ConfigError
from haltwire.gateway.config import TracingSection
from haltwire.refusal import Refusal

METHOD: Final = "tools/call"
_PROPAGATOR: Final = TraceContextTextMapPropagator()


class TracingUnavailable(ConfigError):
    """The exporter asked for is unknown or not installed (one sentence; a usage error, exit 2)."""


def exporter_of(name: str) -> SpanExporter | None:
    """The span exporter ``name`` names (``console``, ``otlp``, ``none``); OTLP's endpoint and
    headers come from the standard ``OTEL_EXPORTER_OTLP_*`` variables, read by the exporter."""
    if name == "none":
        return None
    if name == "console":
        return ConsoleSpanExporter()
    if name != "otlp":
        raise TracingUnavailable(f"[tracing] exporter {name!r} is not one of console, otlp, none")
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
            OTLPSpanExporter,
        )
    except ImportError:
        raise TracingUnavailable(
            "[tracing] exporter otlp needs opentelemetry-exporter-otlp-proto-http installed"
        ) from None
    exporter: SpanExporter = OTLPSpanExporter()
    return exporter


def provider_of(section: TracingSection) -> TracerProvider:
    """A provider of the gateway's own (the service named by ``OTEL_SERVICE_NAME``, else
    ``haltwire-gateway``), exporting in batches off the call's path."""
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "haltwire-gateway"}
    provider = TracerProvider(resource=Resource.create(attributes))
    exporter = exporter_of(section.exporter_name)
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


class CallTracer:
    """Starts and ends the span of each tool call (``Gateway.call_tool``)."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer("haltwire.gateway")

    def start(self, tool: str, meta: dict[str, Any] | None, request_id: str | int | None, session: str | None) -> Span:
        parent = None
        if meta is not None and isinstance(meta.get("traceparent"), str):
            carrier = {k: meta[k] for k in ("traceparent", "tracestate") if isinstance(meta.get(k), str)}
            parent = _PROPAGATOR.extract(carrier)
        attributes: dict[str, str] = {
            "mcp.method.name": METHOD,
            "gen_ai.tool.name": tool,
            "gen_ai.operation.name": "execute_tool",
        }
        if request_id is not None:
            attributes["jsonrpc.request.id"] = str(request_id)
        if session is not None:
            attributes["mcp.session.id"] = session
        return self._tracer.start_span(f"{METHOD} {tool}", parent, SpanKind.SERVER, attributes)

    def end(self, span: Span, result: object, error: str | None = None) -> None:
        """End ``span`` with the call's outcome; ``error`` is a JSON-RPC error's code, if it ended in one."""
        if isinstance(result, Refusal):
            error = result.code
        elif error is None and isinstance(result, dict) and result.get("isError"):
            error = "tool_error"
        elif result is None and error is None:
            error = "cancelled"
        if error is not None:
            span.set_attribute("error.type", error)
            span.set_status(StatusCode.ERROR)
        span.end()

    def shutdown(self) -> None:
        self.provider.shutdown()  # exports what is still batched
