"""Forwarding: what the gateway keeps of the upstream's answer, several upstreams, stdio, deadlines, cancellation."""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from crowd import call_body, call_headers
from haltwire.listener import ListenerLimits, Parser
from harness import TOKENS, config_dict, connect, running_gateway, running_upstream

pytestmark = pytest.mark.anyio

STDIO_UPSTREAM = {
    "name": "local",
    "command": [sys.executable, "-m", "haltwire", "demo", "upstream", "--stdio"],
}


async def test_results_keep_is_error_structured_content_annotations_and_progress() -> None:
    async with running_upstream() as (_, up), running_gateway(config_dict(up)) as (_, url):
        async with connect(url, TOKENS["ops-bot"]) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert tools["lookup_order"].annotations is not None
            assert tools["lookup_order"].annotations.read_only_hint is True
            assert tools["lookup_order"].output_schema is not None

            result = await client.call_tool("lookup_order", {"order_id": "B-7"})
            assert result.structured_content == {"order_id": "B-7", "status": "shipped"}
            # The upstream's own serverInfo stamp is gone; the gateway answers as itself.
            assert result.meta is not None
            assert result.meta["io.modelcontextprotocol/serverInfo"]["name"] == "haltwire"

            seen: list[tuple[float, float | None, str | None]] = []

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                seen.append((progress, total, message))

            done = await client.call_tool("progress", {"steps": 3}, progress_callback=on_progress)
            assert not done.is_error
            assert seen == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]


async def test_several_upstreams_are_exposed_together_with_a_prefix() -> None:
    async with running_upstream() as (demo_a, up_a), running_upstream() as (demo_b, up_b):
        upstreams = [
            {"name": "a", "url": f"{up_a}/mcp"},
            {"name": "b", "url": f"{up_b}/mcp", "prefix": "b_"},
            {**STDIO_UPSTREAM, "prefix": "local_"},
        ]
        async with running_gateway(config_dict(up_a, upstreams=upstreams)) as (_, url):
            async with connect(url, TOKENS["ops-bot"]) as client:
                names = {t.name for t in (await client.list_tools()).tools}
                assert {"lookup_order", "b_lookup_order", "local_lookup_order", "local_sleep"} <= names
                await client.call_tool("lookup_order", {})
                await client.call_tool("b_lookup_order", {})
                await client.call_tool("b_lookup_order", {})
                local = await client.call_tool("local_lookup_order", {"order_id": "S-1"})
                assert local.structured_content == {"order_id": "S-1", "status": "shipped"}
    assert (demo_a.served["lookup_order"], demo_b.served["lookup_order"]) == (1, 2)


async def test_two_upstreams_offering_one_name_without_a_prefix_is_a_startup_error() -> None:
    from haltwire.gateway import UpstreamError

    async with running_upstream() as (_, up_a), running_upstream() as (_, up_b):
        upstreams = [{"name": "a", "url": f"{up_a}/mcp"}, {"name": "b", "url": f"{up_b}/mcp"}]
        with pytest.raises(UpstreamError, match="give one of them a prefix"):
            async with running_gateway(config_dict(up_a, upstreams=upstreams)):
                pass


async def test_a_handshake_era_client_is_served_and_refused_the_same_way() -> None:
    async with (
        running_upstream() as (demo, up),
        running_gateway(config_dict(up, limits={"budget": 2})) as (_, url),
    ):
        async with connect(url, TOKENS["ops-bot"], mode="legacy") as client:
            assert client.protocol_version == "2025-11-25"
            for _ in range(2):
                assert not (await client.call_tool("lookup_order", {})).is_error
            refused = await client.call_tool("lookup_order", {})
    assert refused.is_error and refused.structured_content is not None
    assert refused.structured_content["error"]["code"] == "budget_exhausted"
    assert demo.served["lookup_order"] == 2


async def test_a_hung_upstream_is_cut_at_the_deadline_and_the_slot_comes_back() -> None:
    async with running_upstream() as (demo, up):
        limits = {"max_in_flight": 1, "deadline_s": 30, "tools": {"sleep": {"deadline_s": 0.3}}}
        async with running_gateway(config_dict(up, limits=limits)) as (app, url):
            async with connect(url, TOKENS["ops-bot"]) as client:
                with anyio.fail_after(10):
                    result = await client.call_tool("sleep", {"seconds": 30})
                assert result.structured_content is not None
                error = result.structured_content["error"]
                assert error["code"] == "deadline_exceeded" and error["retryable"] is False
                assert "outcome unknown" in error["message"]
                assert not (await client.call_tool("lookup_order", {})).is_error  # the slot is free
                with anyio.fail_after(5):
                    while demo.cancelled["sleep"] < 1:  # the upstream saw the cancellation
                        await anyio.sleep(0.02)


#: Served as ``haltwire gateway`` serves (the listener tells the call its client is gone), and
#: by uvicorn's own protocols (a task watches ``receive``).
LISTENERS = pytest.mark.parametrize(
    ("limits", "parser"),
    [(ListenerLimits(), "httptools"), (ListenerLimits(), "h11"), (None, "auto")],
    ids=["haltwire-listener", "haltwire-listener-h11", "uvicorn"],
)


