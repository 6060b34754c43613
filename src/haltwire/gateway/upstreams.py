"""Upstream MCP servers: connecting to them, listing their tools, forwarding calls.

Each upstream is one long-lived official MCP ``Client`` (a stdio command or a
streamable-HTTP URL), opened when the gateway starts and shared by every call. The
tools of all upstreams are exposed together, each under an optional per-upstream prefix.
"""

from __future__ import annotations

import logging
import os
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import httpx2
import mcp.types as types
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED

from haltwire.config import UpstreamConfig

log = logging.getLogger("haltwire.upstreams")

RECONNECT_MAX_S = 10.0

#: The upstream's own identity stamp; the gateway answers as itself, so it is stripped.
SERVER_INFO_META = "io.modelcontextprotocol/serverInfo"
#: Reserved envelope keys the client sends per request; the upstream client adds its own.
_ENVELOPE_PREFIX = "io.modelcontextprotocol/"

Progress = ProgressFnT


class UpstreamError(Exception):
    """An upstream did not start, or could not list its tools."""


class UpstreamUnavailable(Exception):
    """A call could not reach its upstream (connection refused, process gone)."""


@dataclass(frozen=True, slots=True)
class Route:
    upstream: Upstream
    tool: str
    """The tool's name at the upstream (without the gateway's prefix)."""


def forwarded_meta(meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """The client's ``_meta`` minus the per-request envelope and progress token."""
    if not meta:
        return None
    out = {k: v for k, v in meta.items() if not k.startswith(_ENVELOPE_PREFIX) and k != "progressToken"}
    return out or None


def strip_server_info(result: dict[str, Any]) -> dict[str, Any]:
    meta = result.get("_meta")
    if isinstance(meta, dict) and SERVER_INFO_META in meta:
        rest = {k: v for k, v in meta.items() if k != SERVER_INFO_META}
        if rest:
            result["_meta"] = rest
        else:
            del result["_meta"]
    return result


class Upstream:
    def __init__(self, config: UpstreamConfig) -> None:
        self.config = config
        self.name = config.name
        self._client: Client | None = None
        self.tools: list[types.Tool] = []

    def _target(self) -> Any:
        c = self.config
        if c.url is not None:
            http = httpx2.AsyncClient(headers=c.headers, timeout=httpx2.Timeout(30.0, read=None))
            return streamable_http_client(c.url, http_client=http)
        assert c.command is not None
        return StdioServerParameters(command=c.command[0], args=c.command[1:], env={**os.environ, **c.env})

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Own the upstream's client for the gateway's lifetime (a task of ``Upstreams.connect``).

        Reports started once the tools are listed. If the connection dies later, calls to
        this upstream are refused as ``upstream_unavailable`` while this task reconnects,
        with a backoff of up to ``RECONNECT_MAX_S``; the gateway itself never crashes.
        """
        delay = 0.5
        while True:
            try:
                async with Client(self._target(), cache=None) as client:
                    self._client = client
                    self.tools = await self._list_all()
                    if task_status is not anyio.TASK_STATUS_IGNORED:
                        task_status.started()
                        task_status = anyio.TASK_STATUS_IGNORED
                    delay = 0.5
                    await anyio.sleep_forever()
            except Exception as exc:
                if task_status is not anyio.TASK_STATUS_IGNORED:
                    raise  # never started: a start-up error for the caller
                log.error(
                    "upstream %s went away (%s); reconnecting in %.1f s", self.name, _describe(exc), delay
                )
            finally:
                self._client = None
            await anyio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX_S)

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        where = self.config.url or " ".join(self.config.command or [])
        try:
            with anyio.fail_after(self.config.connect_timeout_s):
                await tg.start(self.run)
        except Exception as exc:
            raise UpstreamError(f"upstream {self.name!r} ({where}) did not start: {_describe(exc)}") from exc

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
            raise UpstreamUnavailable(f"{self.name}: {_describe(exc)}") from exc
        except MCPError as exc:
            # The SDK fails pending requests this way when the transport dies under them.
            if exc.code == CONNECTION_CLOSED and exc.message == "Connection closed":
                raise UpstreamUnavailable(f"{self.name}: connection closed") from exc
            raise
        wire = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        return strip_server_info(wire)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _describe(exc.exceptions[0])
    if isinstance(exc, TimeoutError):
        return "it did not answer in time"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class Upstreams:
    """Every upstream, and the exposed tool name -> route table."""

    def __init__(self, configs: list[UpstreamConfig]) -> None:
        self.upstreams = [Upstream(c) for c in configs]
        self._routes: dict[str, Route] = {}
        self._tools: list[types.Tool] = []
        self._schemas: dict[str, dict[str, Any]] = {}

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
            for tool in up.tools:
                exposed = up.config.prefix + tool.name
                if exposed in routes:
                    raise UpstreamError(
                        f"tool name {exposed!r} is offered by upstreams {routes[exposed].upstream.name!r} "
                        f"and {up.name!r}; give one of them a prefix"
                    )
                routes[exposed] = Route(up, tool.name)
                tools.append(tool.model_copy(update={"name": exposed}))
        self._routes = routes
        self._tools = tools
        self._schemas = {t.name: dict(t.input_schema) for t in tools}

    def route(self, exposed: str) -> Route | None:
        return self._routes.get(exposed)

    @property
    def tools(self) -> list[types.Tool]:
        return self._tools

    def input_schema(self, exposed: str) -> dict[str, Any] | None:
        return self._schemas.get(exposed)
