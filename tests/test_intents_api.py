"""Intents through a real control plane on loopback, against SQLite and PostgreSQL.

The gateway records intents (idempotent per agent and key; refused while a stop matches);
executors claim, commit and fail them, only their own, and after a restart mark what they had
claimed unknown and then settle it; operators approve and reject; a stop cancels exactly the
pending and awaiting intents it covers, before it is answered, and audits that; the lists'
filters, an agent reading only its own intents, the role matrix, and the CLI.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from control_harness import ROLES, TOKEN, cli
from haltwire.control.routes import document
from intents_harness import (
    audit,
    auth,
    body,
    claim,
    get,
    issue,
    plane,
    propose,
    settle,
    sqlite,
)
from openapi_harness import SCHEMATHESIS_EXAMPLES

pytestmark = pytest.mark.anyio

# -- recording ----------------------------------------------------------------------------------


async def test_a_key_records_one_intent_and_other_arguments_are_a_conflict(store: dict[str, Any]) -> None:
    async with plane(store) as (client, _):
        first = await propose(client, "k-1")
        assert first["state"] == "pending" and first["intent_id"].startswith("int_")
        assert (first["run_id"], first["tool"], first["arguments"]) == (
            "r-1",
            "refund",
            {"order": "k-1", "amount": 100},
        )

        # The same call again, its arguments in another order: the intent recorded first.
        again = body("k-1", arguments={"amount": 100, "order": "k-1"})
        r = await client.post("/v1/intents", json=again, headers=auth("gateway"))
        assert r.status_code == 200 and r.json() == first

        for changed in ({"arguments": {"order": "k-1", "amount": 101}}, {"tool": "refund_all"}):
            r = await client.post("/v1/intents", json=body("k-1", **changed), headers=auth("gateway"))
            assert r.status_code == 409, r.text
            assert r.json()["error"]["code"] == "idempotency_conflict"
            assert first["intent_id"] in r.json()["error"]["message"]
        # Keys are per agent: another agent's k-1 is another intent.
        other = await propose(client, "k-1", agent="a2")
        assert other["intent_id"] != first["intent_id"]

        listed = (await client.get("/v1/intents", headers=auth("viewer"))).json()["intents"]
        assert [i["intent_id"] for i in listed] == [first["intent_id"], other["intent_id"]]
        records = await audit(client, "intent.create")
        assert [(r["outcome"], r["target"]) for r in records] == [
            ("ok", first["intent_id"]),
            ("refused", "k-1"),
            ("refused", "k-1"),
            ("ok", other["intent_id"]),
        ]
        assert records[1]["detail"]["code"] == "idempotency_conflict"


async def test_bad_bodies_are_422_and_audited(tmp_path: Path) -> None:
    async with plane(sqlite(tmp_path)) as (client, _):
        for bad in (
            body("k", arguments=[1]),
            body("k", idempotency_key=""),
            body("k", run_id="no spaces"),
            body("k", extra=1),
            {"tool": "refund"},
        ):
            r = await client.post("/v1/intents", json=bad, headers=auth("gateway"))
            assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text
        raw = json.dumps(body("k")).replace('"amount": 100', '"amount": NaN')
        r = await client.post("/v1/intents", content=raw, headers=auth("gateway"))
        assert r.status_code == 422, r.text
        assert (await client.get("/v1/intents", headers=auth("operator"))).json() == {"intents": []}
        assert {r["outcome"] for r in await audit(client, "intent.create")} == {"refused"}
        assert len(await audit(client, "intent.create")) == 6


@pytest.mark.parametrize("leases", [True, False], ids=["lease-mirror", "own-mirror"])
async def test_an_active_stop_refuses_new_intents_and_records_nothing(
    store: dict[str, Any], leases: bool
) -> None:
    async with plane(store, leases) as (client, _):
        before = await propose(client, "k-before", needs_approval=True)
        stop = await issue(client, "agent:a1")
        for key, overrides in (("k-new", {}), ("k-run", {"run_id": None})):
            r = await client.post("/v1/intents", json=body(key, **overrides), headers=auth("gateway"))
            assert r.status_code == 409, r.text
            error = r.json()["error"]
            assert (error["code"], error["scope"], error["stop_id"], error["reason"]) == (
                "stopped",
                "agent:a1",
                stop["stop_id"],
                "runaway",
            )
        # A repeat of a call recorded before the stop answers the record: cancelled by the stop.
        r = await client.post(
            "/v1/intents", json=body("k-before", needs_approval=True), headers=auth("gateway")
        )
        assert r.status_code == 200 and r.json()["intent_id"] == before["intent_id"]
        assert (r.json()["state"], r.json()["stop_id"]) == ("cancelled", stop["stop_id"])
        # Another agent is not stopped.
        assert (await propose(client, "k-new", agent="a2"))["state"] == "pending"
        listed = (await client.get("/v1/intents", headers=auth("operator"))).json()["intents"]
        assert [i["idempotency_key"] for i in listed] == ["k-before", "k-new"]
        assert [i["agent"] for i in listed] == ["a1", "a2"]
        refused = [r for r in await audit(client, "intent.create") if r["outcome"] == "refused"]
        assert [(r["target"], r["detail"]["code"]) for r in refused] == [
            ("k-new", "stopped"),
            ("k-run", "stopped"),
        ]


# -- the executor -------------------------------------------------------------------------------


async def test_only_the_claiming_executor_commits_or_fails(store: dict[str, Any]) -> None:
    async with plane(store) as (client, _):
        one, two = await propose(client, "k-1"), await propose(client, "k-2")
        r = await claim(client)
        assert r.status_code == 200
        claimed = r.json()
        assert (claimed["intent_id"], claimed["state"], claimed["claimed_by"]) == (
            one["intent_id"],
            "claimed",
            "executor-1",
        )
        r = await settle(client, one["intent_id"], "commit", "executor-2", outcome={"refund": "re_1"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "invalid_transition"
        assert "executor-2" in r.json()["error"]["message"]
        r = await settle(client, one["intent_id"], "commit", outcome={"refund": "re_1"})
        assert r.status_code == 200, r.text
        assert (r.json()["state"], r.json()["outcome"]) == ("committed", {"refund": "re_1"})
        r = await settle(client, one["intent_id"], "fail", error="late")
        assert r.status_code == 409 and r.json()["error"]["code"] == "invalid_transition"

        r = await claim(client, "executor-2")
        assert r.status_code == 200 and r.json()["intent_id"] == two["intent_id"]
        r = await settle(client, two["intent_id"], "fail", "executor-2", error="card declined")
        assert r.status_code == 200 and (r.json()["state"], r.json()["error"]) == ("failed", "card declined")
        assert (await claim(client)).status_code == 204  # nothing pending

        r = await settle(client, "int_nope", "commit", outcome={})
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_intent"
        for payload in ({"outcome": "ok"}, {"error": ""}):
            action = "commit" if "outcome" in payload else "fail"
            r = await settle(client, two["intent_id"], action, **payload)
            assert r.status_code == 422, r.text
        records = [
            (r["action"], r["actor"], r["outcome"])
            for r in (await client.get("/v1/audit", headers=auth("operator"))).json()["records"]
            if r["action"] in ("intent.claim", "intent.commit", "intent.fail")
        ]
        assert records == [
            ("intent.claim", "executor-1", "ok"),
            ("intent.commit", "executor-2", "refused"),
            ("intent.commit", "executor-1", "ok"),
            ("intent.fail", "executor-1", "refused"),
            ("intent.claim", "executor-2", "ok"),
            ("intent.fail", "executor-2", "ok"),
            ("intent.commit", "executor-1", "refused"),
            ("intent.commit", "executor-1", "refused"),
            ("intent.fail", "executor-1", "refused"),
        ]


async def test_a_restarted_executor_marks_its_claims_unknown_then_settles_them(store: dict[str, Any]) -> None:
    async with plane(store) as (client, _):
        one, two, three = [await propose(client, k) for k in ("k-1", "k-2", "k-3")]
        await claim(client)
        await claim(client)
        await claim(client, "executor-2")
        # executor-1 restarts after a crash: what it had claimed is now unknown, not others'.
        r = await client.post("/v1/intents/unknown", headers=auth("executor"))
        assert r.status_code == 200, r.text
        assert [(i["intent_id"], i["state"]) for i in r.json()["intents"]] == [
            (one["intent_id"], "unknown"),
            (two["intent_id"], "unknown"),
        ]
        assert (await get(client, three["intent_id"]))["state"] == "claimed"
        # Unknown intents are not claimed again: they are resolved with their idempotency key.
        assert (await claim(client)).status_code == 204
        r = await settle(client, one["intent_id"], "commit", "executor-2", outcome={})
        assert r.status_code == 409
        r = await settle(client, one["intent_id"], "commit", outcome={"refund": "re_1", "replayed": True})
        assert r.status_code == 200 and r.json()["state"] == "committed"
        r = await settle(client, two["intent_id"], "fail", error="declined on re-issue")
        assert r.status_code == 200 and r.json()["state"] == "failed"
        r = await client.post("/v1/intents/unknown", headers=auth("executor"))
        assert r.json() == {"intents": []}
        records = await audit(client, "intent.unknown")
        assert [(r["target"], r["detail"]["intents"]) for r in records] == [
            ("executor-1", [one["intent_id"], two["intent_id"]]),
            ("executor-1", []),
        ]


# -- approvals ----------------------------------------------------------------------------------


async def test_an_intent_needing_approval_waits_for_an_operator(store: dict[str, Any]) -> None:
    async with plane(store) as (client, _):
        wait = await propose(client, "k-1", needs_approval=True)
        nope = await propose(client, "k-2", needs_approval=True)
        assert wait["state"] == nope["state"] == "awaiting_approval"
        assert (await claim(client)).status_code == 204  # not claimable before approval

        r = await settle(client, wait["intent_id"], "approve", "operator")
        assert r.status_code == 200, r.text
        assert (r.json()["state"], r.json()["decided_by"]) == ("pending", "operator-1")
        r = await claim(client)
        assert r.status_code == 200 and r.json()["intent_id"] == wait["intent_id"]

        r = await settle(client, nope["intent_id"], "reject", "operator", reason="  ")
        assert r.status_code == 422, r.text
        r = await settle(client, nope["intent_id"], "reject", "operator", reason="not a refund case")
        assert r.status_code == 200, r.text
        assert (r.json()["state"], r.json()["decision_reason"]) == ("rejected", "not a refund case")
        for action, payload in (("approve", {}), ("reject", {"reason": "again"})):
            r = await settle(client, nope["intent_id"], action, "operator", **payload)
            assert r.status_code == 409 and r.json()["error"]["code"] == "invalid_transition", r.text
        r = await settle(client, "int_nope", "approve", "operator")
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_intent"
        assert (await claim(client)).status_code == 204  # a rejected intent never becomes pending
        outcomes = [
            (r["action"], r["outcome"])
            for r in (await client.get("/v1/audit", headers=auth("viewer"))).json()["records"]
            if r["action"] in ("intent.approve", "intent.reject")
        ]
        assert outcomes == [
            ("intent.approve", "ok"),
            ("intent.reject", "refused"),
            ("intent.reject", "ok"),
            ("intent.approve", "refused"),
            ("intent.reject", "refused"),
            ("intent.approve", "refused"),
        ]


# -- stops --------------------------------------------------------------------------------------


async def test_a_stop_cancels_exactly_the_intents_it_covers_whose_call_was_not_made(
    store: dict[str, Any],
) -> None:
    async with plane(store) as (client, _):
        checked = await propose(client, "k-checked")
        assert (await claim(client)).json()["intent_id"] == checked["intent_id"]
        assert (await settle(client, checked["intent_id"], "check")).status_code == 200
        claimed = await propose(client, "k-claimed")
        assert (await claim(client)).json()["intent_id"] == claimed["intent_id"]
        committed = await propose(client, "k-done")
        assert (await claim(client)).json()["intent_id"] == committed["intent_id"]
        await settle(client, committed["intent_id"], "commit", outcome={})
        pending = await propose(client, "k-pending")
        awaiting = await propose(client, "k-awaiting", needs_approval=True)
        other_run = await propose(client, "k-other", run_id="r-2")
        no_run = await propose(client, "k-none", run_id=None)

        stop = await issue(client, "run:r-1")
        # Answered after the cancellation: it is visible at once.
        states = {
            i["idempotency_key"]: (i["state"], i["stop_id"])
            for i in (await client.get("/v1/intents", headers=auth("viewer"))).json()["intents"]
        }
        assert states == {
            "k-checked": ("claimed", None),  # passed its final check: its call may be made
            "k-claimed": ("cancelled", stop["stop_id"]),  # claimed, never checked: not made
            "k-pending": ("cancelled", stop["stop_id"]),
            "k-awaiting": ("cancelled", stop["stop_id"]),
            "k-other": ("pending", None),
            "k-none": ("pending", None),
            "k-done": ("committed", None),
        }
        records = await audit(client, "intent.cancel")
        assert len(records) == 1
        assert (records[0]["target"], records[0]["actor"], records[0]["outcome"]) == (
            "run:r-1",
            "operator-1",
            "ok",
        )
        assert records[0]["detail"] == {
            "stop_id": stop["stop_id"],
            "intents": [claimed["intent_id"], pending["intent_id"], awaiting["intent_id"]],
        }
        # A cancelled intent is neither approved nor claimed.
        r = await settle(client, awaiting["intent_id"], "approve", "operator")
        assert r.status_code == 409
        assert (await claim(client)).json()["intent_id"] == other_run["intent_id"]
        assert (await settle(client, other_run["intent_id"], "check")).status_code == 200

        # A tenant stop reaches the run-less intent, not the checked one; a stop covering
        # nothing adds no record.
        await issue(client, "tool:lookup")
        assert len(await audit(client, "intent.cancel")) == 1
        tenant = await issue(client, "tenant:acme")
        assert (await get(client, no_run["intent_id"]))["stop_id"] == tenant["stop_id"]
        assert (await get(client, other_run["intent_id"]))["state"] == "claimed"
        assert [r["detail"]["intents"] for r in await audit(client, "intent.cancel")][1] == [
            no_run["intent_id"]
        ]


async def test_no_intent_stays_pending_under_a_stop_issued_while_intents_are_recorded(
    store: dict[str, Any],
) -> None:
    """Intents recorded concurrently with a stop: each is refused, or cancelled by the stop
    (by its hook, or by the create's second look when the stop landed between check and
    insert); none is left pending for the executor to claim."""
    async with plane(store) as (client, _):
        answers: list[httpx2.Response] = []

        async def record(n: int) -> None:
            await anyio.sleep(n * 0.002)
            answers.append(await client.post("/v1/intents", json=body(f"k-{n}"), headers=auth("gateway")))

        async with anyio.create_task_group() as tg:
            for n in range(40):
                tg.start_soon(record, n)
            await anyio.sleep(0.03)
            stop = await issue(client, "tool:refund")
        assert {r.status_code for r in answers} <= {201, 409}
        listed = (await client.get("/v1/intents", headers=auth("operator"))).json()["intents"]
        assert len(listed) == sum(r.status_code == 201 for r in answers)
        assert {(i["state"], i["stop_id"]) for i in listed} <= {("cancelled", stop["stop_id"])}
        assert (await claim(client)).status_code == 204
        # What each 201 said agrees with the record now, but for a stop landing after its answer.
        states = {i["intent_id"]: i["state"] for i in listed}
        for r in answers:
            if r.status_code == 201:
                assert (
                    r.json()["state"] in ("pending", "cancelled")
                    and states[r.json()["intent_id"]] == "cancelled"
                )


# -- reading --------------------------------------------------------------------------------------


async def test_lists_filter_by_run_state_and_limit(store: dict[str, Any]) -> None:
    async with plane(store) as (client, _):
        a = await propose(client, "k-a")
        b = await propose(client, "k-b", run_id="r-2")
        c = await propose(client, "k-c", needs_approval=True)
        await claim(client)  # a

        async def ids(**params: Any) -> list[str]:
            r = await client.get("/v1/intents", params=params, headers=auth("executor"))
            assert r.status_code == 200, r.text
            return [i["intent_id"] for i in r.json()["intents"]]

        assert await ids() == [a["intent_id"], b["intent_id"], c["intent_id"]]
        assert await ids(run="r-1") == [a["intent_id"], c["intent_id"]]
        assert await ids(state="pending") == [b["intent_id"]]
        assert await ids(state="claimed,awaiting_approval") == [a["intent_id"], c["intent_id"]]
        assert await ids(run="r-1", state="pending") == []
        assert await ids(limit="2") == [a["intent_id"], b["intent_id"]]
        r = await client.get("/v1/intents?state=claimed&state=pending", headers=auth("gateway"))
        assert [i["intent_id"] for i in r.json()["intents"]] == [a["intent_id"], b["intent_id"]]
        for params in ({"state": "done"}, {"limit": "0"}, {"limit": "x"}, {"limit": "1001"}):
            r = await client.get("/v1/intents", params=params, headers=auth("operator"))
            assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", params


async def test_an_agent_reads_only_its_own_intents(tmp_path: Path) -> None:
    async with plane(sqlite(tmp_path)) as (client, _):
        mine, theirs = await propose(client, "k-1"), await propose(client, "k-1", agent="a2", tenant="beta")
        assert (await get(client, mine["intent_id"], "agent")) == mine
        # agent-2 is of another tenant: agent-1's intent answers as unknown (test_tenant_runs.py).
        r = await client.get(f"/v1/intents/{mine['intent_id']}", headers=auth("agent-2"))
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_intent"
        assert (await get(client, theirs["intent_id"], "agent-2")) == theirs
        r = await client.get("/v1/intents/int_nope", headers=auth("agent"))
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_intent"


# -- role matrix ----------------------------------------------------------------------------------

ALLOWED = {
    "create": {"gateway"},
    "list": {"operator", "viewer", "executor", "gateway"},
    "read": {"operator", "viewer", "executor", "gateway", "agent"},
    "claim": {"executor"},
    "commit": {"executor"},
    "fail": {"executor"},
    "unknown": {"executor"},
    "approve": {"operator"},
    "reject": {"operator"},
}


async def test_every_intent_endpoint_against_every_role_and_no_token(tmp_path: Path) -> None:
    ok = {"create": 201}
    async with plane(sqlite(tmp_path)) as (client, _):
        got, want = {}, {}
        n = 0
        for endpoint, allowed in ALLOWED.items():
            for role in (*ROLES, None):
                n += 1
                intent = await propose(client, f"k-{n}", needs_approval=endpoint in ("approve", "reject"))
                if endpoint in ("commit", "fail"):  # one claimed by executor-1 (the oldest pending)
                    intent = (await claim(client)).json()
                path = f"/v1/intents/{intent['intent_id']}"
                calls: dict[str, tuple[str, str, dict[str, Any] | None]] = {
                    "create": ("POST", "/v1/intents", body(f"k-new-{n}")),
                    "list": ("GET", "/v1/intents", None),
                    "read": ("GET", path, None),
                    "claim": ("POST", "/v1/intents/claim", None),
                    "commit": ("POST", f"{path}/commit", {"outcome": {}}),
                    "fail": ("POST", f"{path}/fail", {"error": "e"}),
                    "unknown": ("POST", "/v1/intents/unknown", None),
                    "approve": ("POST", f"{path}/approve", None),
                    "reject": ("POST", f"{path}/reject", {"reason": "no"}),
                }
                method, url, payload = calls[endpoint]
                r = await client.request(method, url, json=payload, headers=auth(role))
                got[endpoint, role] = r.status_code
                want[endpoint, role] = (
                    ok.get(endpoint, 200) if role in allowed else (401 if role is None else 403)
                )
                if endpoint == "claim" and r.status_code == 200:
                    await settle(client, r.json()["intent_id"], "commit", outcome={})
        assert got == want
        # Refused writes by known callers are audited; reads and unauthenticated calls are not.
        refused = {
            (r["action"], r["role"])
            for r in (await client.get("/v1/audit", headers=auth("operator"))).json()["records"]
            if r["outcome"] == "refused"
        }
        assert ("intent.approve", "viewer") in refused and ("intent.claim", "gateway") in refused
        assert not any(action in ("intent.read", "intents.list") for action, _ in refused)


# -- the CLI --------------------------------------------------------------------------------------


async def test_cli_intents_approve_and_reject(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with plane(sqlite(tmp_path)) as (client, _):
        monkeypatch.setenv("HALTWIRE_CONTROL_URL", str(client.base_url).rstrip("/"))
        monkeypatch.setenv("HALTWIRE_TOKEN", TOKEN["operator"])
        wait = await propose(client, "k-1", needs_approval=True)
        nope = await propose(client, "k-2", needs_approval=True, run_id="r-2")

        assert await cli("intents") == 0
        out = capsys.readouterr().out
        assert wait["intent_id"] in out and nope["intent_id"] in out and "awaiting_approval" in out
        assert await cli("intents", "--run", "r-2", "--json") == 0
        assert [i["intent_id"] for i in json.loads(capsys.readouterr().out)] == [nope["intent_id"]]

        assert await cli("approve", wait["intent_id"]) == 0
        assert "now pending" in capsys.readouterr().out
        assert await cli("reject", nope["intent_id"], "--reason", "not a refund case") == 0
        assert f"rejected {nope['intent_id']}" in capsys.readouterr().out
        assert await cli("intents", "--json") == 0
        assert [(i["state"], i["decision_reason"]) for i in json.loads(capsys.readouterr().out)] == [
            ("pending", None),
            ("rejected", "not a refund case"),
        ]

        assert await cli("approve", nope["intent_id"]) == 1  # already rejected
        assert "409" in capsys.readouterr().err
        assert await cli("approve", wait["intent_id"], "--token", TOKEN["viewer"]) == 1
        assert "needs role operator" in capsys.readouterr().err
        assert await cli("intents", "--run", "r-9") == 0
        assert "no intents in run r-9" in capsys.readouterr().out
        with pytest.raises(SystemExit) as exc:
            await cli("reject", wait["intent_id"])  # no --reason
        assert exc.value.code == 2


# -- the OpenAPI document ---------------------------------------------------------------------------


async def test_intent_responses_match_the_document(tmp_path: Path) -> None:
    from openapi_harness import conforms

    one, settle_path = "/v1/intents/{intent_id}", "/v1/intents/{intent_id}/{action}"
    async with plane(sqlite(tmp_path)) as (client, _):

        async def check(r: httpx2.Response, method: str, path: str, status: int) -> Any:
            assert r.status_code == status, (path, r.text)
            return conforms(r, method, path)

        async def post(key: str, **overrides: Any) -> httpx2.Response:
            return await client.post("/v1/intents", json=body(key, **overrides), headers=auth("gateway"))

        created = await check(await post("k-1"), "post", "/v1/intents", 201)
        assert (await check(await post("k-1"), "post", "/v1/intents", 200)) == created
        r = await post("k-1", tool="other")
        assert (await check(r, "post", "/v1/intents", 409))["error"]["code"] == "idempotency_conflict"
        assert (await check(await post("k-2", tool=""), "post", "/v1/intents", 422))["error"]
        r = await client.post("/v1/intents", json=body("k-3"), headers=auth("operator"))
        assert (await check(r, "post", "/v1/intents", 403))["error"]["needed_roles"] == ["gateway"]
        waiting = await check(await post("k-4", needs_approval=True), "post", "/v1/intents", 201)

        claimed = await check(await claim(client), "post", "/v1/intents/claim", 200)
        assert claimed["intent_id"] == created["intent_id"]
        r = await claim(client)
        assert r.status_code == 204 and not r.content
        assert "204" in document()["paths"]["/v1/intents/claim"]["post"]["responses"]
        r = await client.post("/v1/intents/unknown", headers=auth("executor"))
        assert (await check(r, "post", "/v1/intents/unknown", 200))["intents"][0]["state"] == "unknown"
        for action, who, payload, status in (
            ("commit", "executor", {"outcome": {"ok": True}}, 200),
            ("fail", "executor", {"error": "late"}, 409),
            ("approve", "operator", None, 200),
            ("reject", "operator", {"reason": "late"}, 409),
        ):
            target = created if action in ("commit", "fail") else waiting
            r = await client.post(
                f"/v1/intents/{target['intent_id']}/{action}", json=payload, headers=auth(who)
            )
            await check(r, "post", settle_path.replace("{action}", action), status)
        r = await client.post("/v1/intents/int_nope/fail", json={"error": "x"}, headers=auth("executor"))
        assert (await check(r, "post", "/v1/intents/{intent_id}/fail", 404))["error"][
            "code"
        ] == "unknown_intent"

        r = await client.get(f"/v1/intents/{created['intent_id']}", headers=auth("agent"))
        assert (await check(r, "get", one, 200))["state"] == "committed"
        r = await client.get(f"/v1/intents/{created['intent_id']}", headers=auth("agent-2"))
        await check(r, "get", one, 404)  # another tenant's: answered as unknown
        r = await client.get("/v1/intents", params={"state": "committed"}, headers=auth("viewer"))
        assert len((await check(r, "get", "/v1/intents", 200))["intents"]) == 1
        r = await client.get("/v1/intents", params={"state": "nope"}, headers=auth("viewer"))
        await check(r, "get", "/v1/intents", 422)

        stop = await issue(client, "tool:refund")
        error = (await check(await post("k-5"), "post", "/v1/intents", 409))["error"]
        assert (error["code"], error["stop_id"]) == ("stopped", stop["stop_id"])


@pytest.mark.parametrize("examples", SCHEMATHESIS_EXAMPLES)
@pytest.mark.parametrize("role", ["gateway", "executor"])
async def test_schemathesis_finds_no_failure_in_the_intent_endpoints(
    tmp_path: Path, role: str, examples: str
) -> None:
    """The intents' own roles (test_openapi.py runs every operation as operator, tripwire and
    agent): recording, claiming and settling through the fuzzer, with intents to claim. 4
    fuzzed cases per operation in the default run, 10 in the soak variant (``-m soak``)."""
    from openapi_harness import schemathesis

    async with plane(sqlite(tmp_path)) as (client, _):
        for n in range(5):
            await propose(client, f"k-{n}")
        url = str(client.base_url).rstrip("/")
        args = (
            "--include-path-regex",
            "^/v1/intents",
            "--max-examples",
            examples,
            "--phases",
            "coverage,fuzzing",
        )
        code, output = await schemathesis(tmp_path, url, role, f"{url}/openapi.json", *args)
    assert code == 0, output
    found = re.search(r"Selected: (\d+)/(\d+)\s+Tested: (\d+)", output)
    assert found is not None, output
    assert int(found[1]) == int(found[3]) == 10, output


async def test_the_final_check_is_the_backstop_for_a_stop_that_did_not_cancel(store: dict[str, Any]) -> None:
    """A stop written to the registry without the API's cancelling (as when that cancelling
    failed): the claimed intent is still cancelled by the executor's check, not performed."""
    import time

    async with plane(store) as (client, stores):
        intent = await propose(client, "k-1")
        assert (await claim(client)).json()["intent_id"] == intent["intent_id"]
        stop = await stores.registry.issue_stop("run:r-1", "refund loop", "operator-1", now=time.time())
        assert (await get(client, intent["intent_id"]))["state"] == "claimed"
        r = await settle(client, intent["intent_id"], "check")
        assert r.status_code == 409, r.text
        error = r.json()["error"]
        assert (error["code"], error["stop_id"], error["scope"]) == ("stopped", stop.stop_id, "run:r-1")
        cancelled = await get(client, intent["intent_id"])
        assert (cancelled["state"], cancelled["stop_id"], cancelled["checked_revision"]) == (
            "cancelled",
            stop.stop_id,
            None,
        )
        cancels = [
            rec
            for rec in (await client.get("/v1/audit", headers=auth("operator"))).json()["records"]
            if rec["action"] == "intent.cancel"
        ]
        assert [c["detail"]["intents"] for c in cancels] == [[intent["intent_id"]]]
