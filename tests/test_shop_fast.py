"""The shop's lean route for ``issue_refund`` answers as the SDK does, and only plain calls take it.

Each case is sent to two shops, one serving the lean route and one the SDK alone, as raw
modern (2026-07-28) POSTs, and their answers compared: the same status, the same JSON-RPC
answer but for the refund's own id.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp_types import CLIENT_CAPABILITIES_META_KEY, CLIENT_INFO_META_KEY, PROTOCOL_VERSION_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from haltwire.demo import shop_fast
from haltwire.demo.shop import KEY_META, Shop
from haltwire.demo.stack import connect
from haltwire.serve import serving

pytestmark = pytest.mark.anyio

VERSION = max(MODERN_PROTOCOL_VERSIONS)
HEADERS = {
    "accept": "application/json, text/event-stream",
    "content-type": "application/json",
    "mcp-protocol-version": VERSION,
    "mcp-method": "tools/call",
    "mcp-name": "issue_refund",
}


def call(key: str | None = "k-1", **arguments: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        PROTOCOL_VERSION_META_KEY: VERSION,
        CLIENT_INFO_META_KEY: {"name": "test", "version": "1"},
        CLIENT_CAPABILITIES_META_KEY: {},
    }
    if key is not None:
        meta[KEY_META] = key
    args = {"order_id": "A-1001", "amount_cents": 100, **arguments}
    return {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "issue_refund", "arguments": args, "_meta": meta},
    }


class Counting:
    """How many calls the lean route answered itself."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.answered = 0
        asked = shop_fast.FastRoute._asked

        def counted(route: shop_fast.FastRoute, body: bytes, version: str) -> Any:
            found = asked(route, body, version)
            self.answered += found is not None
            return found

        monkeypatch.setattr(shop_fast.FastRoute, "_asked", counted)


def without_ids(answer: object) -> str:
    """The answer with every refund's id (random, per shop) blanked."""
    return re.sub(r"re_[0-9a-f]{24}", "re_", answer if isinstance(answer, str) else json.dumps(answer))


CASES = {
    "applied": (call(), HEADERS),
    "repeated key": (call(), HEADERS),  # sent twice to each shop: the second answers the first
    "no key": (call(None), HEADERS),
    "unknown order": (call(order_id="A-9"), HEADERS),
    "too much": (call(amount_cents=10**6), HEADERS),
    "a bool": (call(amount_cents=True), HEADERS),
    "another tool's name header": (call(), {**HEADERS, "mcp-name": "read_order"}),
    "no accept": (call(), {k: v for k, v in HEADERS.items() if k != "accept"}),
    "an old protocol": (call(), {**HEADERS, "mcp-protocol-version": "2025-06-18"}),
    "a mismatched envelope": (
        {
            **call(),
            "params": {
                **call()["params"],
                "_meta": {**call()["params"]["_meta"], PROTOCOL_VERSION_META_KEY: "x"},
            },
        },
        HEADERS,
    ),
}


async def test_the_lean_route_answers_as_the_sdk_does(monkeypatch: pytest.MonkeyPatch) -> None:
    counting = Counting(monkeypatch)
    lean, sdk = Shop(), Shop()
    plain = sdk.http_app()
    plain.user_middleware = []  # the SDK's app alone
    plain.middleware_stack = None
    answers: dict[str, list[tuple[int, Any]]] = {"lean": [], "sdk": []}
    async with serving(lean.http_app()) as lean_url, serving(plain) as sdk_url:
        async with httpx2.AsyncClient(timeout=10) as http:
            for body, headers in CASES.values():
                for name, url in (("lean", lean_url), ("sdk", sdk_url)):
                    r = await http.post(url + "/mcp", json=body, headers=headers)
                    json_answer = r.headers.get("content-type", "").startswith("application/json")
                    answers[name].append((r.status_code, r.json() if json_answer else r.text))
    for case, got, expected in zip(CASES, answers["lean"], answers["sdk"], strict=True):
        assert got[0] == expected[0], case
        assert without_ids(got[1]) == without_ids(expected[1]), case
    assert counting.answered == 6  # the six plain calls; the SDK answered the rest (two applied)
    assert lean.ledger()["applied"] == sdk.ledger()["applied"] == 1
    assert lean.ledger()["refunds"][0]["requests"] == sdk.ledger()["refunds"][0]["requests"] == 4


async def test_the_official_client_takes_the_lean_route(monkeypatch: pytest.MonkeyPatch) -> None:
    counting = Counting(monkeypatch)
    shop = Shop()
    async with serving(shop.http_app()) as url, connect(url + "/mcp", None) as client:
        meta: Any = {KEY_META: "k-client"}
        result = await client.call_tool("issue_refund", {"order_id": "A-1002", "amount_cents": 50}, meta=meta)
    assert not result.is_error and result.structured_content is not None
    assert counting.answered == 1
    assert shop.ledger()["refunds"][0]["idempotency_key"] == "k-client"


async def test_refunds_arriving_together_share_one_write(tmp_path: Path) -> None:
    shop = Shop(tmp_path / "ledger.db")
    writes: list[int] = []
    apply_many = shop._ledger.apply_many

    def counted(refunds: list[tuple[str, str, int]]) -> Any:
        writes.append(len(refunds))
        return apply_many(refunds)

    shop._ledger.apply_many = counted  # type: ignore[method-assign]

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(shop.refund, {KEY_META: f"k-{i}"}, {"order_id": "A-1001", "amount_cents": 1})
    assert sum(writes) == 20 and len(writes) < 20
    assert sorted(r["idempotency_key"] for r in shop.ledger()["refunds"]) == sorted(
        f"k-{i}" for i in range(20)
    )
    shop.close()
