"""Tool labels: where each tool's label comes from, how clients see it, and each label's deadline.

Everything runs against real servers on loopback: a shop upstream (the SDK's low-level
``Server``) whose tools carry each combination of MCP annotations and hang for as long as
they are asked to, the gateway in front of it, and the official MCP client, modern and
handshake-era (the SDK path).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp.server.lowlevel import Server
from mcp.server.transport_security import TransportSecuritySettings

from cli_process import run_haltwire_async
from haltwire import refusal
from haltwire.config import ConfigError
from haltwire.gateway import UpstreamError
from haltwire.gateway.config import parse_config
from haltwire.meta import LABEL_META
from haltwire.serve import serving
from haltwire.upstreams.labels import from_annotations, label_of
from harness import TOKENS, config_dict, connect, running_gateway, running_upstream

pytestmark = pytest.mark.anyio

_SECONDS: dict[str, Any] = {"type": "object", "properties": {"seconds": {"type": "number"}}}
A = types.ToolAnnotations

#: The shop's tools: name -> (annotations, the label they earn when trusted).
SHOP: dict[str, tuple[types.ToolAnnotations | None, str]] = {
    "read_orders": (A(read_only_hint=True), "cancellable"),
    "refund": (A(destructive_hint=True, idempotent_hint=False), "irreversible"),
    "set_status": (A(destructive_hint=True, idempotent_hint=True), "bounded"),
    "add_note": (A(destructive_hint=False), "bounded"),
    "send_email": (None, "irreversible"),  # no annotations: the spec's defaults
}


class Shop:
    """An upstream whose every tool sleeps ``seconds`` (default 0) and records cancellations."""

    def __init__(self) -> None:
        self.served: Counter[str] = Counter()
        self.cancelled: Counter[str] = Counter()
        tools = [
            types.Tool(name=name, input_schema=_SECONDS, annotations=annotations)
            for name, (annotations, _) in SHOP.items()
        ]

        async def on_list(ctx: Any, params: Any) -> types.ListToolsResult:
            return types.ListToolsResult(tools=tools)

        async def on_call(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
            try:
                await anyio.sleep(float((params.arguments or {}).get("seconds", 0)))
            except anyio.get_cancelled_exc_class():
                self.cancelled[params.name] += 1
                raise
            self.served[params.name] += 1
            return types.CallToolResult(content=[types.TextContent(type="text", text="done")])

        self.server: Server[Any] = Server("shop", on_list_tools=on_list, on_call_tool=on_call)

    def app(self) -> Any:
        return self.server.streamable_http_app(
            stateless_http=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )


@asynccontextmanager
async def running_shop() -> AsyncIterator[tuple[Shop, str]]:
    shop = Shop()
    async with serving(shop.app()) as url:
        yield shop, url


def shop_config(url: str, **upstream: Any) -> dict[str, Any]:
    return config_dict(url, upstreams=[{"name": "shop", "url": f"{url}/mcp", **upstream}])


async def listed_labels(url: str, mode: str | None = None) -> dict[str, Any]:
    kwargs = {"mode": mode} if mode else {}
    async with connect(url, TOKENS["ops-bot"], **kwargs) as client:
        tools = (await client.list_tools()).tools
    return {t.name: (t.meta or {}).get(LABEL_META) for t in tools}


# The policy itself (pure).


@pytest.mark.parametrize("name", sorted(SHOP))
def test_annotations_give_the_label_with_the_spec_defaults(name: str) -> None:
    annotations, expected = SHOP[name]
    assert from_annotations(annotations) == expected


def test_read_only_wins_over_destructive_and_defaults_fill_missing_hints() -> None:
    assert from_annotations(A(read_only_hint=True, destructive_hint=True)) == "cancellable"
    assert from_annotations(A(idempotent_hint=True)) == "bounded"  # destructive by default, idempotent
    assert from_annotations(A(read_only_hint=False)) == "irreversible"
    assert from_annotations(A(open_world_hint=False)) == "irreversible"


def test_the_config_wins_and_an_untrusted_upstream_cannot_claim_a_weaker_label() -> None:
    read_only = A(read_only_hint=True)
    assert label_of("t", read_only, configured={"t": "bounded"}, trust_annotations=True) == "bounded"
    assert label_of("t", read_only, configured={}, trust_annotations=True) == "cancellable"
    assert label_of("t", read_only, configured={}, trust_annotations=False) == "irreversible"
    assert label_of("t", None, configured={"t": "cancellable"}, trust_annotations=False) == "cancellable"


# Through the gateway.


async def test_tools_list_shows_the_labels_from_annotations_on_both_paths() -> None:
    expected = {name: label for name, (_, label) in SHOP.items()}
    async with running_shop() as (_, up), running_gateway(shop_config(up)) as (_, url):
        assert await listed_labels(url) == expected
        assert await listed_labels(url, mode="legacy") == expected


async def test_the_demo_upstreams_tools_are_cancellable() -> None:
    async with running_upstream() as (_, up), running_gateway(config_dict(up)) as (_, url):
        labels = await listed_labels(url)
    assert labels == dict.fromkeys(["lookup_order", "hold", "fail", "sleep", "progress"], "cancellable")


async def test_config_labels_override_annotations_by_the_upstreams_own_names() -> None:
    async with running_shop() as (_, up):
        config = shop_config(up, prefix="shop_", labels={"read_orders": "irreversible", "refund": "bounded"})
        async with running_gateway(config) as (app, url):
            labels = await listed_labels(url)
            route = app.gateway.upstreams.route("shop_refund")
            assert route is not None and route.label == "bounded"
    assert labels == {
        "shop_read_orders": "irreversible",
        "shop_refund": "bounded",
        "shop_set_status": "bounded",
        "shop_add_note": "bounded",
        "shop_send_email": "irreversible",
    }


async def test_an_untrusted_upstream_is_irreversible_except_where_the_config_says() -> None:
    async with running_shop() as (_, up):
        config = shop_config(up, trust_annotations=False, labels={"add_note": "bounded"})
        async with running_gateway(config) as (_, url):
            labels = await listed_labels(url)
    assert labels == {
        "read_orders": "irreversible",  # its read-only hint is not believed
        "refund": "irreversible",
        "set_status": "irreversible",
        "add_note": "bounded",
        "send_email": "irreversible",
    }


async def test_a_label_for_a_tool_the_upstream_does_not_list_is_a_start_up_error(tmp_path: Path) -> None:
    async with running_shop() as (_, up):
        config = shop_config(up, labels={"refund": "irreversible", "wire_money": "irreversible"})
        with pytest.raises(UpstreamError, match=r"upstream 'shop'.*wire_money"):
            async with running_gateway(config):
                pass
        # The CLI reports it like any start-up error: one line, exit 2.
        path = tmp_path / "gateway.toml"
        path.write_text(
            '[gateway]\ndevelopment = true\n[[upstreams]]\nname = "shop"\n'
            f'url = "{up}/mcp"\nlabels = {{ wire_money = "irreversible" }}\n'
        )
        done = await run_haltwire_async("gateway", "--config", str(path), "--port", "0")
    stderr = done.stderr
    assert done.returncode == 2, stderr
    assert "'shop'" in stderr and "wire_money" in stderr and "Traceback" not in stderr


def test_a_label_that_is_not_a_label_is_a_config_error() -> None:
    data = shop_config("http://127.0.0.1:9", labels={"refund": "reversible"})
    with pytest.raises(ConfigError, match=r"upstreams\[0\]\.labels\.refund"):
        parse_config(data, "x.toml")


def test_slot_ttl_must_outlast_the_label_deadlines_too() -> None:
    data = config_dict(
        "http://127.0.0.1:9",
        counters={"backend": "redis", "slot_ttl_s": 100},
        labels={"irreversible_deadline_s": 120},
    )
    with pytest.raises(ConfigError, match=r"slot_ttl_s \(100\) must exceed the longest deadline \(120 s\)"):
        parse_config(data, "x.toml")
    data["labels"] = {"irreversible_deadline_s": 90}
    assert parse_config(data, "x.toml").labels.irreversible_deadline_s == 90


DEADLINES = {"cancellable_deadline_s": 0.3, "bounded_deadline_s": 0.5, "irreversible_deadline_s": 0.7}


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
async def test_each_labels_deadline_holds_against_a_hung_upstream(mode: str) -> None:
    """Limits allow 30 s; each label's shorter deadline cuts the call, and the upstream sees it."""
    calls = {"read_orders": 0.3, "set_status": 0.5, "add_note": 0.5, "refund": 0.7, "send_email": 0.7}
    async with running_shop() as (shop, up):
        config = shop_config(up) | {"labels": DEADLINES, "limits": {"deadline_s": 30}}
        async with running_gateway(config) as (_, url), connect(url, TOKENS["ops-bot"], mode=mode) as client:
            for tool, deadline in calls.items():
                started = time.monotonic()
                with anyio.fail_after(15):
                    result = await client.call_tool(tool, {"seconds": 30})
                elapsed = time.monotonic() - started
                assert result.is_error and result.structured_content is not None
                error = result.structured_content["error"]
                assert error["code"] == "deadline_exceeded" and error["retryable"] is False, error
                assert f"within {deadline:g} s" in error["message"]
                assert deadline <= elapsed < 10, (tool, elapsed)
                if SHOP[tool][1] == "irreversible":
                    assert error["outcome"] == "unknown"
                    assert "may or may not have happened" in error["message"]
                else:
                    assert "outcome" not in error
                with anyio.fail_after(5):
                    while shop.cancelled[tool] < 1:  # the upstream saw the cancellation
                        await anyio.sleep(0.02)
            # A call that finishes in time is served as usual.
            assert not (await client.call_tool("refund", {"seconds": 0})).is_error
    assert shop.served == Counter({"refund": 1})


