"""Runs and leases through a real control plane on loopback, against SQLite and PostgreSQL.

Registration grants a signed lease; renewal is refused (409 ``stopped``) once a stop matches
any of the run's scopes and granted again after the clear, with a fencing generation past the
stop; batched renewals, ownership, checkpoints, the role matrix, and a stop written through
another replica on the same PostgreSQL schema.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from control_harness import ROLES
from haltwire.control.stores import Stores
from haltwire.stops import StopSet
from haltwire.store.runs import RunRecord
from haltwire.tokens import Grant, LeaseKeys
from harness import postgres_section
from runs_harness import (
    KEYS,
    SECRET,
    audit,
    auth,
    clear,
    issue,
    plane,
    register,
    renew,
)

pytestmark = pytest.mark.anyio

async def mirror(stores: Stores) -> StopSet:
    """The registry's stops as an enforcement point would hold them."""
    stops = StopSet()
    for change in await stores.registry.changes_since(0):
        stops.apply(change.kind, change.stop, change.revision)
    return stops


def scopes_of(run: dict[str, Any]) -> RunRecord:
    """The record the API's run was served from (its ``drill`` is the API's: no drill runs here)."""
    assert run["drill"] is False
    return RunRecord(**{**{k: v for k, v in run.items() if k != "drill"}, "tools": tuple(run["tools"])})


# -- registration and renewal -------------------------------------------------------------------


async def test_registration_grants_a_signed_lease_with_the_runs_claims(store: dict[str, Any]) -> None:
    async with plane(store) as (client, _):
        got = await register(client, run_id="r-1", tools=["lookup_order"], agent_class="fast")
        run, lease = got["run"], got["lease"]
        assert got["checkpoint"] is None
        assert run["run_id"] == "r-1" and run["tools"] == ["lookup_order"]
        assert (run["agent"], run["tenant"], run["version"]) == ("a1", "acme", "2.1")
        assert run["registered_by"] == "agent-1" and run["ended_at"] is None and run["resumed_from"] is None
        assert (lease["ttl_s"], lease["renew_every_s"], lease["renew_timeout_s"]) == (3, 1, 2)
        claims = KEYS.verify(lease["token"], now=lease["expires_at"] - 1)
        assert (claims.run, claims.agent, claims.tenant, claims.version) == ("r-1", "a1", "acme", "2.1")
        assert claims.generation == lease["generation"] == 0
        assert claims.expires_at == lease["expires_at"] == pytest.approx(claims.issued_at + 3)

        r = await renew(client, "r-1")
        assert r.status_code == 200, r.text
        renewed = r.json()
        assert renewed["run_id"] == "r-1" and renewed["expires_at"] >= lease["expires_at"]
        assert KEYS.verify(renewed["token"], now=renewed["expires_at"] - 1).run == "r-1"

        generated = await register(client)  # no run_id: one is generated; class default
        assert generated["run"]["run_id"].startswith("run_") and generated["lease"]["ttl_s"] == 15
        got_run = await client.get("/v1/runs/r-1", headers=auth("agent"))
        assert got_run.json() == run


@pytest.mark.parametrize("kind", ["run", "agent", "tenant", "version", "global"])
async def test_a_stop_on_each_run_scope_refuses_renewal_until_cleared(
    store: dict[str, Any], kind: str
) -> None:
    async with plane(store) as (client, stores):
        mine = await register(client, run_id="r-mine")
        theirs = await register(client, "agent-2", run_id="r-theirs")
        scope = {
            "run": "run:r-mine",
            "agent": "agent:a1",
            "tenant": "tenant:acme",
            "version": "version:a1@2.1",
            "global": "global",
        }[kind]
        stop = await issue(client, scope)

        r = await renew(client, "r-mine")
        assert r.status_code == 409, r.text
        error = r.json()["error"]
        assert error["code"] == "stopped" and error["retryable"] is False
        assert (error["stop_id"], error["scope"], error["reason"]) == (stop["stop_id"], scope, "runaway")
        # Read by a runtime and by people, never by a model: no words telling it to stop calling tools.
        assert "stop calling tools" not in error["message"] and error["message"].endswith("(runaway).")
        other = await renew(client, "r-theirs", "agent-2")
        assert other.status_code == (409 if kind == "global" else 200), other.text

        await clear(client, stop["stop_id"])
        again = await renew(client, "r-mine")
        assert again.status_code == 200, again.text
        fresh = again.json()
        # The old token predates the stop: an enforcement point fences it; the new one passes.
        fence = (await mirror(stores)).fence(scopes_of(mine["run"]).scopes)
        assert fence == stop["revision"]
        assert mine["lease"]["generation"] < fence <= fresh["generation"]
        assert KEYS.verify(fresh["token"], now=fresh["expires_at"] - 1).generation == fresh["generation"]
        assert theirs["lease"]["generation"] < stop["revision"]