@LISTENERS
async def test_a_client_that_disconnects_cancels_the_upstream_call(
    limits: ListenerLimits | None, parser: Parser
) -> None:
    async with running_upstream() as (demo, up):
        config = config_dict(up, limits={"max_in_flight": 1})
        async with running_gateway(config, limits=limits, parser=parser) as (app, url):
            async with connect(url, TOKENS["ops-bot"]) as client:
                with anyio.move_on_after(0.5):  # the agent gives up: its HTTP request is closed
                    await client.call_tool("sleep", {"seconds": 30})
                with anyio.fail_after(5):
                    while demo.cancelled["sleep"] < 1:
                        await anyio.sleep(0.02)
                    while app.gateway.ceilings.store.in_flight("ops-bot:f"):  # type: ignore[attr-defined]
                        await anyio.sleep(0.02)
                assert not (await client.call_tool("lookup_order", {})).is_error
    assert demo.in_flight == 0


@LISTENERS
async def test_a_client_that_asked_for_progress_and_disconnects_cancels_the_upstream_call(
    limits: ListenerLimits | None, parser: Parser
) -> None:
    """With a progress token the call runs beside its stream of notifications: a client gone
    before the answer cancels it all the same."""
    async with running_upstream() as (demo, up):
        config = config_dict(up, limits={"max_in_flight": 1})
        async with running_gateway(config, limits=limits, parser=parser) as (app, url):
            body = json.loads(call_body(1, "sleep", {"seconds": 30}))
            body["params"]["_meta"]["progressToken"] = "p-1"
            async with httpx2.AsyncClient(timeout=10) as http:
                with anyio.move_on_after(0.5):  # the agent gives up: its request is closed
                    await http.post(url, content=json.dumps(body), headers=call_headers(TOKENS["ops-bot"], "sleep"))
            with anyio.fail_after(5):
                while demo.cancelled["sleep"] < 1:
                    await anyio.sleep(0.02)
                while app.gateway.ceilings.store.in_flight("ops-bot:f"):  # type: ignore[attr-defined]
                    await anyio.sleep(0.02)
    assert demo.in_flight == 0


async def test_a_client_that_pipelines_calls_and_disconnects_cancels_the_call_being_answered() -> None:
    """uvicorn marks only the request read last as disconnected; the listener tells the one being
    answered (the first of two pipelined calls) all the same."""
    async with running_upstream() as (demo, up):
        config = config_dict(up, limits={"max_in_flight": 2})
        async with running_gateway(config, limits=ListenerLimits()) as (app, url):
            host, port = url.removeprefix("http://").split("/")[0].split(":")
            head = "".join(f"{k}: {v}\r\n" for k, v in call_headers(TOKENS["ops-bot"], "sleep").items())
            requests = b""
            for request_id in (1, 2):
                body = call_body(request_id, "sleep", {"seconds": 30})
                requests += f"POST /mcp HTTP/1.1\r\nHost: {host}:{port}\r\n{head}".encode()
                requests += b"content-length: %d\r\n\r\n%s" % (len(body), body)
            stream = await anyio.connect_tcp(host, int(port))
            await stream.send(requests)  # both at once: the second waits behind the first
            with anyio.fail_after(5):
                while demo.in_flight < 1:
                    await anyio.sleep(0.02)
            await stream.aclose()
            with anyio.fail_after(5):
                while demo.cancelled["sleep"] < 1:  # the upstream saw the first call cancelled
                    await anyio.sleep(0.02)
                while app.gateway.ceilings.store.in_flight("ops-bot:f"):  # type: ignore[attr-defined]
                    await anyio.sleep(0.02)
    assert demo.in_flight == 0


async def test_an_upstream_that_goes_away_is_refused_as_unavailable_not_a_crash() -> None:
    stop, stopped = anyio.Event(), anyio.Event()

    async def run_upstream(*, task_status: Any) -> None:
        async with running_upstream() as (_, up):
            task_status.started(up)
            await stop.wait()
        stopped.set()

    async with anyio.create_task_group() as tg:
        up = await tg.start(run_upstream)
        async with running_gateway(config_dict(up, limits={"max_in_flight": 1})) as (_, url):
            stop.set()  # the upstream server shuts down, closing its connections
            await stopped.wait()
            async with connect(url, TOKENS["ops-bot"]) as client:
                for _ in range(2):  # the slot was released: the second call is not refused as too busy
                    result = await client.call_tool("lookup_order", {})
                    assert result.structured_content is not None
                    error: dict[str, Any] = result.structured_content["error"]
                    assert error["code"] == "upstream_unavailable" and error["retryable"] is True


async def test_a_client_without_progress_support_still_gets_json() -> None:
    import httpx2

    async with running_upstream() as (_, up), running_gateway(config_dict(up)) as (_, url):
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKENS['ops-bot']}"})
        async with http, Client(streamable_http_client(url, http_client=http), cache=None) as client:
            result = await client.call_tool("progress", {"steps": 2})
    assert not result.is_error
