"""Upstream MCP servers: connecting to them, listing their tools, forwarding calls.

Each upstream is one long-lived official MCP ``Client`` (a stdio command or a
streamable-HTTP URL), opened when the gateway starts: it negotiates the protocol and
lists the tools. The tools of all upstreams are exposed together, each under an optional
per-upstream prefix.

Calls to an HTTP upstream that negotiated a modern (2026-07-28, per-request envelope)
protocol take the lean path of ``upstream_http.ModernHttpCaller`` (one JSON-RPC POST per
call); stdio upstreams and handshake-era HTTP upstreams stay on the SDK client.
"""

from __future__ import annotations

import logging
import os
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Final

import anyio
import anyio.abc
import httpx2
import mcp.types as types
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import find_invalid_x_mcp_header, x_mcp_header_map
from mcp_types import CONNECTION_CLOSED
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from haltwire.config import UpstreamConfig
from haltwire.errors import describe, not_listening
from haltwire.meta import LABEL_META
from haltwire.upstreams.http import (
    CLIENT_INFO,
    HTTP_MAX_CONNECTIONS,
    ModernHttpCaller,
    Progress,
    Redirected,
    UpstreamUnavailable,
    forwarded_meta,
    strip_server_info,
)
from haltwire.upstreams.labels import Label, label_of, unknown_tools

__all__ = [
    "Progress",
    "Route",
    "Upstream",
    "UpstreamError",
    "UpstreamUnavailable",
    "Upstreams",
]

log = logging.getLogger("haltwire.upstreams")

RECONNECT_MAX_S = 10.0
#: At start-up, an upstream not listening yet is tried again at least this often.
START_RETRY_MAX_S = 1.0

#: The SDK client's HTTP timeouts; a call's own deadline bounds the wait for its answer.
HTTP_TIMEOUT: Final = httpx2.Timeout(30.0, read=None)
HTTP_LIMITS: Final = httpx2.Limits(
    max_connections=HTTP_MAX_CONNECTIONS, max_keepalive_connections=HTTP_MAX_CONNECTIONS
)


class UpstreamError(Exception):
    """An upstream did not start, or could not list its tools."""


@dataclass(frozen=True, slots=True)
class Route:
    upstream: Upstream
    tool: str
    """The tool's name at the upstream (without the gateway's prefix)."""
    label: Label = "irreversible"