async def test_a_tool_stop_does_not_refuse_renewal(store: dict[str, Any]) -> None:
    async with plane(store) as (client, _):
        await register(client, run_id="r-1", tools=["refund"])
        await issue(client, "tool:refund")
        r = await renew(client, "r-1")
        assert r.status_code == 200, r.text


async def test_a_refused_renewal_is_audited_once_per_stop_and_grants_are_not_audited(
    store: dict[str, Any],
) -> None:
    async with plane(store) as (client, _):
        await register(client, run_id="r-1")
        for _ in range(3):
            assert (await renew(client, "r-1")).status_code == 200
        first = await issue(client, "run:r-1")
        for _ in range(3):
            assert (await renew(client, "r-1")).status_code == 409
        await clear(client, first["stop_id"])
        second = await issue(client, "agent:a1")
        for _ in range(2):
            r = await client.post("/v1/leases/renew", json={"runs": ["r-1"]}, headers=auth("agent"))
            assert r.json()["refused"]["r-1"]["stop_id"] == second["stop_id"]
        renewals = [r for r in await audit(client) if r["action"] == "lease.renew"]
        assert [
            (r["outcome"], r["target"], r["detail"]["stop_id"], r["detail"]["runs"]) for r in renewals
        ] == [
            ("refused", "run:r-1", first["stop_id"], ["r-1"]),
            ("refused", "agent:a1", second["stop_id"], ["r-1"]),
        ]


async def test_runs_refused_by_one_stop_in_one_batch_share_one_audit_record(tmp_path: Path) -> None:
    async with plane({"backend": "sqlite", "path": str(tmp_path / "c.db")}) as (client, _):
        runs = [(await register(client, run_id=f"r-{i}"))["run"]["run_id"] for i in range(5)]
        await client.post("/v1/runs/r-4/end", headers=auth("agent"))
        stop = await issue(client, "global")
        for _ in range(3):
            r = await client.post("/v1/leases/renew", json={"runs": runs}, headers=auth("agent"))
            assert sorted(r.json()["refused"]) == runs and r.json()["leases"] == {}
        renewals = [r for r in await audit(client) if r["action"] == "lease.renew"]
        assert [(r["target"], r["detail"]["code"], r["detail"]["runs"]) for r in renewals] == [
            ("global", "stopped", ["r-0", "r-1", "r-2", "r-3"]),
            ("r-4", "run_ended", ["r-4"]),
        ]
        assert renewals[0]["detail"]["stop_id"] == stop["stop_id"]


async def test_batched_renewal_answers_each_run(store: dict[str, Any]) -> None:
    async with plane(store) as (client, _):
        for run_id in ("r-ok", "r-stopped", "r-ended"):
            await register(client, run_id=run_id)
        await register(client, "agent-2", run_id="r-foreign")
        stop = await issue(client, "run:r-stopped")
        assert (await client.post("/v1/runs/r-ended/end", headers=auth("agent"))).status_code == 200
        runs = ["r-ok", "r-stopped", "r-ended", "r-foreign", "r-unknown", "r-ok"]
        r = await client.post("/v1/leases/renew", json={"runs": runs}, headers=auth("agent"))
        assert r.status_code == 200, r.text
        body = r.json()
        assert list(body["leases"]) == ["r-ok"]
        assert KEYS.verify(body["leases"]["r-ok"]["token"], now=body["leases"]["r-ok"]["expires_at"] - 1)
        codes = {run_id: e["code"] for run_id, e in body["refused"].items()}
        assert codes == {
            "r-stopped": "stopped",
            "r-ended": "run_ended",
            "r-foreign": "unknown_run",  # another tenant's: answered as unknown
            "r-unknown": "unknown_run",
        }
        assert body["refused"]["r-stopped"]["stop_id"] == stop["stop_id"]
        bads: list[dict[str, Any]] = [{"runs": []}, {"runs": ["x"] * 1001}, {"runs": ["x"], "extra": 1}]
        for bad in bads:
            r = await client.post("/v1/leases/renew", json=bad, headers=auth("agent"))
            assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"


