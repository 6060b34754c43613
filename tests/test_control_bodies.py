"""A body limit on every control-plane endpoint: 413 ``payload_too_large`` in the shared error
shape, decided from Content-Length before the body is read, or while a chunked body streams in,
so an oversized body is never held whole; ``[control] max_body_bytes`` (1 MiB) for every
endpoint, ``max_intent_body_bytes`` (4 MiB) for recording and committing intents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from haltwire.config import ConfigError
from haltwire.control import parse_control_config
from haltwire.control.access import ROLES
from haltwire.control.routes import routes
from haltwire.control.routes.wire import Route
from haltwire.executor.client import IntentClient
from haltwire.limits import MAX_BODY_BYTES, MAX_INTENT_BODY_BYTES, MAX_REASON_CHARS
from plane_harness import TOKENS, bearer, chunked, full_plane, plane_config, raw_request

pytestmark = pytest.mark.anyio

TWENTY_MB = 20_000_000
INTENT = "int_00000000000000aa"
#: A path of each route, its parameters filled in.
IDS = {"{run_id}": "r-1", "{stop_id}": "stp_1", "{intent_id}": INTENT}


def sqlite(tmp_path: Path) -> dict[str, Any]:
    return {"backend": "sqlite", "path": str(tmp_path / "control.db")}


def assert_too_large(status: int, body: bytes, limit: int) -> None:
    assert status == 413, (status, body[:300])
    error = json.loads(body)["error"]
    assert set(error) == {"code", "message", "retryable"}
    assert (error["code"], error["retryable"]) == ("payload_too_large", False)
    assert f"{limit} bytes" in error["message"] and len(body) < 1000, error


async def assert_audited_in_brief(stores: Any, action: str) -> None:
    """The refused write is in the log, and nothing of the body is."""
    records = await stores.audit.records()
    mine = [r for r in records if r.action == action]
    assert mine and mine[-1].outcome == "refused" and mine[-1].detail["code"] == "payload_too_large"
    assert all(len(json.dumps(r.detail)) + len(r.reason) + len(r.target) < 4096 for r in records)


async def test_a_20_mb_tools_list_is_refused_not_stored(store: dict[str, Any]) -> None:
    """Issue 11, point 2: an agent's ``POST /v1/runs`` with a 20 MB ``tools`` list was stored."""
    async with full_plane(store) as (client, stores):
        tools = ["t" * (TWENTY_MB // 1000)] * 1000  # as many as a run may declare, each 20 kB
        r = await client.post("/v1/runs", json={"run_id": "r-1", "tools": tools}, headers=bearer("agent"))
        assert_too_large(r.status_code, r.content, MAX_BODY_BYTES)
        assert await stores.runs.list(10) == []
        await assert_audited_in_brief(stores, "run.register")


async def test_a_20_mb_agent_class_is_refused_without_an_echo(store: dict[str, Any]) -> None:
    """Issue 11, point 2: a 20 MB ``agent_class`` was refused 422, echoed back and written into the
    append-only audit log."""
    async with full_plane(store) as (client, stores):
        r = await client.post("/v1/runs", json={"agent_class": "c" * TWENTY_MB}, headers=bearer("agent"))
        assert_too_large(r.status_code, r.content, MAX_BODY_BYTES)
        await assert_audited_in_brief(stores, "run.register")


def _served() -> list[Route]:
    return [r for r in routes if isinstance(r, Route)]


async def test_every_endpoint_answers_a_declared_oversized_body_before_it_arrives(tmp_path: Path) -> None:
    """Content-Length says 64 MiB and no byte of it is sent: every endpoint answers 413 at once
    (an endpoint that reads its body waited for it; one that reads none answered as if none)."""
    async with full_plane(sqlite(tmp_path)) as (client, _):
        url = str(client.base_url)
        assert len(_served()) > 25
        for route in _served():
            path = route.path
            for name, value in IDS.items():
                path = path.replace(name, value)
            role = min(ROLES[route.action]) if route.action else "operator"
            (method,) = route.methods or {"?"}
            head = (
                f"{method} {path} HTTP/1.1\r\nHost: control\r\nAuthorization: Bearer {TOKENS[role]}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {64 << 20}"
            )
            answer = await raw_request(url, head)
            limit = MAX_INTENT_BODY_BYTES if route.body_limit == "max_intent_body_bytes" else MAX_BODY_BYTES
            assert_too_large(answer.status, answer.body, limit)


async def test_a_chunked_body_is_refused_once_it_is_past_the_limit(store: dict[str, Any]) -> None:
    """No Content-Length: the bytes are counted as they arrive, and the answer comes while the
    client is still sending (the body's end is never sent here)."""
    async with full_plane(store) as (client, stores):
        head = (
            f"POST /v1/stops HTTP/1.1\r\nHost: control\r\nAuthorization: Bearer {TOKENS['operator']}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked"
        )
        body = b'{"scope": "global", "reason": "' + b"r" * (MAX_BODY_BYTES + 65536)
        answer = await raw_request(str(client.base_url), head, chunked(body))
        assert_too_large(answer.status, answer.body, MAX_BODY_BYTES)
        assert await stores.registry.all_stops() == []
        await assert_audited_in_brief(stores, "stop.issue")


async def test_the_limits_are_configured_and_larger_only_for_intents(tmp_path: Path) -> None:
    async with full_plane(sqlite(tmp_path), max_body_bytes=65536) as (client, _):
        r = await client.post(
            "/v1/stops", json={"scope": "global", "reason": "r" * 70_000}, headers=bearer("operator")
        )
        assert_too_large(r.status_code, r.content, 65536)
        r = await client.put(
            "/v1/runs/r-1/checkpoint", json={"data": {"x": "y" * 70_000}}, headers=bearer("agent")
        )
        assert_too_large(r.status_code, r.content, 65536)
        # A tool call's arguments as large as a gateway takes (1 MiB by default), and more:
        # recording and committing intents have a limit of their own.
        arguments = {"blob": "a" * (2 << 20)}
        body = {"agent": "a1", "tenant": "acme", "version": "2.1", "tool": "refund", "idempotency_key": "k-1"}
        r = await client.post("/v1/intents", json={**body, "arguments": arguments}, headers=bearer("gateway"))
        assert r.status_code == 201, r.text[:300]
        intent_id = r.json()["intent_id"]
        assert (await client.post("/v1/intents/claim", headers=bearer("executor"))).status_code == 200
        outcome = {"content": [{"type": "text", "text": "o" * (3 << 20)}]}
        r = await client.post(
            f"/v1/intents/{intent_id}/commit", json={"outcome": outcome}, headers=bearer("executor")
        )
        assert r.status_code == 200 and r.json()["state"] == "committed", r.text[:300]
        too_big = {**body, "idempotency_key": "k-2", "arguments": {"blob": "a" * MAX_INTENT_BODY_BYTES}}
        r = await client.post("/v1/intents", json=too_big, headers=bearer("gateway"))
        assert_too_large(r.status_code, r.content, MAX_INTENT_BODY_BYTES)


async def test_the_executor_records_a_result_or_an_error_too_large_for_the_limits(tmp_path: Path) -> None:
    """The call was made: a refusal to record it would leave the intent claimed for good."""
    async with full_plane(sqlite(tmp_path), max_body_bytes=4096, max_intent_body_bytes=65536) as (client, _):
        body = {"agent": "a1", "tenant": "acme", "version": "2.1", "tool": "refund", "arguments": {}}
        for key in ("k-1", "k-2"):
            r = await client.post(
                "/v1/intents", json={**body, "idempotency_key": key}, headers=bearer("gateway")
            )
            assert r.status_code == 201, r.text
        async with IntentClient(str(client.base_url), TOKENS["executor"]) as control:
            first, second = await control.claim(), await control.claim()
            assert first is not None and second is not None
            result = {"content": [{"type": "text", "text": "o" * 100_000}]}
            committed = await control.commit(first["intent_id"], result)
            kept = committed["outcome"]["content"][0]["text"]
            size = len(json.dumps(result, separators=(",", ":")))
            assert committed["state"] == "committed" and f"({size} bytes of JSON, sha256 " in kept
            failed = await control.fail(second["intent_id"], "Traceback\r\n\x1b[31m" + "x" * 10_000)
            assert failed["state"] == "failed" and len(failed["error"]) == MAX_REASON_CHARS
            assert failed["error"].startswith("Traceback \n [31mxxx") and failed["error"].endswith("x...")


def test_the_limits_are_checked_up_front(tmp_path: Path) -> None:
    for control, problem in (
        ({"max_body_bytes": 100}, "max_body_bytes"),
        ({"max_intent_body_bytes": 4096, "max_body_bytes": 8192}, "max_intent_body_bytes"),
    ):
        with pytest.raises(ConfigError, match=problem):
            parse_control_config(plane_config(sqlite(tmp_path), **control))
    config = parse_control_config(plane_config(sqlite(tmp_path)))
    assert (config.control.max_body_bytes, config.control.max_intent_body_bytes) == (
        MAX_BODY_BYTES,
        MAX_INTENT_BODY_BYTES,
    )
