"""An executor's turn (``POST /v1/intent-turns``): the outcomes of its calls settled, then its
next intents claimed and checked, in one request and one write, each intent audited as its own
routes audit it; and a stop issued before the turn keeps the intents it matches from the call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import pytest

from control_harness import auth
from executor_harness import ORDER_IDS, as_executor, control_plane, intents, propose
from stops_harness import issue

pytestmark = pytest.mark.anyio


async def audit(cp: str) -> list[dict[str, Any]]:
    async with httpx2.AsyncClient(base_url=cp, timeout=10) as http:
        r = await http.get("/v1/audit", headers=auth("operator"))
        verified = await http.get("/v1/audit/verify", headers=auth("viewer"))
    assert r.status_code == 200, r.text
    assert verified.json()["ok"] is True, verified.text
    records: list[dict[str, Any]] = r.json()["records"]
    return records


async def turn(cp: str, outcomes: list[dict[str, Any]], claim: int) -> dict[str, Any]:
    r = await as_executor(cp, "POST", "/v1/intent-turns", json={"outcomes": outcomes, "claim": claim})
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


async def test_a_turn_settles_then_claims_and_checks_the_oldest_each_audited(tmp_path: Path) -> None:
    async with control_plane(tmp_path / "control.db") as cp:
        proposed = [await propose(cp, f"k-{n}", order=ORDER_IDS[n]) for n in range(4)]
        first = await turn(cp, [], 2)
        assert first["results"] == []
        got = first["intents"]
        assert [(x["intent_id"], x["status"]) for x in got] == [(p["intent_id"], 200) for p in proposed[:2]]
        assert {x["intent"]["state"] for x in got} == {"claimed"}
        assert all(x["intent"]["checked_revision"] is not None for x in got)

        outcomes = [
            {"intent_id": got[0]["intent_id"], "outcome": {"content": [{"type": "text", "text": "done"}]}},
            {"intent_id": got[1]["intent_id"], "error": "the shop refused"},
        ]
        second = await turn(cp, outcomes, 5)
        assert [(x["status"], x["intent"]["state"]) for x in second["results"]] == [
            (200, "committed"),
            (200, "failed"),
        ]
        assert [x["intent_id"] for x in second["intents"]] == [p["intent_id"] for p in proposed[2:]]
        done = await turn(
            cp, [{"intent_id": x["intent_id"], "outcome": {"content": []}} for x in second["intents"]], 0
        )
        assert [x["status"] for x in done["results"]] == [200, 200] and done["intents"] == []
        states = await intents(cp)
        assert [states[f"k-{n}"]["state"] for n in range(4)] == [
            "committed",
            "failed",
            "committed",
            "committed",
        ]

        records = [
            (r["action"], r["target"], r["outcome"], r["detail"].get("batch")) for r in await audit(cp)
        ]
        ids = [p["intent_id"] for p in proposed]
        mine = [r for r in records if r[1] in ids and r[0] != "intent.create"]
        assert mine == [
            ("intent.claim", ids[0], "ok", 2),
            ("intent.claim", ids[1], "ok", 2),
            ("intent.check", ids[0], "ok", 2),
            ("intent.check", ids[1], "ok", 2),
            ("intent.commit", ids[0], "ok", 2),
            ("intent.fail", ids[1], "ok", 2),
            ("intent.claim", ids[2], "ok", 2),
            ("intent.claim", ids[3], "ok", 2),
            ("intent.check", ids[2], "ok", 2),
            ("intent.check", ids[3], "ok", 2),
            ("intent.commit", ids[2], "ok", 2),
            ("intent.commit", ids[3], "ok", 2),
        ]


async def test_a_stop_before_the_turn_keeps_its_intents_from_being_claimed_or_passing(tmp_path: Path) -> None:
    async with control_plane(tmp_path / "control.db") as cp:
        a = await propose(cp, "k-a", run="r-a")
        await propose(cp, "k-b", run="r-b", order="A-1002")
        stop = await issue(cp, "run:r-b")  # cancels b, still pending, as it is issued
        got = (await turn(cp, [], 5))["intents"]
        assert [(x["intent_id"], x["status"]) for x in got] == [(a["intent_id"], 200)]
        assert got[0]["intent"]["checked_revision"] == stop["revision"]
        states = await intents(cp)
        assert (states["k-a"]["state"], states["k-b"]["state"]) == ("claimed", "cancelled")
        # A stop after the turn does not cancel what passed its check: it is performed and settled.
        later = await issue(cp, "run:r-a")
        assert later["revision"] > stop["revision"]
        settled = await turn(cp, [{"intent_id": a["intent_id"], "outcome": {"content": []}}], 1)
        assert [x["status"] for x in settled["results"]] == [200] and settled["intents"] == []


async def test_a_turn_refuses_each_bad_outcome_on_its_own_and_other_roles_altogether(tmp_path: Path) -> None:
    async with control_plane(tmp_path / "control.db") as cp:
        a = await propose(cp, "k-a")
        pending = await propose(cp, "k-p", order="A-1002")
        got = (await turn(cp, [], 1))["intents"]
        outcomes = [
            {"intent_id": "int_nope", "outcome": {"content": []}},
            {"intent_id": a["intent_id"], "outcome": {"content": []}},
        ]
        answer = await turn(cp, outcomes, 1)
        assert [(x["status"], (x["error"] or {}).get("code")) for x in answer["results"]] == [
            (404, "unknown_intent"),
            (200, None),
        ]
        assert [x["intent_id"] for x in answer["intents"]] == [pending["intent_id"]]
        assert got[0]["intent_id"] == a["intent_id"]
        for bad in (
            {"claim": -1},
            {"claim": 101},
            {"outcomes": [{"intent_id": a["intent_id"]}], "claim": 0},
            {},
        ):
            r = await as_executor(cp, "POST", "/v1/intent-turns", json=bad)
            assert r.status_code == 422, (bad, r.text)
        async with httpx2.AsyncClient(base_url=cp, timeout=10) as http:
            r = await http.post("/v1/intent-turns", json={"claim": 1}, headers=auth("gateway"))
        assert r.status_code == 403, r.text
        refused = [r for r in await audit(cp) if r["outcome"] == "refused" and r["actor"] != "executor"]
        assert refused and refused[-1]["action"] == "intent.claim"
