"""Run reports through a real control plane on loopback, against SQLite and PostgreSQL.

A run with intents in every state (recorded by the gateway, settled by two executors, one of
them restarted, cancelled by a stop, approved or rejected by an operator) reports each intent
in exactly its section; the stops that hit it with who issued and cleared them and why, and
not a stop on another run; its audit timeline in seq order, without the other run's records.
Then the CLI (sections, ``--json`` equal to the API, exit codes), the role matrix and the
OpenAPI document.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest

from control_harness import ROLES, TOKEN, cli
from intents_harness import auth, claim, get, issue, plane, propose, settle, sqlite
from openapi_harness import conforms

pytestmark = pytest.mark.anyio

SECTIONS = ("completed", "unknown", "failed", "cancelled", "awaiting_approval", "pending", "rejected")


async def register(client: httpx2.AsyncClient, run_id: str) -> None:
    r = await client.post("/v1/runs", json={"run_id": run_id}, headers=auth("agent"))
    assert r.status_code == 201, r.text


async def report(client: httpx2.AsyncClient, run_id: str, who: str = "operator") -> dict[str, Any]:
    r = await client.get(f"/v1/runs/{run_id}/report", headers=auth(who))
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


async def scenario(client: httpx2.AsyncClient) -> dict[str, Any]:
    """Run r-1 with an intent in every state, run r-2 stopped beside it; what was recorded."""
    await register(client, "r-1")
    await register(client, "r-2")
    ids: dict[str, str] = {}

    async def claimed(key: str, who: str = "executor") -> str:
        ids[key] = (await propose(client, key))["intent_id"]
        r = await claim(client, who)
        assert r.status_code == 200 and r.json()["intent_id"] == ids[key], r.text
        return ids[key]

    r = await settle(client, await claimed("k-done"), "commit", outcome={"refund": "re_1"})
    assert r.status_code == 200, r.text
    r = await settle(client, await claimed("k-fail"), "fail", error="card declined")
    assert r.status_code == 200, r.text
    # Checked, so their calls may have been made: the stop below leaves them in flight.
    await claimed("k-flight", "executor-2")  # executor-2 restarts: its claim becomes unknown
    assert (await settle(client, ids["k-flight"], "check", who="executor-2")).status_code == 200
    r = await client.post("/v1/intents/unknown", headers=auth("executor-2"))
    assert [i["intent_id"] for i in r.json()["intents"]] == [ids["k-flight"]]
    await claimed("k-claimed")  # claimed, no outcome yet: in flight too
    assert (await settle(client, ids["k-claimed"], "check")).status_code == 200

    # The other run: its intent cancelled by its own stop, its lease refused.
    ids["other"] = (await propose(client, "k-other", run_id="r-2"))["intent_id"]
    other_stop = await issue(client, "run:r-2", "another run's loop")
    assert (await client.post("/v1/runs/r-2/lease", headers=auth("agent"))).status_code == 409

    ids["k-cancel"] = (await propose(client, "k-cancel"))["intent_id"]
    stop = await issue(client, "run:r-1", "refund loop")
    assert (await get(client, ids["k-cancel"]))["stop_id"] == stop["stop_id"]
    assert (await client.post("/v1/runs/r-1/lease", headers=auth("agent"))).status_code == 409
    r = await client.post(
        f"/v1/stops/{stop['stop_id']}/clear", json={"reason": "refunds reviewed"}, headers=auth("operator")
    )
    assert r.status_code == 200, r.text

    ids["k-wait"] = (await propose(client, "k-wait", needs_approval=True))["intent_id"]
    ids["k-nope"] = (await propose(client, "k-nope", needs_approval=True))["intent_id"]
    r = await settle(client, ids["k-nope"], "reject", who="operator", reason="not a refund case [/policy]")
    assert r.status_code == 200, r.text
    ids["k-pending"] = (await propose(client, "k-pending"))["intent_id"]
    return {"ids": ids, "stop": stop, "other_stop": other_stop}


async def test_a_report_has_each_intent_in_its_section_the_stops_and_the_timeline(
    store: dict[str, Any],
) -> None:
    async with plane(store) as (client, _):
        done = await scenario(client)
        ids, stop = done["ids"], done["stop"]
        got = await report(client, "r-1")

        assert got["run"] == (await client.get("/v1/runs/r-1", headers=auth("operator"))).json()
        want = {
            "completed": ["k-done"],
            "unknown": ["k-flight", "k-claimed"],  # oldest first
            "failed": ["k-fail"],
            "cancelled": ["k-cancel"],
            "awaiting_approval": ["k-wait"],
            "pending": ["k-pending"],
            "rejected": ["k-nope"],
        }
        assert {s: [i["intent_id"] for i in got[s]] for s in SECTIONS} == {
            s: [ids[k] for k in keys] for s, keys in want.items()
        }
        # Derived, not restated: each intent is what the intent endpoint answers.
        for section in SECTIONS:
            for intent in got[section]:
                assert intent == await get(client, intent["intent_id"])
        assert [i["state"] for i in got["unknown"]] == ["unknown", "claimed"]
        assert got["completed"][0]["outcome"] == {"refund": "re_1"}
        assert got["cancelled"][0]["stop_id"] == stop["stop_id"]
        assert got["rejected"][0]["decision_reason"] == "not a refund case [/policy]"

        # The stop that hit the run, who issued and cleared it and why; not the other run's.
        assert [s["stop_id"] for s in got["stops"]] == [stop["stop_id"]]
        (hit,) = got["stops"]
        assert (hit["scope"], hit["issued_by"], hit["reason"]) == ("run:r-1", "operator-1", "refund loop")
        assert (hit["cleared"], hit["cleared_by"], hit["clear_reason"]) == (
            True,
            "operator-1",
            "refunds reviewed",
        )

        # The timeline: the audit records about r-1, in seq order, field for field.
        records = {
            r["seq"]: r for r in (await client.get("/v1/audit", headers=auth("operator"))).json()["records"]
        }
        timeline = got["timeline"]
        seqs = [t["seq"] for t in timeline]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        for t in timeline:
            record = records[t["seq"]]
            assert t == {k: record[k] for k in t if k != "drill"} | {"drill": record["detail"].get("drill") is True}
            assert set(t) == {"seq", "at", "actor", "role", "action", "target", "outcome", "reason", "malformed", "drill"}
            assert t["drill"] is False  # no drill identity here (test_drill_data.py has them)
        steps = [(t["action"], t["target"], t["outcome"]) for t in timeline]
        i = ids
        assert steps == [
            ("run.register", "r-1", "ok"),
            ("intent.create", i["k-done"], "ok"),
            ("intent.claim", i["k-done"], "ok"),
            ("intent.commit", i["k-done"], "ok"),
            ("intent.create", i["k-fail"], "ok"),
            ("intent.claim", i["k-fail"], "ok"),
            ("intent.fail", i["k-fail"], "ok"),
            ("intent.create", i["k-flight"], "ok"),
            ("intent.claim", i["k-flight"], "ok"),
            ("intent.check", i["k-flight"], "ok"),
            ("intent.unknown", "executor-2", "ok"),
            ("intent.create", i["k-claimed"], "ok"),
            ("intent.claim", i["k-claimed"], "ok"),
            ("intent.check", i["k-claimed"], "ok"),
            ("intent.create", i["k-cancel"], "ok"),
            ("stop.issue", "run:r-1", "ok"),
            ("intent.cancel", "run:r-1", "ok"),
            ("lease.renew", "run:r-1", "refused"),
            ("stop.clear", stop["stop_id"], "ok"),
            ("intent.create", i["k-wait"], "ok"),
            ("intent.create", i["k-nope"], "ok"),
            ("intent.reject", i["k-nope"], "ok"),
            ("intent.create", i["k-pending"], "ok"),
        ]
        # None of the other run's records: its registration, intent, stop, cancel, refusal.
        other = {"r-2", "run:r-2", i["other"], done["other_stop"]["stop_id"]}
        assert not [t for t in timeline if t["target"] in other]
        assert len(records) - len(timeline) == 5

        # The other run's report has its own stop and intent only.
        theirs = await report(client, "r-2")
        assert [s["stop_id"] for s in theirs["stops"]] == [done["other_stop"]["stop_id"]]
        assert [x["intent_id"] for x in theirs["cancelled"]] == [i["other"]]
        assert sum(len(theirs[s]) for s in SECTIONS) == 1

        # Reading the report is not audited: it wrote nothing.
        assert len((await client.get("/v1/audit", headers=auth("operator"))).json()["records"]) == len(
            records
        )


async def test_stops_on_the_runs_agent_tenant_version_and_global_hit_it(tmp_path: Path) -> None:
    async with plane(sqlite(tmp_path)) as (client, _):
        await register(client, "r-1")
        await register(client, "r-2")  # the same agent's other run
        theirs = await propose(client, "k-2", run_id="r-2")
        hits = [
            await issue(client, scope, f"why {scope}")
            for scope in ("agent:a1", "tenant:acme", "version:a1@2.1", "global")
        ]
        for scope in ("agent:a2", "tenant:beta", "version:a1@9", "run:r-9"):
            await issue(client, scope, "elsewhere")
        # The first stop cancels r-2's intent, and refuses r-2's lease: records of a stop that
        # hit r-1, but about r-2 only.
        assert (await get(client, theirs["intent_id"]))["stop_id"] == hits[0]["stop_id"]
        assert (await client.post("/v1/runs/r-2/lease", headers=auth("agent"))).status_code == 409
        for hit in hits:
            r = await client.post(
                f"/v1/stops/{hit['stop_id']}/clear", json={"reason": "ok"}, headers=auth("operator")
            )
            assert r.status_code == 200, r.text
        # A tool stop covers no run, but it hit this one by cancelling one of its intents.
        intent = await propose(client, "k-1")
        tool = await issue(client, "tool:refund", "refunds paused")
        assert (await get(client, intent["intent_id"]))["stop_id"] == tool["stop_id"]
        got = await report(client, "r-1")
        assert [s["stop_id"] for s in got["stops"]] == [s["stop_id"] for s in (*hits, tool)]
        assert [s["reason"] for s in got["stops"]] == [
            "why agent:a1",
            "why tenant:acme",
            "why version:a1@2.1",
            "why global",
            "refunds paused",
        ]
        issued = [t["target"] for t in got["timeline"] if t["action"] == "stop.issue"]
        assert issued == ["agent:a1", "tenant:acme", "version:a1@2.1", "global", "tool:refund"]
        actions = [t["action"] for t in got["timeline"]]
        assert "lease.renew" not in actions and actions.count("intent.cancel") == 1
        other = [t["action"] for t in (await report(client, "r-2"))["timeline"]]
        assert {"lease.renew", "intent.cancel"} <= set(other)
        # The agent that owns the run does not see the tool stop, as in GET /v1/stops.
        mine = await report(client, "r-1", "agent")
        assert [s["stop_id"] for s in mine["stops"]] == [s["stop_id"] for s in hits]
        steps = {(t["action"], t["target"]) for t in mine["timeline"]}
        assert ("stop.issue", "tool:refund") not in steps
        assert ("intent.cancel", "tool:refund") in steps  # it names the agent's own intent
        assert mine["cancelled"] == got["cancelled"]


# -- role matrix ----------------------------------------------------------------------------------


async def test_the_report_against_every_role_an_unknown_run_and_no_token(tmp_path: Path) -> None:
    allowed = {"operator", "viewer", "agent"}
    async with plane(sqlite(tmp_path)) as (client, _):
        await register(client, "r-1")
        got: dict[str | None, int] = {}
        for role in (*ROLES, "agent-2", None):
            r = await client.get("/v1/runs/r-1/report", headers=auth(role))
            got[role] = r.status_code
            assert conforms(r, "get", "/v1/runs/{run_id}/report")
        want: dict[str | None, int] = {role: 200 if role in allowed else 403 for role in ROLES}
        assert got == {
            **want,
            "agent-2": 404,  # another tenant's run: answered as unknown
            None: 401,
        }
        r = await client.get("/v1/runs/r-1/report", headers=auth("gateway"))
        assert r.json()["error"]["needed_roles"] == sorted(allowed)
        for who in ("operator", "agent"):
            r = await client.get("/v1/runs/r-9/report", headers=auth(who))
            assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_run", r.text
            conforms(r, "get", "/v1/runs/{run_id}/report")
        # Reads, refused ones too, write nothing to the audit log.
        records = (await client.get("/v1/audit", headers=auth("operator"))).json()["records"]
        assert [r["action"] for r in records] == ["run.register"]


# -- the CLI --------------------------------------------------------------------------------------


async def test_cli_report_prints_the_sections_and_its_json_is_the_api(
    store: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with plane(store) as (client, _):
        url = str(client.base_url).rstrip("/")
        monkeypatch.setenv("HALTWIRE_CONTROL_URL", url)
        monkeypatch.setenv("HALTWIRE_TOKEN", TOKEN["viewer"])
        done = await scenario(client)
        ids, stop = done["ids"], done["stop"]
        # A gateway had two of the run's calls in flight when the stop came: it cut one.
        now = time.time()
        calls = [
            {"call_id": "call_cut", "tool": "read_sleep", "label": "cancellable", "outcome": "cancelled"},
            {"call_id": "call_let", "tool": "job_sleep", "label": "bounded", "outcome": "completed"},
        ]
        times = {"stop_id": stop["stop_id"], "started_at": now - 2, "stopped_at": now - 1, "ended_at": now}
        r = await client.post(
            "/v1/runs/r-1/calls", json={"calls": [{**c, **times} for c in calls]}, headers=auth("gateway")
        )
        assert r.status_code == 200, r.text
        capsys.readouterr()

        assert await cli("report", "r-1", "--json") == 0
        assert json.loads(capsys.readouterr().out) == await report(client, "r-1")

        assert await cli("report", "r-1") == 0
        out = capsys.readouterr().out
        titles = [
            "Completed actions (1)",
            "In flight, outcome unknown (2)",
            "Failed (1)",
            "Cancelled (1)",
            "Calls in flight when a stop came (2)",
            "Awaiting approval (1)",
            "Pending (1)",
            "Rejected (1)",
            "Stops (1)",
            "Timeline (25)",
        ]
        at = [out.index(t) for t in titles]
        assert at == sorted(at), out
        assert out.startswith("run r-1  agent a1@2.1  tenant acme"), out
        for key in ("k-done", "k-flight", "k-claimed", "k-fail", "k-cancel", "k-wait", "k-pending", "k-nope"):
            assert ids[key] in out
        assert ids["other"] not in out and done["other_stop"]["stop_id"] not in out
        # The cancelled intent names its stop, and the stop who issued and cleared it and why.
        cancelled = out[out.index("Cancelled (1)") : out.index("Awaiting approval")]
        assert stop["stop_id"] in cancelled and "operator-1: refund loop" in cancelled
        in_flight = out[out.index("Calls in flight") : out.index("Awaiting approval")]
        for text in ("call_cut", "read_sleep", "cut it", "call_let", "let it finish: completed"):
            assert text in in_flight, in_flight
        stops = out[out.index("Stops (1)") : out.index("Timeline")]
        for text in ("run:r-1", "operator-1", "refund loop", "cleared by operator-1", "refunds reviewed"):
            assert text in stops, stops
        assert "card declined" in out and "not a refund case [/policy]" in out

        assert await cli("report", "r-9") == 1
        assert "404: no run has the id r-9" in capsys.readouterr().err
        assert await cli("report", "r-1", "--token", TOKEN["gateway"]) == 1
        assert "needs role" in capsys.readouterr().err
        monkeypatch.delenv("HALTWIRE_TOKEN")
        assert await cli("report", "r-1") == 2
    # The control plane is gone: unreachable.
    assert await cli("report", "r-1", "--url", url, "--token", TOKEN["viewer"]) == 3
    assert "cannot reach" in capsys.readouterr().err


async def test_an_empty_run_reports_empty_sections_and_its_registration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with plane(sqlite(tmp_path)) as (client, _):
        await register(client, "r-1")
        got = await report(client, "r-1", "agent")
        assert all(got[s] == [] for s in (*SECTIONS, "stops", "calls"))
        assert [t["action"] for t in got["timeline"]] == ["run.register"]
        assert conforms(
            await client.get("/v1/runs/r-1/report", headers=auth("viewer")), "get", "/v1/runs/{run_id}/report"
        ) == await report(client, "r-1", "viewer")
        monkeypatch.setenv("HALTWIRE_CONTROL_URL", str(client.base_url).rstrip("/"))
        assert await cli("report", "r-1", "--token", TOKEN["agent"]) == 0
        out = capsys.readouterr().out
        assert "Completed actions: none" in out and "Stops: none" in out and "Timeline (1)" in out
        assert "Calls in flight when a stop came: none" in out


async def test_a_call_the_stop_refused_is_in_the_runs_timeline(tmp_path: Path) -> None:
    from intents_harness import body

    async with plane(sqlite(tmp_path)) as (client, _):
        await register(client, "r-1")
        await issue(client, "run:r-1", "refund loop")
        refused = await client.post("/v1/intents", json=body("k-late", run_id="r-1"), headers=auth("gateway"))
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "stopped"
        steps = [(t["action"], t["target"], t["outcome"]) for t in (await report(client, "r-1"))["timeline"]]
        assert steps[-1] == ("intent.create", "k-late", "refused")
        # Another run's refused call is not in it.
        await register(client, "r-2")
        await issue(client, "run:r-2", "refund loop")
        await client.post("/v1/intents", json=body("k-other", run_id="r-2"), headers=auth("gateway"))
        again = [t["target"] for t in (await report(client, "r-1"))["timeline"]]
        assert "k-other" not in again


async def test_a_stop_over_before_the_run_began_did_not_hit_it_and_audit_run_lists_the_runs_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with plane(sqlite(tmp_path)) as (client, _):
        old = await issue(client, "agent:a1", "yesterday's incident")
        r = await client.post(f"/v1/stops/{old['stop_id']}/clear", json={"reason": "fixed"}, headers=auth("operator"))
        assert r.status_code == 200, r.text
        await register(client, "r-1")
        today = await issue(client, "agent:a1", "today's incident")
        got = await report(client, "r-1")
        assert [s["stop_id"] for s in got["stops"]] == [today["stop_id"]]
        assert old["stop_id"] not in json.dumps(got)
        assert [t["action"] for t in got["timeline"]] == ["run.register", "stop.issue"]

        monkeypatch.setenv("HALTWIRE_CONTROL_URL", str(client.base_url).rstrip("/"))
        monkeypatch.setenv("HALTWIRE_TOKEN", TOKEN["viewer"])
        capsys.readouterr()
        assert await cli("audit", "--run", "r-1") == 0
        lines = capsys.readouterr().out.splitlines()
        assert len(lines) == 2 and "run.register r-1" in lines[0], lines
        assert "stop.issue agent:a1" in lines[1] and "today's incident" in lines[1], lines
        assert await cli("audit", "--run", "r-1", "--json") == 0
        assert json.loads(capsys.readouterr().out) == got["timeline"]
        assert await cli("audit", "--run", "r-9") == 1
        assert "404" in capsys.readouterr().err
