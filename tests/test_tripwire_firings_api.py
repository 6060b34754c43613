"""``POST /v1/tripwire-firings``: a gateway's tripwire in shadow mode records what it would have
stopped (a ``stop.shadow`` audit record, once per firing id), and the run report shows it.

Real control plane on loopback (``plane_harness``), on SQLite and PostgreSQL.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import httpx2
import pytest

from page_receiver import Receiver, receiving
from plane_harness import bearer, full_plane
from rules_harness import rules_plane

pytestmark = pytest.mark.anyio


def firing(scope: str, **changes: Any) -> dict[str, Any]:
    body = {
        "firing_id": "tripwire-abc",
        "rule": "refunds-per-run",
        "kind": "steps",
        "scope": scope,
        "reason": "tripwire refunds-per-run (steps, shadow): call 6 of run r would pass its limit of 5",
        "fired_at": time.time() - 1,
    }
    return {**body, **changes}


async def post(client: httpx2.AsyncClient, body: Any, role: str = "tripwire") -> httpx2.Response:
    return await client.post("/v1/tripwire-firings", json=body, headers=bearer(role))


async def test_a_firing_is_recorded_once_and_shows_in_the_run_report(store: dict[str, Any]) -> None:
    async with full_plane(store) as (client, stores):
        r = await client.post("/v1/runs", json={}, headers=bearer("agent"))
        assert r.status_code == 201, r.text
        run_id = r.json()["run"]["run_id"]
        body = firing(f"run:{run_id}")
        r = await post(client, body)
        assert (r.status_code, r.json()) == (200, {"recorded": True}), r.text
        r = await post(client, body)  # a retry whose answer was lost
        assert (r.status_code, r.json()) == (200, {"recorded": False}), r.text
        # The same id on another scope or with another reason is not a second firing either.
        for other in (firing("tenant:acme"), {**body, "reason": "another"}):
            r = await post(client, other)
            assert (r.status_code, r.json()) == (200, {"recorded": False}), r.text
        r = await post(client, {**body, "firing_id": "tripwire-def"})  # another firing of the run
        assert (r.status_code, r.json()) == (200, {"recorded": True}), r.text
        record, _ = [a for a in await stores.audit.records() if a.action == "stop.shadow"]
        assert record.detail["firing_id"] == "tripwire-abc"
        assert (record.target, record.role, record.detail["run_id"]) == (f"run:{run_id}", "tripwire", run_id)
        assert record.detail["fired_at"] == body["fired_at"] and record.detail["rule"] == "refunds-per-run"
        assert record.reason.startswith(f"would have stopped run:{run_id}: tripwire refunds-per-run")
        r = await client.get(f"/v1/runs/{run_id}/report", headers=bearer("operator"))
        assert r.status_code == 200, r.text
        report = r.json()
        assert [e["action"] for e in report["timeline"] if e["action"] == "stop.shadow"] == ["stop.shadow"] * 2
        assert report["stops"] == [], "a shadow firing stops nothing"


async def test_only_a_tripwire_may_record_a_firing(store: dict[str, Any]) -> None:
    async with full_plane(store) as (client, stores):
        for role in ("operator", "gateway", "executor", "viewer", "agent"):
            r = await post(client, firing("tenant:acme"), role)
            assert (r.status_code, r.json()["error"]["code"]) == (403, "forbidden"), (role, r.text)
        r = await client.post("/v1/tripwire-firings", json=firing("tenant:acme"))
        assert r.status_code == 401
        for bad in (firing("nonsense"), firing("tenant:acme", reason=""), firing("tenant:acme", fired_at=-1)):
            r = await post(client, bad)
            assert (r.status_code, r.json()["error"]["code"]) == (422, "invalid_request"), r.text
        assert not [a for a in await stores.audit.records() if a.action == "stop.shadow"]


async def test_a_firing_is_paged_once_as_a_shadow_firing(store: dict[str, Any]) -> None:
    receiver = Receiver()
    async with receiving(receiver) as hook:
        notify = [{"name": "oncall", "kind": "webhook", "url": f"{hook}/hook", "on": ["shadow"]}]
        async with rules_plane(store, notify=notify) as plane:
            body = firing("tenant:acme")
            for _ in range(2):  # the repeat of a lost answer pages no one again
                assert (await post(plane.client, body)).status_code == 200
            await receiver.wait(pages=1)
            await anyio.sleep(0.7)  # past the sender's poll: nothing more comes
    ((_, page, _),) = receiver.pages
    assert (page["event"], page["subject"], page["scope"]) == ("shadow", "tripwire-abc", "tenant:acme")
    assert page["rule"] == "refunds-per-run" and page["reason"].startswith("would have stopped tenant:acme")