# -- refusals -------------------------------------------------------------------------------------


async def test_ownership_and_request_errors(store: dict[str, Any]) -> None:
    async with plane(store) as (client, _):
        await register(client, run_id="r-1")
        for method, path in (
            ("POST", "/v1/runs/r-1/lease"),
            ("POST", "/v1/runs/r-1/end"),
            ("GET", "/v1/runs/r-1"),
            ("GET", "/v1/runs/r-1/checkpoint"),
        ):
            # agent-2 is of another tenant: its runs answer as unknown (test_tenant_runs.py).
            r = await client.request(method, path, headers=auth("agent-2"))
            assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_run", (path, r.text)
        r = await client.put("/v1/runs/r-1/checkpoint", json={"data": {}}, headers=auth("agent-2"))
        assert r.status_code == 404

        cases = [
            ({"run_id": "r-1"}, 409, "run_exists"),
            ({"agent_class": "nope"}, 422, "invalid_request"),
            ({"run_id": "has space"}, 422, "invalid_request"),
            ({"colour": "red"}, 422, "invalid_request"),
            ({"resume_from": "r-unknown"}, 422, "invalid_request"),
        ]
        for body, status, code in cases:
            r = await client.post("/v1/runs", json=body, headers=auth("agent"))
            assert (r.status_code, r.json()["error"]["code"]) == (status, code), (body, r.text)
        await register(client, "agent-2", run_id="r-2")
        r = await client.post("/v1/runs", json={"resume_from": "r-2"}, headers=auth("agent"))
        assert r.status_code == 422, r.text

        r = await renew(client, "r-unknown")
        assert (r.status_code, r.json()["error"]["code"]) == (404, "unknown_run")
        ended = await client.post("/v1/runs/r-1/end", headers=auth("agent"))
        assert ended.status_code == 200 and ended.json()["ended_at"] is not None
        r = await renew(client, "r-1")
        assert (r.status_code, r.json()["error"]["code"]) == (409, "run_ended")
        by_operator = await client.post("/v1/runs/r-2/end", headers=auth("operator"))
        assert by_operator.status_code == 200

        # A run that a stop already covers is refused, and nothing is recorded for it.
        stop = await issue(client, "tenant:acme")
        r = await client.post("/v1/runs", json={"run_id": "r-3"}, headers=auth("agent"))
        assert r.status_code == 409 and r.json()["error"]["stop_id"] == stop["stop_id"]
        assert (await client.get("/v1/runs/r-3", headers=auth("operator"))).status_code == 404

        outcomes = [(r["action"], r["target"], r["outcome"]) for r in await audit(client)]
        assert ("run.register", "r-1", "ok") in outcomes
        assert ("run.register", "r-1", "refused") in outcomes  # run_exists
        assert ("run.register", "r-3", "refused") in outcomes  # stopped
        assert ("run.end", "r-1", "refused") in outcomes  # agent-2 tried
        assert ("run.end", "r-2", "ok") in outcomes
        # agent-2 renewed r-1 once above; again now: its refused renewal is audited once.
        assert (await renew(client, "r-1", "agent-2")).status_code == 404
        foreign = [r for r in await audit(client) if r["action"] == "lease.renew" and r["actor"] == "agent-2"]
        assert [(r["target"], r["detail"]["code"]) for r in foreign] == [("r-1", "unknown_run")]
        assert "another tenant" in foreign[0]["reason"]


async def test_without_lease_keys_registration_and_renewal_answer_501(tmp_path: Path) -> None:
    async with plane({"backend": "sqlite", "path": str(tmp_path / "c.db")}, leases=False) as (client, _):
        for path, body in (
            ("/v1/runs", {}),
            ("/v1/runs/r-1/lease", None),
            ("/v1/leases/renew", {"runs": ["r"]}),
        ):
            r = await client.post(path, json=body, headers=auth("agent"))
            assert r.status_code == 501 and r.json()["error"]["code"] == "leases_not_configured", path


