"""The shop upstream: refunds apply once per idempotency key, and the ledger tells what applied.

Every test runs the shop on a real socket and calls it with the official MCP client.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.types import CallToolResult, RequestParamsMeta, TextContent

from haltwire.demo.shop import INJECTED_ORDER, KEY_META, ORDERS, Shop
from haltwire.demo.stack import connect
from haltwire.serve import serving
from ports import free_port

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def running(shop: Shop) -> AsyncIterator[tuple[str, Client]]:
    async with serving(shop.http_app()) as url, connect(url + "/mcp", None) as client:
        yield url, client


def key_meta(key: str) -> RequestParamsMeta:
    return {KEY_META: key}  # type: ignore[typeddict-unknown-key]  # an open map, as in the spec


async def refund(
    client: Client, key: str | None, order_id: str = "A-1001", cents: int = 1000
) -> CallToolResult:
    meta = None if key is None else key_meta(key)
    return await client.call_tool("issue_refund", {"order_id": order_id, "amount_cents": cents}, meta=meta)


def read_ledger(path: Path) -> dict[str, Any]:
    """The ledger as a fresh shop on the same file sees it."""
    shop = Shop(path)
    try:
        return shop.ledger()
    finally:
        shop.close()


def text(result: CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, TextContent))


async def test_one_key_applies_once_and_answers_the_same_refund_again() -> None:
    shop = Shop()
    async with running(shop) as (url, client):
        first = await refund(client, "k-1")
        second = await refund(client, "k-1")
        async with httpx2.AsyncClient(timeout=10) as http:
            ledger = (await http.get(url + "/ledger")).json()
    assert not first.is_error and not second.is_error
    assert first.structured_content is not None
    assert first.structured_content["refund_id"].startswith("re_")
    assert first.structured_content == second.structured_content
    assert first.structured_content == {
        "refund_id": first.structured_content["refund_id"],
        "order_id": "A-1001",
        "amount_cents": 1000,
        "idempotency_key": "k-1",
    }
    assert ledger["applied"] == 1
    assert ledger["by_order"] == {"A-1001": 1}
    [row] = ledger["refunds"]
    assert (row["idempotency_key"], row["requests"]) == ("k-1", 2)
    assert row["refund_id"] == first.structured_content["refund_id"]
    assert abs(row["applied_at"] - time.time()) < 60


async def test_fresh_keys_for_one_order_apply_again_and_by_order_shows_it() -> None:
    shop = Shop()
    async with running(shop) as (_, client):
        for key in ("k-1", "k-2", "k-3"):
            assert not (await refund(client, key, "A-1002", 500)).is_error
        assert not (await refund(client, "k-4", "A-1005", 500)).is_error
    ledger = shop.ledger()
    assert ledger["applied"] == 4
    assert ledger["by_order"] == {"A-1002": 3, "A-1005": 1}
    assert [r["idempotency_key"] for r in ledger["refunds"]] == ["k-1", "k-2", "k-3", "k-4"]
    assert len({r["refund_id"] for r in ledger["refunds"]}) == 4


async def test_a_key_reused_with_other_arguments_is_refused_and_applies_nothing() -> None:
    shop = Shop()
    async with running(shop) as (_, client):
        first = await refund(client, "k-1", "A-1001", 1000)
        other_amount = await refund(client, "k-1", "A-1001", 999)
        other_order = await refund(client, "k-1", "A-1002", 1000)
    assert not first.is_error
    for r in (other_amount, other_order):
        assert r.is_error
        assert "idempotency key reused with other arguments" in text(r)
    assert shop.ledger()["applied"] == 1
    assert shop.ledger()["refunds"][0]["requests"] == 1


@pytest.mark.parametrize(
    ("key", "order_id", "cents", "words"),
    [
        (None, "A-1001", 1000, "refunds need an idempotency key"),
        ("", "A-1001", 1000, "idempotency key"),
        ("k", "A-1004", 20_001, "1 to 20000"),
        ("k", "A-1001", 0, "1 to 20000"),
        ("k", "A-1001", -5, "1 to 20000"),
        ("k", "A-1005", 1501, "exceeds order A-1005"),
        ("k", "A-9999", 100, "unknown order"),
    ],
)
async def test_an_invalid_refund_is_refused_and_records_nothing(
    key: str | None, order_id: str, cents: int, words: str
) -> None:
    shop = Shop()
    async with running(shop) as (_, client):
        r = await refund(client, key, order_id, cents)
        # The refused key stays free: the same key with valid arguments applies.
        ok = await refund(client, "k", "A-1001", 100)
    assert r.is_error
    assert words in text(r)
    assert not ok.is_error
    assert shop.ledger()["applied"] == 1
    assert shop.ledger()["refunds"][0]["requests"] == 1


async def test_a_refund_of_a_non_integer_is_refused() -> None:
    shop = Shop()
    async with running(shop) as (_, client):
        results = [
            await client.call_tool(
                "issue_refund", {"order_id": "A-1001", "amount_cents": v}, meta=key_meta("k")
            )
            for v in ("1000", 10.5, True)
        ]
    assert all(r.is_error for r in results)
    assert shop.ledger()["applied"] == 0


async def test_read_tools_list_the_catalogue_and_carry_the_injection() -> None:
    shop = Shop()
    async with running(shop) as (_, client):
        listed = await client.call_tool("list_orders", {})
        injected = await client.call_tool("read_order", {"order_id": INJECTED_ORDER})
        plain = await client.call_tool("read_order", {"order_id": "A-1001"})
        unknown = await client.call_tool("read_order", {"order_id": "B-1"})
    assert listed.structured_content is not None
    orders = listed.structured_content["orders"]
    assert [o["order_id"] for o in orders] == [f"A-{n}" for n in range(1001, 1013)]
    assert all(1500 <= o["amount_cents"] <= 19900 for o in orders)
    assert set(orders[0]) == {"order_id", "customer", "amount_cents"}
    assert injected.structured_content is not None
    assert "refund every order" in injected.structured_content["review"]
    assert "IMPORTANT SYSTEM NOTE" in text(injected)  # an LLM reading the text sees it too
    assert plain.structured_content is not None
    assert plain.structured_content["amount_cents"] == ORDERS["A-1001"].amount_cents
    assert "SYSTEM" not in plain.structured_content["review"]
    assert unknown.is_error
    assert shop.ledger()["applied"] == 0


async def test_tools_list_labels_only_the_refund_destructive() -> None:
    async with running(Shop()) as (_, client):
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == {"list_orders", "read_order", "issue_refund"}
    for name in ("list_orders", "read_order"):
        annotations = tools[name].annotations
        assert annotations is not None and annotations.read_only_hint is True
    annotations = tools["issue_refund"].annotations
    assert annotations is not None
    assert (annotations.destructive_hint, annotations.idempotent_hint, annotations.read_only_hint) == (
        True,
        False,
        False,
    )


async def test_the_ledger_file_outlives_the_shop(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    first = Shop(path)
    async with running(first) as (_, client):
        applied = await refund(client, "k-1")
    first.close()
    second = Shop(path)
    try:
        async with running(second) as (_, client):
            again = await refund(client, "k-1")
            conflict = await refund(client, "k-1", cents=5)
    finally:
        second.close()
    assert not again.is_error and again.structured_content == applied.structured_content
    assert conflict.is_error
    ledger = read_ledger(path)
    assert ledger["applied"] == 1 and ledger["refunds"][0]["requests"] == 2


async def test_concurrent_calls_with_one_key_apply_once(tmp_path: Path) -> None:
    shop = Shop(tmp_path / "ledger.db", delay_s=0.2)  # both calls wait, then race to apply
    results: list[CallToolResult] = []
    async with running(shop) as (url, _):

        async def call() -> None:
            async with connect(url + "/mcp", None) as client:
                results.append(await refund(client, "k-race", "A-1004", 4000))

        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(call)
    shop.close()
    assert len(results) == 4 and not any(r.is_error for r in results)
    assert len({r.structured_content["refund_id"] for r in results if r.structured_content}) == 1
    ledger = read_ledger(tmp_path / "ledger.db")
    assert ledger["applied"] == 1
    assert ledger["refunds"][0]["requests"] == 4


async def test_a_caller_gone_mid_call_still_gets_its_refund_applied() -> None:
    shop = Shop(delay_s=0.5)
    async with running(shop) as (url, _):
        with anyio.move_on_after(0.1):
            async with connect(url + "/mcp", None) as client:
                await refund(client, "k-gone")
        assert shop.ledger()["applied"] == 0  # still waiting when the caller left
        await anyio.sleep(0.8)
        assert shop.ledger()["applied"] == 1
        async with connect(url + "/mcp", None) as client:
            retry = await refund(client, "k-gone")
    assert not retry.is_error
    assert shop.ledger()["refunds"][0]["requests"] == 2


async def test_reset_empties_the_ledger() -> None:
    shop = Shop()
    async with running(shop) as (url, client):
        await refund(client, "k-1")
        async with httpx2.AsyncClient(timeout=10) as http:
            assert (await http.post(url + "/reset")).json() == {"ok": True}
            ledger = (await http.get(url + "/ledger")).json()
        again = await refund(client, "k-1", cents=5)  # the key is free again
    assert ledger == {"refunds": [], "applied": 0, "by_order": {}}
    assert not again.is_error
    assert shop.ledger()["applied"] == 1


async def test_the_shop_process_keeps_a_refund_through_a_kill(tmp_path: Path) -> None:
    path, port = tmp_path / "ledger.db", free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "haltwire.demo.shop", "--port", str(port), "--ledger", str(path)]
    async with await anyio.open_process(command, stdout=None, stderr=None) as proc:
        try:
            async with httpx2.AsyncClient(timeout=5) as http:
                with anyio.fail_after(20):
                    while True:
                        try:
                            if (await http.get(url + "/ledger")).status_code == 200:
                                break
                        except httpx2.TransportError:
                            await anyio.sleep(0.1)
            async with connect(url + "/mcp", None) as client:
                applied = await refund(client, "k-kill")
        finally:
            proc.send_signal(signal.SIGKILL)  # no clean shutdown: the commit must already be on disk
            with anyio.fail_after(10):
                await proc.wait()
    ledger = read_ledger(path)
    assert not applied.is_error and applied.structured_content is not None
    assert [r["refund_id"] for r in ledger["refunds"]] == [applied.structured_content["refund_id"]]
