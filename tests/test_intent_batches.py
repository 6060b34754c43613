"""Intents claimed, checked and settled in batches: the API (real control plane on a socket),
the executor's ``Batcher`` (real tasks), and the executor with many workers against the shop.

Each batch is one write: every intent in it is checked against the registry and audited as its
one-at-a-time route does, and the audit chain still verifies.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from control_harness import auth
from executor_harness import (
    ORDER_IDS,
    as_executor,
    control_plane,
    executor,
    gateway_config,
    intents,
    propose,
    shop,
)
from executor_harness import settled as all_settled
from haltwire.executor.batches import Batcher
from haltwire.runtime.client import ControlRefused, ControlUnreachable
from haltwire.store.intents.tables import SqlIntentStore
from intents_harness import auth as batch_auth
from intents_harness import plane, sqlite
from intents_harness import propose as propose_as
from openapi_harness import SCHEMATHESIS_EXAMPLES
from stops_harness import issue

pytestmark = pytest.mark.anyio


async def audit(cp: str) -> list[dict[str, Any]]:
    async with httpx2.AsyncClient(base_url=cp, timeout=10) as http:
        r = await http.get("/v1/audit", headers=auth("operator"))
    assert r.status_code == 200, r.text
    records: list[dict[str, Any]] = r.json()["records"]
    return records


async def verified(cp: str) -> dict[str, Any]:
    async with httpx2.AsyncClient(base_url=cp, timeout=10) as http:
        r = await http.get("/v1/audit/verify", headers=auth("viewer"))
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


async def test_a_claim_batch_takes_the_oldest_pending_in_one_write_each_audited(tmp_path: Path) -> None:
    async with control_plane(tmp_path / "control.db") as cp:
        proposed = [await propose(cp, f"k-{n}", order=ORDER_IDS[n]) for n in range(5)]
        r = await as_executor(cp, "POST", "/v1/intent-batches/claim", json={"limit": 3})
        assert r.status_code == 200, r.text
        first = r.json()["intents"]
        assert [i["intent_id"] for i in first] == [p["intent_id"] for p in proposed[:3]]
        assert {(i["state"], i["claimed_by"]) for i in first} == {("claimed", "executor-1")}
        rest = (await as_executor(cp, "POST", "/v1/intent-batches/claim", json={"limit": 10})).json()[
            "intents"
        ]
        assert [i["intent_id"] for i in rest] == [p["intent_id"] for p in proposed[3:]]
        nothing = await as_executor(cp, "POST", "/v1/intent-batches/claim", json={"limit": 10})
        assert (nothing.status_code, nothing.json()) == (200, {"intents": []})

        claims = [rec for rec in await audit(cp) if rec["action"] == "intent.claim"]
        assert [(c["target"], c["detail"]["batch"]) for c in claims] == [
            *((p["intent_id"], 3) for p in proposed[:3]),
            *((p["intent_id"], 2) for p in proposed[3:]),
        ]
        # Same roles as the one-at-a-time claim; a bad limit is refused.
        async with httpx2.AsyncClient(base_url=cp, timeout=10) as http:
            r = await http.post("/v1/intent-batches/claim", json={"limit": 1}, headers=auth("gateway"))
        assert r.status_code == 403 and r.json()["error"]["needed_roles"] == ["executor"]
        for bad in ({"limit": 0}, {"limit": 101}, {}, {"limit": 2, "more": 1}):
            r = await as_executor(cp, "POST", "/v1/intent-batches/claim", json=bad)
            assert (r.status_code, r.json()["error"]["code"]) == (422, "invalid_request"), bad
        assert (await verified(cp))["ok"] is True


async def test_a_check_batch_checks_each_intent_against_the_registry_and_answers_each(
    tmp_path: Path,
) -> None:
    async with control_plane(tmp_path / "control.db") as cp:
        a = await propose(cp, "k-a", run="r-a")
        b = await propose(cp, "k-b", run="r-b", order="A-1002")
        c = await propose(cp, "k-c", run="r-c", order="A-1003")
        await as_executor(cp, "POST", "/v1/intent-batches/claim", json={"limit": 3})
        stop = await issue(cp, "run:r-b")  # cancels b as it is issued: claimed, never checked

        ids = [a["intent_id"], b["intent_id"], "int_nope", c["intent_id"]]
        r = await as_executor(cp, "POST", "/v1/intent-batches/check", json={"intent_ids": ids})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [(x["intent_id"], x["status"]) for x in results] == list(
            zip(ids, [200, 409, 404, 200], strict=True)
        )
        assert results[0]["intent"]["checked_revision"] == stop["revision"]
        assert results[3]["intent"]["checked_revision"] == stop["revision"]
        error = results[1]["error"]
        assert (error["code"], error["stop_id"], error["intent"]["state"]) == (
            "stopped",
            stop["stop_id"],
            "cancelled",
        )
        assert results[2]["error"]["code"] == "unknown_intent"

        # A stop after the check does not cancel what passed it; a repeated check answers the first.
        later = await issue(cp, "tenant:acme")
        again = (
            await as_executor(cp, "POST", "/v1/intent-batches/check", json={"intent_ids": [a["intent_id"]]})
        ).json()["results"]
        assert (again[0]["status"], again[0]["intent"]["checked_revision"]) == (200, stop["revision"])
        assert later["revision"] > stop["revision"]
        now = await intents(cp)
        assert (now["k-a"]["state"], now["k-b"]["state"], now["k-c"]["state"]) == (
            "claimed",
            "cancelled",
            "claimed",
        )

        checks = [
            (rec["target"], rec["outcome"]) for rec in await audit(cp) if rec["action"] == "intent.check"
        ]
        assert checks == [
            (a["intent_id"], "ok"),
            (b["intent_id"], "refused"),
            ("int_nope", "refused"),
            (c["intent_id"], "ok"),
            (a["intent_id"], "ok"),
        ]
        assert (await verified(cp))["ok"] is True


async def test_an_outcome_batch_commits_and_fails_in_one_write_and_refuses_each_bad_one(
    tmp_path: Path,
) -> None:
    async with control_plane(tmp_path / "control.db") as cp:
        a = await propose(cp, "k-a")
        b = await propose(cp, "k-b", order="A-1002")
        pending = await propose(cp, "k-p", order="A-1003")
        await as_executor(cp, "POST", "/v1/intent-batches/claim", json={"limit": 2})
        outcomes = [
            {"intent_id": a["intent_id"], "outcome": {"content": [{"type": "text", "text": "done"}]}},
            {"intent_id": b["intent_id"], "error": "the shop refused"},
            {"intent_id": pending["intent_id"], "outcome": {"content": []}},
        ]
        r = await as_executor(cp, "POST", "/v1/intent-batches/settle", json={"outcomes": outcomes})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [x["status"] for x in results] == [200, 200, 409]
        assert (results[0]["intent"]["state"], results[1]["intent"]["state"]) == ("committed", "failed")
        assert results[1]["intent"]["error"] == "the shop refused"
        assert results[2]["error"]["code"] == "invalid_transition"
        now = await intents(cp)
        assert (now["k-a"]["state"], now["k-b"]["state"], now["k-p"]["state"]) == (
            "committed",
            "failed",
            "pending",
        )
        settles = [
            (rec["action"], rec["target"], rec["outcome"])
            for rec in await audit(cp)
            if rec["action"] in ("intent.commit", "intent.fail")
        ]
        assert settles == [
            ("intent.commit", a["intent_id"], "ok"),
            ("intent.fail", b["intent_id"], "ok"),
            ("intent.commit", pending["intent_id"], "refused"),
        ]
        # An entry needs exactly one of outcome and error.
        for entry in (
            {"intent_id": a["intent_id"]},
            {"intent_id": a["intent_id"], "outcome": {}, "error": "x"},
        ):
            r = await as_executor(cp, "POST", "/v1/intent-batches/settle", json={"outcomes": [entry]})
            assert r.status_code == 422, r.text
        assert (await verified(cp))["ok"] is True


async def test_the_batcher_sends_what_workers_ask_together_and_one_failure_fails_each(tmp_path: Path) -> None:
    sent: list[list[int]] = []
    fail = False

    async def send(items: list[int]) -> list[int | ControlRefused]:
        sent.append(items)
        await anyio.sleep(0.01)  # a round trip: what is asked meanwhile waits for the next
        if fail:
            raise ControlUnreachable("down")
        return [ControlRefused(409, {"code": "odd"}) if i % 7 == 0 else i * 10 for i in items]

    batcher: Batcher[int, int] = Batcher(send, most=8, linger_s=0)
    answers: dict[int, int | str] = {}

    async def worker(i: int) -> None:
        try:
            answers[i] = await batcher.ask(i)
        except ControlRefused as exc:
            answers[i] = exc.code

    async with anyio.create_task_group() as tg:
        for i in range(1, 21):
            tg.start_soon(worker, i)
    assert answers == {i: "odd" if i % 7 == 0 else i * 10 for i in range(1, 21)}
    assert sorted(i for batch in sent for i in batch) == list(range(1, 21)), "each asked once"
    assert len(sent) == 3 and max(len(b) for b in sent) == 8, sent

    # A request that fails fails each of its workers; the next one is sent again.
    fail, failed = True, []

    async def failing(i: int) -> None:
        with pytest.raises(ControlUnreachable):
            await batcher.ask(i)
        failed.append(i)

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(failing, i)
    assert sorted(failed) == [0, 1, 2]
    fail = False
    assert await batcher.ask(3) == 30


async def test_a_cancelled_leader_fails_its_batch_and_the_next_request_still_goes(tmp_path: Path) -> None:
    started = anyio.Event()

    async def send(items: list[int]) -> list[int | ControlRefused]:
        started.set()
        if 0 in items:
            await anyio.sleep_forever()
        return [i for i in items]

    batcher: Batcher[int, int] = Batcher(send, most=4, linger_s=0)
    outcome: dict[int, str] = {}

    async def follower(i: int) -> None:
        try:
            outcome[i] = str(await batcher.ask(i))
        except ControlUnreachable:
            outcome[i] = "lost"

    async with anyio.create_task_group() as tg:
        with anyio.CancelScope() as leader:
            async with anyio.create_task_group() as inner:
                inner.start_soon(batcher.ask, 0)  # leads: no request is on its way
                tg.start_soon(follower, 1)  # in the leader's batch (asked in the same pass)
                await started.wait()
                tg.start_soon(follower, 2)  # queued for the next batch
                await anyio.sleep(0.01)
                leader.cancel()
    assert outcome == {1: "lost", 2: "2"}
    assert await batcher.ask(5) == 5, "the lead was handed on"


async def test_sixteen_workers_settle_every_intent_once_in_batched_writes(tmp_path: Path) -> None:
    async with control_plane(tmp_path / "control.db") as cp, shop(tmp_path) as (s, up):
        n = 48
        for k in range(n):
            await propose(cp, f"k-{k}", order=ORDER_IDS[k % len(ORDER_IDS)], cents=100, run=f"r-{k % 3}")
        config = gateway_config(up, cp)
        config["executor"]["workers"] = 16
        async with executor(config) as ex:
            done = await all_settled(cp, n, within=30)
            claims, checks = ex.claims, ex.checks
        assert {i["state"] for i in done.values()} == {"committed"}
        assert sorted(r["idempotency_key"] for r in s.ledger()["refunds"]) == sorted(done)
        assert {r["requests"] for r in s.ledger()["refunds"]} == {1}
        # Fewer writes than intents: workers asked together.
        assert claims.items >= n and checks.items == n
        assert checks.sent < n and claims.sent < n, (claims.sent, checks.sent)
        records = await audit(cp)
        for action in ("intent.claim", "intent.check", "intent.commit"):
            mine = [rec for rec in records if rec["action"] == action]
            assert len(mine) == n and {rec["outcome"] for rec in mine} == {"ok"}, action
            assert max(rec["detail"].get("batch", 1) for rec in mine) > 1, action
        assert (await verified(cp))["ok"] is True


@pytest.mark.parametrize("examples", SCHEMATHESIS_EXAMPLES)
async def test_schemathesis_finds_no_failure_in_the_batch_endpoints(tmp_path: Path, examples: str) -> None:
    """The batch endpoints as their own role, the executor, with intents to claim: every answer
    (a batch's entries too) matches the document."""
    from openapi_harness import schemathesis

    async with plane(sqlite(tmp_path)) as (client, _):
        for n in range(5):
            await propose_as(client, f"k-{n}")
        url = str(client.base_url).rstrip("/")
        args = ("--include-path-regex", "^/v1/intent-batches", "--max-examples", examples)
        code, output = await schemathesis(
            tmp_path, url, "executor", f"{url}/openapi.json", *args, "--phases", "coverage,fuzzing"
        )
    assert code == 0, output
    found = re.search(r"Selected: (\d+)/(\d+)\s+Tested: (\d+)", output)
    assert found is not None, output
    assert int(found[1]) == int(found[3]) == 3, output


async def test_a_claim_batch_claims_no_more_than_asked_and_no_intent_twice_on_each_backend(
    store: dict[str, Any],
) -> None:
    """Two executors claiming at once: each gets at most what it asked, none gets one the other
    got, every pending intent is claimed (PostgreSQL could run a LIMIT subquery per row)."""
    async with plane(store) as (client, _):
        for n in range(12):
            await propose_as(client, f"k-{n}")
        got: dict[str, list[str]] = {"executor": [], "executor-2": []}

        async def claims(who: str) -> None:
            while True:
                r = await client.post("/v1/intent-batches/claim", json={"limit": 2}, headers=batch_auth(who))
                assert r.status_code == 200, r.text
                claimed = r.json()["intents"]
                assert len(claimed) <= 2, claimed
                if not claimed:
                    return
                got[who] += [i["intent_id"] for i in claimed]

        async with anyio.create_task_group() as tg:
            tg.start_soon(claims, "executor")
            tg.start_soon(claims, "executor-2")
        everyone = got["executor"] + got["executor-2"]
        assert len(everyone) == len(set(everyone)) == 12
        r = await client.get("/v1/intents", params={"state": "pending"}, headers=batch_auth("operator"))
        assert r.json()["intents"] == []


async def test_a_batch_reads_the_intents_it_holds_once(store: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim's rows stay locked by its transaction: the turn's checks take them as the claim
    answered them. A settle batch reads all its intents in one statement. Either is a statement
    less per intent (a round trip in PostgreSQL). What needs a read still gets one: the check of
    intents claimed in an earlier transaction, and an intent named twice in one settle batch."""
    reads: list[str] = []
    read_one = SqlIntentStore._locked

    async def counted(self: SqlIntentStore, tx: Any, intent_id: str) -> Any:
        reads.append(intent_id)
        return await read_one(self, tx, intent_id)

    monkeypatch.setattr(SqlIntentStore, "_locked", counted)
    async with plane(store) as (client, _):
        for n in range(6):
            await propose_as(client, f"k-{n}")

        async def post(path: str, body: dict[str, Any]) -> Any:
            r = await client.post(path, json=body, headers=batch_auth("executor"))
            assert r.status_code == 200, r.text
            return r.json()

        got = (await post("/v1/intent-turns", {"outcomes": [], "claim": 3}))["intents"]
        assert [(x["status"], x["intent"]["state"]) for x in got] == [(200, "claimed")] * 3
        assert all(x["intent"]["checked_revision"] is not None for x in got)
        assert reads == []

        a, b, _ = (x["intent_id"] for x in got)
        outcomes = [
            {"intent_id": a, "outcome": {"content": []}},
            {"intent_id": a, "outcome": {"content": []}},
            {"intent_id": b, "error": "the shop refused"},
        ]
        settled = (await post("/v1/intent-batches/settle", {"outcomes": outcomes}))["results"]
        assert [(x["status"], (x["intent"] or {}).get("state")) for x in settled] == [
            (200, "committed"),
            (409, None),
            (200, "failed"),
        ]
        assert settled[1]["error"]["code"] == "invalid_transition"
        assert reads == [a]  # only the second outcome of the intent named twice

        claimed = (await post("/v1/intent-batches/claim", {"limit": 3}))["intents"]
        ids = [i["intent_id"] for i in claimed]
        checked = (await post("/v1/intent-batches/check", {"intent_ids": ids}))["results"]
        assert [x["status"] for x in checked] == [200] * 3
        assert reads == [a, *ids]