# -- checkpoints ----------------------------------------------------------------------------------


async def test_a_new_run_resumes_from_the_latest_checkpoint(store: dict[str, Any]) -> None:
    async with plane(store) as (client, _):
        await register(client, run_id="r-1")
        r = await client.get("/v1/runs/r-1/checkpoint", headers=auth("agent"))
        assert (r.status_code, r.json()["error"]["code"]) == (404, "no_checkpoint")
        for step in (1, 2):
            r = await client.put(
                "/v1/runs/r-1/checkpoint", json={"data": {"step": step}}, headers=auth("agent")
            )
            assert r.status_code == 200 and r.json()["seq"] == step, r.text
        for who in ("agent", "operator", "viewer"):
            latest = await client.get("/v1/runs/r-1/checkpoint", headers=auth(who))
            assert latest.status_code == 200 and latest.json()["data"] == {"step": 2}
        bad = await client.put("/v1/runs/r-1/checkpoint", json={"data": [1]}, headers=auth("agent"))
        assert bad.status_code == 422
        huge = {"data": {"blob": "x" * (1 << 20)}}
        big = await client.put("/v1/runs/r-1/checkpoint", json=huge, headers=auth("agent"))
        assert (big.status_code, big.json()["error"]["code"]) == (413, "payload_too_large")

        resumed = await register(client, run_id="r-2", resume_from="r-1")
        assert resumed["run"]["resumed_from"] == "r-1"
        assert resumed["checkpoint"] == {**latest.json(), "run_id": "r-1", "seq": 2}
        listed = (await client.get("/v1/runs?limit=10", headers=auth("viewer"))).json()["runs"]
        assert [r["run_id"] for r in listed] == ["r-2", "r-1"]
        one = (await client.get("/v1/runs?limit=1", headers=auth("operator"))).json()["runs"]
        assert [r["run_id"] for r in one] == ["r-2"]
        for limit in ("0", "1001", "many"):
            refused = await client.get(f"/v1/runs?limit={limit}", headers=auth("operator"))
            assert refused.status_code == 422, limit
        saves = [r for r in await audit(client) if r["action"] == "checkpoint.save"]
        assert [(r["outcome"], r["detail"].get("seq")) for r in saves] == [
            ("ok", 1),
            ("ok", 2),
            ("refused", None),  # not an object
            ("refused", None),  # too large
        ]


# -- replicas -------------------------------------------------------------------------------------


async def test_a_stop_through_another_replica_refuses_the_next_renewal() -> None:
    with postgres_section() as section:
        async with plane(section) as (first, _), plane(section) as (second, _):
            await register(first, run_id="r-1")
            assert (await renew(first, "r-1")).status_code == 200  # the first replica's mirror is current
            stop = await issue(second, "agent:a1")
            r = await renew(first, "r-1")  # no wait: the renewal itself catches up
            assert r.status_code == 409 and r.json()["error"]["stop_id"] == stop["stop_id"]
            batch = await first.post("/v1/leases/renew", json={"runs": ["r-1"]}, headers=auth("agent"))
            assert batch.json()["refused"]["r-1"]["stop_id"] == stop["stop_id"]
            await clear(second, stop["stop_id"])
            again = await renew(first, "r-1")
            assert again.status_code == 200 and again.json()["generation"] >= stop["revision"]
            ended = await second.post("/v1/runs/r-1/end", headers=auth("agent"))
            assert ended.status_code == 200
            assert (await renew(first, "r-1")).json()["error"]["code"] == "run_ended"


# -- role matrix ----------------------------------------------------------------------------------

ALLOWED = {
    "register": {"agent", "executor"},  # an executor holds a lease of its own
    "renew": {"agent"},
    "renew_batch": {"agent", "executor"},  # 200, the foreign run refused in the answer
    "end": {"agent", "operator"},
    "checkpoint_save": {"agent"},
    "checkpoint_read": {"agent", "operator", "viewer"},
    "run_read": {"operator", "viewer", "executor", "gateway", "tripwire", "agent"},
    "runs_list": {"operator", "viewer"},
}


