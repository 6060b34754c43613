"""A run belongs to the identity that registered it: the same agent id in the same tenant.

A hostile fleet of another tenant whose agent id is the same ("a1" in acme and in beta) must
not renew, end, checkpoint, read, report, take credentials for or resume from acme's runs, see
their ``run:`` stops, or read their intents: each answers as if the run (the intent) did not
exist, and the writes are audited as refused. A new version of the agent in its own tenant owns
its tenant's runs; another agent of the same tenant is refused 403 as before. An executor's
runs carry its name as agent: no agent of its tenant may share that name.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest

from broker_harness import broker
from control_harness import TOKEN, Events
from haltwire.config import ConfigError
from haltwire.control import create_app, parse_control_config
from haltwire.control.stores import open_stores
from haltwire.serve import serving
from runs_harness import config_dict

pytestmark = pytest.mark.anyio

#: Agent identities beside ``agent-1`` (a1, acme, 2.1): (agent, tenant, version).
AGENTS = {
    "beta-a1": ("a1", "beta", "2.1"),  # the same agent id and version in another tenant
    "acme-22": ("a1", "acme", "2.2"),  # a new version of agent-1's agent in its tenant
    "acme-a3": ("a3", "acme", "2.1"),  # another agent of agent-1's tenant
    "ex-1": ("executor-1", "other", "0"),  # named as the executor (tenant "default"), in another tenant
}
TOKENS = {**TOKEN, **{who: f"tok-{who}" for who in AGENTS}}


def auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[who]}"}


def config(tmp_path: Path, agents: dict[str, tuple[str, str, str]] = AGENTS) -> dict[str, Any]:
    data = config_dict({"backend": "sqlite", "path": str(tmp_path / "control.db")})
    data["broker"] = broker(tmp_path)
    data["identities"] += [
        {"name": who, "role": "agent", "token": TOKENS[who], "agent": a, "tenant": t, "version": v}
        for who, (a, t, v) in agents.items()
    ]
    return data


@asynccontextmanager
async def plane(tmp_path: Path) -> AsyncIterator[httpx2.AsyncClient]:
    parsed = parse_control_config(config(tmp_path))
    async with open_stores(parsed) as stores:
        async with serving(create_app(parsed, stores)) as url:
            async with httpx2.AsyncClient(base_url=url, timeout=10) as client:
                yield client


async def register(client: httpx2.AsyncClient, who: str, **body: Any) -> dict[str, Any]:
    r = await client.post("/v1/runs", json=body, headers=auth(who))
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


async def records(client: httpx2.AsyncClient, actor: str) -> list[tuple[str, str, str]]:
    r = await client.get("/v1/audit", headers=auth("operator"))
    return [(a["action"], a["target"], a["outcome"]) for a in r.json()["records"] if a["actor"] == actor]


#: Every request an agent makes about one run: (method, path, body).
ABOUT_A_RUN = (
    ("POST", "/v1/runs/{run}/lease", None),
    ("POST", "/v1/runs/{run}/end", None),
    ("PUT", "/v1/runs/{run}/checkpoint", {"data": {"step": 9}}),
    ("GET", "/v1/runs/{run}/checkpoint", None),
    ("GET", "/v1/runs/{run}", None),
    ("GET", "/v1/runs/{run}/report", None),
    ("POST", "/v1/runs/{run}/credentials", {"audience": "orders"}),
    ("GET", "/v1/runs/{run}/credentials", None),
)


async def answers(client: httpx2.AsyncClient, who: str, run_id: str) -> list[tuple[int, str]]:
    out = []
    for method, path, body in ABOUT_A_RUN:
        r = await client.request(method, path.format(run=run_id), json=body, headers=auth(who))
        out.append((r.status_code, r.json()["error"]["code"]) if r.status_code >= 400 else (r.status_code, "ok"))
    return out


async def test_another_tenants_run_answers_as_an_unknown_run(tmp_path: Path) -> None:
    async with plane(tmp_path) as client:
        await register(client, "agent", run_id="r-acme")
        ok = await client.put("/v1/runs/r-acme/checkpoint", json={"data": {"secret": 1}}, headers=auth("agent"))
        assert ok.status_code == 200, ok.text
        foreign = await answers(client, "beta-a1", "r-acme")
        unknown = await answers(client, "beta-a1", "r-nope")
        assert foreign == unknown == [(404, "unknown_run")] * len(ABOUT_A_RUN)
        r = await client.post("/v1/runs/r-acme/end", headers=auth("beta-a1"))
        assert r.json()["error"] == {
            "code": "unknown_run",
            "message": "no run has the id r-acme",
            "retryable": False,
        }
        # Nothing of it was done: the run is live, its checkpoint is the owner's.
        run = (await client.get("/v1/runs/r-acme", headers=auth("agent"))).json()
        assert run["ended_at"] is None
        checkpoint = (await client.get("/v1/runs/r-acme/checkpoint", headers=auth("agent"))).json()
        assert (checkpoint["seq"], checkpoint["data"]) == (1, {"secret": 1})
        # The writes were refused on the record (the operator reads whose run it was).
        refused = [(a, t, o) for a, t, o in await records(client, "beta-a1") if t == "r-acme"]
        for action in ("lease.renew", "run.end", "checkpoint.save", "credential.issue"):
            assert (action, "r-acme", "refused") in refused, action
        audit = (await client.get("/v1/audit", headers=auth("operator"))).json()["records"]
        ended = next(a for a in audit if a["action"] == "run.end" and a["actor"] == "beta-a1")
        assert "another tenant" in ended["reason"], ended


async def test_another_tenants_batched_renewal_is_refused_as_unknown_and_audited(tmp_path: Path) -> None:
    async with plane(tmp_path) as client:
        await register(client, "agent", run_id="r-acme")
        await register(client, "beta-a1", run_id="r-beta")
        runs = ["r-acme", "r-beta", "r-nope"]
        r = await client.post("/v1/leases/renew", json={"runs": runs}, headers=auth("beta-a1"))
        body = r.json()
        assert list(body["leases"]) == ["r-beta"]
        assert body["refused"]["r-acme"] == body["refused"]["r-nope"] | {"message": "no run has the id r-acme"}
        assert body["refused"]["r-acme"]["code"] == "unknown_run"
        renewals = [t for a, t, o in await records(client, "beta-a1") if a == "lease.renew" and o == "refused"]
        assert renewals == ["r-acme"]  # the unknown run is not audited; the foreign one is


async def test_resuming_from_another_tenants_run_is_refused(tmp_path: Path) -> None:
    async with plane(tmp_path) as client:
        await register(client, "agent", run_id="r-acme")
        r = await client.put("/v1/runs/r-acme/checkpoint", json={"data": {"secret": 1}}, headers=auth("agent"))
        assert r.status_code == 200
        for source in ("r-acme", "r-nope"):
            r = await client.post("/v1/runs", json={"resume_from": source}, headers=auth("beta-a1"))
            assert (r.status_code, r.json()["error"]["code"]) == (422, "invalid_request"), r.text
            assert "secret" not in r.text
        assert (await client.get("/v1/runs", headers=auth("operator"))).json()["runs"][0]["run_id"] == "r-acme"


async def test_a_new_version_in_the_same_tenant_owns_the_runs(tmp_path: Path) -> None:
    async with plane(tmp_path) as client:
        await register(client, "agent", run_id="r-acme")
        r = await client.put("/v1/runs/r-acme/checkpoint", json={"data": {"step": 3}}, headers=auth("agent"))
        assert r.status_code == 200
        resumed = await register(client, "acme-22", run_id="r-next", resume_from="r-acme")
        assert resumed["checkpoint"]["data"] == {"step": 3}
        assert (resumed["run"]["version"], resumed["run"]["tenant"]) == ("2.2", "acme")
        assert (await client.post("/v1/runs/r-acme/lease", headers=auth("acme-22"))).status_code == 200


async def test_another_agent_of_the_same_tenant_is_forbidden(tmp_path: Path) -> None:
    async with plane(tmp_path) as client:
        await register(client, "agent", run_id="r-acme")
        got = await answers(client, "acme-a3", "r-acme")
        assert got == [(403, "forbidden")] * len(ABOUT_A_RUN)


async def test_another_tenants_run_stops_are_not_seen(tmp_path: Path) -> None:
    async with plane(tmp_path) as client:
        await register(client, "agent", run_id="r-acme")
        await register(client, "beta-a1", run_id="r-beta")
        theirs = await client.post("/v1/stops", json={"scope": "run:r-acme", "reason": "x"}, headers=auth("operator"))
        mine = await client.post("/v1/stops", json={"scope": "run:r-beta", "reason": "y"}, headers=auth("operator"))
        seen = (await client.get("/v1/stops", headers=auth("beta-a1"))).json()["stops"]
        assert [s["stop_id"] for s in seen] == [mine.json()["stop_id"]]
        seen = (await client.get("/v1/stops", headers=auth("agent"))).json()["stops"]
        assert [s["stop_id"] for s in seen] == [theirs.json()["stop_id"]]
        async with client.stream("GET", "/v1/watch?since=0", headers=auth("beta-a1")) as resp:
            change = await Events(resp).next_change()
        assert json.loads(change["data"])["stop"]["stop_id"] == mine.json()["stop_id"]


async def test_another_tenants_intent_answers_as_an_unknown_intent(tmp_path: Path) -> None:
    async with plane(tmp_path) as client:
        await register(client, "agent", run_id="r-acme")
        body = {
            "run_id": "r-acme",
            "agent": "a1",
            "tenant": "acme",
            "version": "2.1",
            "tool": "refund",
            "arguments": {"order": 7},
            "idempotency_key": "k-1",
        }
        r = await client.post("/v1/intents", json=body, headers=auth("gateway"))
        intent_id = r.json()["intent_id"]
        assert (await client.get(f"/v1/intents/{intent_id}", headers=auth("acme-22"))).status_code == 200
        r = await client.get(f"/v1/intents/{intent_id}", headers=auth("acme-a3"))
        assert (r.status_code, r.json()["error"]["code"]) == (403, "forbidden")
        foreign = await client.get(f"/v1/intents/{intent_id}", headers=auth("beta-a1"))
        unknown = await client.get("/v1/intents/int_nope", headers=auth("beta-a1"))
        assert (foreign.status_code, foreign.json()["error"]["code"]) == (404, "unknown_intent")
        assert foreign.json()["error"]["message"] == unknown.json()["error"]["message"].replace("int_nope", intent_id)


async def test_an_agent_named_as_an_executor_in_another_tenant_owns_none_of_its_runs(tmp_path: Path) -> None:
    async with plane(tmp_path) as client:
        executor_run = (await register(client, "executor", run_id="r-exec"))["run"]
        assert (executor_run["agent"], executor_run["tenant"]) == ("executor-1", "default")
        assert await answers(client, "ex-1", "r-exec") == [(404, "unknown_run")] * len(ABOUT_A_RUN)
        assert (await client.post("/v1/runs/r-exec/lease", headers=auth("executor"))).status_code == 200


def test_an_agent_may_not_share_an_executors_name_in_its_tenant(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="executor-1"):
        parse_control_config(config(tmp_path, {"ex-1": ("executor-1", "default", "0")}))


async def test_another_tenants_idempotency_key_answers_nothing_of_its_intent(tmp_path: Path) -> None:
    # Keys are unique per agent id in the store: beta's a1 reusing acme's a1 key must not be
    # answered acme's intent (its state, its outcome) nor its id.
    async with plane(tmp_path) as client:
        body = {
            "agent": "a1",
            "tenant": "acme",
            "version": "2.1",
            "tool": "refund",
            "arguments": {"order": 7},
            "idempotency_key": "k-1",
        }
        acme = (await client.post("/v1/intents", json=body, headers=auth("gateway"))).json()
        for arguments in ({"order": 7}, {"order": 8}):
            beta = {**body, "tenant": "beta", "arguments": arguments}
            r = await client.post("/v1/intents", json=beta, headers=auth("gateway"))
            assert (r.status_code, r.json()["error"]["code"]) == (409, "idempotency_conflict"), r.text
            assert acme["intent_id"] not in r.text
        r = await client.get("/v1/intents", headers=auth("viewer"))
        assert [i["intent_id"] for i in r.json()["intents"]] == [acme["intent_id"]]