class Upstream:
    def __init__(self, config: UpstreamConfig, headers: dict[str, str] | None = None) -> None:
        self.config = config
        self.name = config.name
        #: What is sent with every request (``UpstreamConfig.resolve_headers``: ``headers_env`` read).
        self.headers = config.headers if headers is None else headers
        self._client: Client | None = None
        self._modern: ModernHttpCaller | None = None
        self.tools: list[types.Tool] = []
        #: Why the last attempt to start failed, while the upstream is not listening yet.
        self._not_up: Exception | None = None

    @property
    def connected(self) -> bool:
        """Whether its task holds a connection now (not before start-up, nor while it reconnects)."""
        return self._client is not None

    async def _connect(self, stack: AsyncExitStack) -> Client:
        """Open the SDK client and, for a modern HTTP upstream, the lean path's caller."""
        c = self.config
        target: Any
        if c.url is not None:
            http = await stack.enter_async_context(
                httpx2.AsyncClient(headers=self.headers, timeout=HTTP_TIMEOUT, limits=HTTP_LIMITS)
            )
            target = streamable_http_client(c.url, http_client=http)
        else:
            assert c.command is not None
            target = StdioServerParameters(
                command=c.command[0], args=c.command[1:], env={**os.environ, **c.env}
            )
        client = await stack.enter_async_context(Client(target, cache=None, client_info=CLIENT_INFO))
        self._client = client
        self.tools = await self._list_all()
        if c.url is not None and client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            modern = ModernHttpCaller(
                c.url, client.protocol_version, self.tools, headers=self.headers, name=self.name
            )
            stack.push_async_callback(modern.aclose)
            self._modern = modern
        return client

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Own the upstream's client for the gateway's lifetime (a task of ``Upstreams.connect``).

        Reports started once the tools are listed; an HTTP upstream not listening yet is tried
        again until ``start`` gives up (its ``connect_timeout_s``). If the connection dies later, calls to
        this upstream are refused as ``upstream_unavailable`` while this task reconnects,
        with a backoff of up to ``RECONNECT_MAX_S``; the gateway itself never crashes.
        (Calls on the lean HTTP path need no connection to be kept: each one that cannot
        reach the upstream is refused, and the next one tries again.)
        """
        delay = 0.1
        while True:
            try:
                async with AsyncExitStack() as stack:
                    await self._connect(stack)
                    if task_status is not anyio.TASK_STATUS_IGNORED:
                        task_status.started()
                        task_status = anyio.TASK_STATUS_IGNORED
                    delay = 0.5
                    await anyio.sleep_forever()
            except Exception as exc:
                starting = task_status is not anyio.TASK_STATUS_IGNORED
                if starting and (self.config.url is None or not not_listening(exc)):
                    raise  # never started: a start-up error for the caller
                if starting:
                    # Not listening yet: waited for, until ``start``'s connect_timeout_s runs out.
                    self._not_up = exc
                else:
                    log.error(
                        "upstream %s went away (%s); reconnecting in %.1f s", self.name, describe(exc), delay
                    )
            finally:
                self._client = None
                self._modern = None
            await anyio.sleep(delay)
            starting = task_status is not anyio.TASK_STATUS_IGNORED
            delay = min(delay * 2, START_RETRY_MAX_S if starting else RECONNECT_MAX_S)

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        where = self.config.url or " ".join(self.config.command or [])
        timeout = self.config.connect_timeout_s
        try:
            with anyio.fail_after(timeout):
                await tg.start(self.run)
        except TimeoutError as exc:
            why = f"not listening ({describe(self._not_up)})" if self._not_up else describe(exc)
            raise UpstreamError(
                f"upstream {self.name!r} ({where}) did not start within {timeout:g} s: {why}"
            ) from exc
        except Exception as exc:
            raise UpstreamError(f"upstream {self.name!r} ({where}) did not start: {describe(exc)}") from exc

    async def _list_all(self) -> list[types.Tool]:
        assert self._client is not None
        tools: list[types.Tool] = []
        cursor: str | None = None
        while True:
            page = await self._client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def call_tool(
        self,
        tool: str,
        arguments: dict[str, Any] | None,
        meta: dict[str, Any] | None,
        progress: Progress | None,
    ) -> dict[str, Any]:
        """Forward one call; the result in wire form, without the upstream's serverInfo stamp."""
        modern = self._modern
        if modern is not None:
            try:
                return await modern.call_tool(tool, arguments, meta, progress)
            except Redirected as redirect:
                # Nothing ran: the upstream only pointed elsewhere. The SDK client follows
                # the redirects it deems safe (and reports the others); this upstream's
                # calls take that path from now on.
                log.warning(
                    "upstream %s redirects calls (to %s); configure that URL to skip a round trip",
                    self.name,
                    redirect,
                )
                if self._modern is modern:
                    self._modern = None
        client = self._client
        if client is None:
            raise UpstreamUnavailable(f"{self.name}: not connected")
        try:
            result = await client.session.call_tool(
                tool,
                arguments,
                progress_callback=progress,
                meta=forwarded_meta(meta),  # type: ignore[arg-type]
            )
        except (httpx2.TransportError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise UpstreamUnavailable(f"{self.name}: {describe(exc)}") from exc
        except MCPError as exc:
            # The SDK fails pending requests this way when the transport dies under them.
            if exc.code == CONNECTION_CLOSED and exc.message == "Connection closed":
                raise UpstreamUnavailable(f"{self.name}: connection closed") from exc
            raise
        wire = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        return strip_server_info(wire)


class Upstreams:
    """Every upstream, and the exposed tool name -> route table."""

    def __init__(self, configs: list[UpstreamConfig]) -> None:
        """``ConfigError`` when a ``headers_env`` variable is not set (a start-up error)."""
        self.upstreams = [Upstream(c, c.resolve_headers(f"upstreams[{n}]")) for n, c in enumerate(configs)]
        self._routes: dict[str, Route] = {}
        self._tools: list[types.Tool] = []
        self._schemas: dict[str, dict[str, Any]] = {}
        #: The schemas of the tools that declare ``Mcp-Param-*`` headers (``x-mcp-header``).
        self._param_schemas: dict[str, dict[str, Any]] = {}

    async def connect(self, stack: AsyncExitStack) -> None:
        """Start every upstream in a task group that ``stack`` owns and cancels on exit."""
        tg = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(tg.cancel_scope.cancel)
        for up in self.upstreams:
            await up.start(tg)
        self._build()

    def _build(self) -> None:
        routes: dict[str, Route] = {}
        tools: list[types.Tool] = []
        for up in self.upstreams:
            configured = up.config.labels
            unknown = unknown_tools(configured, {t.name for t in up.tools})
            if unknown:
                raise UpstreamError(
                    f"upstream {up.name!r}: labels name tools it does not list: {', '.join(unknown)}"
                )
            unknown = sorted(set(up.config.approval) - {t.name for t in up.tools})
            if unknown:
                raise UpstreamError(
                    f"upstream {up.name!r}: approval names tools it does not list: {', '.join(unknown)}"
                )
            for tool in up.tools:
                exposed = up.config.prefix + tool.name
                if exposed in routes:
                    raise UpstreamError(
                        f"tool name {exposed!r} is offered by upstreams {routes[exposed].upstream.name!r} "
                        f"and {up.name!r}; give one of them a prefix"
                    )
                label = label_of(
                    tool.name,
                    tool.annotations,
                    configured=configured,
                    trust_annotations=up.config.trust_annotations,
                )
                routes[exposed] = Route(up, tool.name, label)
                # The label travels in the catalogue, so agents see what a call can undo.
                meta = {**(tool.meta or {}), LABEL_META: label}
                tools.append(tool.model_copy(update={"name": exposed, "meta": meta}))
        self._routes = routes
        self._tools = tools
        self._schemas = {t.name: dict(t.input_schema) for t in tools}
        # Walked once per catalogue, not per call: a schema without a valid annotation has no
        # header a call could disagree with (the SDK's check then accepts every call).
        self._param_schemas = {
            name: schema
            for name, schema in self._schemas.items()
            if find_invalid_x_mcp_header(schema) is None and x_mcp_header_map(schema)
        }

    def not_connected(self) -> list[str]:
        """The names of the upstreams without a connection now (``/readyz``)."""
        return [up.name for up in self.upstreams if not up.connected]

    def route(self, exposed: str) -> Route | None:
        return self._routes.get(exposed)

    @property
    def tools(self) -> list[types.Tool]:
        return self._tools

    def input_schema(self, exposed: str) -> dict[str, Any] | None:
        return self._schemas.get(exposed)

    def param_header_schema(self, exposed: str) -> dict[str, Any] | None:
        """The input schema of ``exposed`` when it declares ``Mcp-Param-*`` headers, else None."""
        return self._param_schemas.get(exposed)

    def label(self, exposed: str) -> Label | None:
        route = self._routes.get(exposed)
        return route.label if route is not None else None