async def test_every_run_endpoint_against_every_role_and_no_token(tmp_path: Path) -> None:
    ok = {"register": 201}
    async with plane({"backend": "sqlite", "path": str(tmp_path / "c.db")}) as (client, _):
        got, want = {}, {}
        for endpoint, allowed in ALLOWED.items():
            for role in (*ROLES, None):
                run_id = (await register(client))["run"]["run_id"]
                await client.put(f"/v1/runs/{run_id}/checkpoint", json={"data": {}}, headers=auth("agent"))
                method, path, body = {
                    "register": ("POST", "/v1/runs", {}),
                    "renew": ("POST", f"/v1/runs/{run_id}/lease", None),
                    "renew_batch": ("POST", "/v1/leases/renew", {"runs": [run_id]}),
                    "end": ("POST", f"/v1/runs/{run_id}/end", None),
                    "checkpoint_save": ("PUT", f"/v1/runs/{run_id}/checkpoint", {"data": {"a": 1}}),
                    "checkpoint_read": ("GET", f"/v1/runs/{run_id}/checkpoint", None),
                    "run_read": ("GET", f"/v1/runs/{run_id}", None),
                    "runs_list": ("GET", "/v1/runs", None),
                }[endpoint]
                r = await client.request(method, path, json=body, headers=auth(role))
                got[endpoint, role] = r.status_code
                want[endpoint, role] = (
                    ok.get(endpoint, 200) if role in allowed else (401 if role is None else 403)
                )
                if (endpoint, role) in (("renew", "executor"), ("end", "executor")):
                    # An agent's run of tenant acme: another tenant's to the executor's own runs.
                    want[endpoint, role] = 404
        assert got == want


# -- the lease desk itself, with an injected clock ------------------------------------------------


async def test_the_desk_pages_through_changes_and_judges_stop_expiry_by_its_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from haltwire.control import leases, mirror
    from haltwire.control.config import AgentClass
    from haltwire.control.errors import Refused
    from haltwire.store.registry.sqlite import SqliteRegistry

    monkeypatch.setattr(mirror, "_PAGE", 2)  # five changes: three pages
    now = 1_800_000_000.0
    clock = [now]
    desk = leases.LeaseDesk(
        LeaseKeys({"k1": SECRET.encode()}, signing="k1"), {"default": AgentClass()}, lambda: clock[0]
    )
    registry = await SqliteRegistry.open(tmp_path / "c.db")
    try:
        run = RunRecord("r-1", "a1", "acme", "2.1", (), "default", "agent-1", now)
        for i in range(4):
            await registry.issue_stop(f"run:other-{i}", "runaway", "op", now=now)
        await registry.issue_stop("agent:a1", "runaway", "op", now=now, expires_at=now + 10)
        await desk.catch_up(registry)
        assert desk.stops.revision == 5
        refusal = desk.grant(run)
        assert isinstance(refusal, Refused) and refusal.code == "stopped"
        clock[0] = now + 10  # the stop has expired by the desk's clock
        grant = desk.grant(run)
        assert isinstance(grant, Grant) and grant.generation == 5
        assert grant.expires_at == now + 10 + 15
        claims = KEYS.verify(grant.token, now=now + 11)
        assert (claims.issued_at, claims.generation) == (now + 10, 5)
    finally:
        await registry.aclose()


async def test_a_failed_store_answers_503_and_grants_nothing(store: dict[str, Any]) -> None:
    async with plane(store) as (client, stores):
        run = (await register(client))["run"]["run_id"]
        await stores.registry.aclose()  # the stop registry gone: no grant without a stop check
        r = await renew(client, run)
        assert r.status_code == 503 and r.json()["error"]["code"] == "registry_unavailable"
        r = await client.post("/v1/leases/renew", json={"runs": [run]}, headers=auth("agent"))
        assert r.status_code == 503
        r = await client.post("/v1/runs", json={}, headers=auth("agent"))
        assert r.status_code == 503 and "token" not in r.text
        await stores.runs.aclose()
        r = await client.get(f"/v1/runs/{run}", headers=auth("operator"))
        assert r.status_code == 503 and r.json()["error"]["retryable"] is True
