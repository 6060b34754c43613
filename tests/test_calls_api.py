"""``POST /v1/runs/{run_id}/calls``: gateways record what a stop did to a run's calls in flight.

Real control plane on loopback (``plane_harness``), on SQLite and PostgreSQL: only the gateway
role may record, every field is bounded, a request is one transaction, a repeated call id is
recorded once, and the run report lists the calls.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx2
import pytest

from control_harness import failing_trigger, raw_sql
from plane_harness import bearer, full_plane

pytestmark = pytest.mark.anyio


def a_call(call_id: str, stop_id: str, **changes: Any) -> dict[str, Any]:
    now = time.time()
    call = {
        "call_id": call_id,
        "tool": "read_sleep",
        "label": "cancellable",
        "stop_id": stop_id,
        "outcome": "cancelled",
        "started_at": now - 2,
        "stopped_at": now - 1,
        "ended_at": now,
    }
    return {**call, **changes}


async def run_and_stop(client: httpx2.AsyncClient) -> tuple[str, str]:
    """A run of the agent a1, and a stop on it."""
    r = await client.post("/v1/runs", json={}, headers=bearer("agent"))
    assert r.status_code == 201, r.text
    run_id: str = r.json()["run"]["run_id"]
    r = await client.post(
        "/v1/stops", json={"scope": f"run:{run_id}", "reason": "loops"}, headers=bearer("operator")
    )
    assert r.status_code == 201, r.text
    return run_id, str(r.json()["stop_id"])


async def record(
    client: httpx2.AsyncClient, run_id: str, calls: Any, role: str = "gateway"
) -> httpx2.Response:
    return await client.post(f"/v1/runs/{run_id}/calls", json={"calls": calls}, headers=bearer(role))


async def report_calls(client: httpx2.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    r = await client.get(f"/v1/runs/{run_id}/report", headers=bearer("operator"))
    assert r.status_code == 200, r.text
    calls: list[dict[str, Any]] = r.json()["calls"]
    return calls


async def test_a_gateway_records_calls_once_and_the_report_lists_them(store: dict[str, Any]) -> None:
    async with full_plane(store) as (client, stores):
        run_id, stop_id = await run_and_stop(client)
        cut = a_call("call_1", stop_id)
        finished = a_call("call_2", stop_id, tool="job_sleep", label="bounded", outcome="completed")
        r = await record(client, run_id, [cut, finished])
        assert (r.status_code, r.json()) == (200, {"recorded": 2, "repeated": 0}), r.text
        # The gateway lost the answer and sends the same calls again: nothing is recorded twice.
        r = await record(client, run_id, [finished, cut])
        assert (r.status_code, r.json()) == (200, {"recorded": 0, "repeated": 2}), r.text
        calls = await report_calls(client, run_id)
        records = [a for a in await stores.audit.records() if a.action == "call.in_flight"]
    assert [(c["call_id"], c["tool"], c["label"], c["outcome"]) for c in calls] == [
        ("call_1", "read_sleep", "cancellable", "cancelled"),
        ("call_2", "job_sleep", "bounded", "completed"),
    ]
    assert all(c["stop_id"] == stop_id and c["gateway"] == "gateway-1" for c in calls)
    assert [(a.target, a.role, a.detail["run_id"]) for a in records] == [
        ("call_1", "gateway", run_id),
        ("call_2", "gateway", run_id),
    ]
    assert records[0].reason == f"cancellable call read_sleep cut by stop {stop_id}"
    assert records[1].reason == f"bounded call job_sleep let finish after stop {stop_id}: completed"


async def test_only_a_gateway_may_record_calls_and_refusals_are_audited(store: dict[str, Any]) -> None:
    async with full_plane(store) as (client, stores):
        run_id, stop_id = await run_and_stop(client)
        for role in ("operator", "tripwire", "executor", "viewer", "agent"):
            r = await record(client, run_id, [a_call("call_1", stop_id)], role=role)
            assert (r.status_code, r.json()["error"]["code"]) == (403, "forbidden"), (role, r.text)
        r = await client.post(f"/v1/runs/{run_id}/calls", json={"calls": [a_call("call_1", stop_id)]})
        assert r.status_code == 401
        unknown = await record(client, "run-nobody-registered", [a_call("call_1", stop_id)])
        assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "unknown_run")
        no_stop = await record(client, run_id, [a_call("call_1", "stp_0000000000000000")])
        assert (no_stop.status_code, no_stop.json()["error"]["code"]) == (422, "invalid_request")
        assert "no stop has the id" in no_stop.json()["error"]["message"]
        assert await report_calls(client, run_id) == []
        refused = [a for a in await stores.audit.records() if a.action == "run.calls.record"]
    assert [a.outcome for a in refused] == ["refused"] * 7


@pytest.mark.parametrize(
    ("what", "calls"),
    [
        ("no calls", []),
        ("101 calls", [a_call(f"call_{i}", "stp_1") for i in range(101)]),
        ("a tool name past 256 characters", [a_call("call_1", "stp_1", tool="t" * 257)]),
        ("a call id that is not an id", [a_call("call 1/..", "stp_1")]),
        ("an unknown label", [a_call("call_1", "stp_1", label="harmless")]),
        ("an unknown outcome", [a_call("call_1", "stp_1", outcome="fine")]),
        ("a negative time", [a_call("call_1", "stp_1", started_at=-1)]),
        ("a time past the year 2286", [a_call("call_1", "stp_1", ended_at=1e11)]),
        ("an unknown field", [{**a_call("call_1", "stp_1"), "extra": 1}]),
        ("a missing field", [{k: v for k, v in a_call("call_1", "stp_1").items() if k != "label"}]),
    ],
)
async def test_every_field_is_bounded(tmp_path: Any, what: str, calls: list[dict[str, Any]]) -> None:
    async with full_plane({"backend": "sqlite", "path": str(tmp_path / "c.db")}) as (client, stores):
        run_id, _ = await run_and_stop(client)
        r = await record(client, run_id, calls)
        assert (r.status_code, r.json()["error"]["code"]) == (422, "invalid_request"), (what, r.text)
        assert len(r.content) < 2000, "the refusal does not echo the values"
        assert not [a for a in await stores.audit.records() if a.action == "call.in_flight"]


async def test_nan_and_infinite_times_are_refused(tmp_path: Any) -> None:
    async with full_plane({"backend": "sqlite", "path": str(tmp_path / "c.db")}) as (client, _):
        run_id, stop_id = await run_and_stop(client)
        for value in ("NaN", "Infinity", "-Infinity"):
            text = json.dumps({"calls": [a_call("call_1", stop_id, started_at=0)]}).replace(
                ": 0,", f": {value},", 1
            )
            assert value in text
            r = await client.post(
                f"/v1/runs/{run_id}/calls",
                content=text,
                headers={**bearer("gateway"), "Content-Type": "application/json"},
            )
            assert r.status_code == 422, (value, r.text)
        assert await report_calls(client, run_id) == []


async def test_a_request_is_one_transaction(store: dict[str, Any]) -> None:
    """The second call's audit record fails: the first is not recorded either (503, written no)."""
    async with full_plane(store) as (client, stores):
        run_id, stop_id = await run_and_stop(client)
        sql = raw_sql(store)
        # Fails the second record of the request only: the first one is in by then.
        if store["backend"] == "sqlite":
            sql(
                "CREATE TRIGGER fail_second BEFORE INSERT ON audit WHEN NEW.target = 'call_2' "
                "BEGIN SELECT RAISE(ABORT, 'the audit disk is full'); END"
            )
        else:
            sql(*failing_trigger(store, "audit", "INSERT", "the audit disk is full"))
            sql("DROP TRIGGER fail_audit_insert ON audit")
            sql(
                "CREATE TRIGGER fail_audit_insert BEFORE INSERT ON audit FOR EACH ROW "
                "WHEN (NEW.target = 'call_2') EXECUTE FUNCTION fail_audit_insert()"
            )
        r = await record(client, run_id, [a_call("call_1", stop_id), a_call("call_2", stop_id)])
        assert r.status_code == 503, r.text
        assert r.json()["error"]["written"] == "no"
        assert await report_calls(client, run_id) == []
        assert not [a for a in await stores.audit.records() if a.target == "call_1"]