async def test_a_shorter_limits_deadline_wins_over_the_labels() -> None:
    async with running_shop() as (shop, up):
        limits = {"deadline_s": 30, "tools": {"refund": {"deadline_s": 0.3}}}
        config = shop_config(up) | {"limits": limits, "labels": {"irreversible_deadline_s": 60}}
        async with running_gateway(config) as (_, url), connect(url, TOKENS["ops-bot"]) as client:
            with anyio.fail_after(15):
                result = await client.call_tool("refund", {"seconds": 30})
    assert result.structured_content is not None
    error = result.structured_content["error"]
    assert (error["code"], error["outcome"]) == ("deadline_exceeded", "unknown")
    assert "within 0.3 s" in error["message"]


def test_the_unknown_outcome_refusal_is_terminal_and_never_invites_a_retry() -> None:
    r = refusal.deadline_exceeded("refund", 60, irreversible=True)
    assert r.retryable is False and r.retry_after_s is None
    assert r.error()["outcome"] == "unknown"
    assert "failed" not in r.message
    assert not re.search(r"try again|retry|later", r.message, re.IGNORECASE)
    assert "stop calling tools" in r.message and "the task is incomplete" in r.message
    assert r.message.count(".") == 1 and r.message.endswith(".")
    assert "outcome" not in refusal.deadline_exceeded("read_orders", 60).error()
