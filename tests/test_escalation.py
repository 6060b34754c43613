"""Escalation (``[[escalations]]``) through a real control plane on loopback, on SQLite and PostgreSQL.

Three tripped runs of one tenant within the window stop the tenant, in the transaction of the
third trip (its 201 means the tenant stop is written), and a fourth run of that tenant is
refused while another tenant is untouched; the escalation's reason and audit record name the
rule and the stops that caused it; a fourth trip writes no second tenant stop; only tripwire
stops of runs count, not cleared, within the window; runs of two tenants on one agent version
stop the version; shadow mode stops nothing and says what it would have; the config's errors.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from control_harness import dropped_trigger, failing_trigger, raw_sql
from haltwire.config import ConfigError
from haltwire.control import parse_control_config
from page_receiver import Receiver, receiving
from rules_harness import Plane, auth, config_dict, rules_plane

pytestmark = pytest.mark.anyio

TENANT_RULE = {"name": "tenant-after-3", "from": "run", "to": "tenant", "count": 3, "window_s": 600}


async def registered(plane: Plane, who: str, *run_ids: str) -> None:
    for run_id in run_ids:
        r = await plane.register(who, run_id)
        assert r.status_code == 201, r.text


async def test_three_tripped_runs_of_a_tenant_stop_it_and_a_fourth_run_is_refused(store: dict[str, Any]) -> None:
    async with rules_plane(store, escalations=[TENANT_RULE]) as plane:
        await registered(plane, "acme", "r-1", "r-2", "r-3", "r-4")
        await registered(plane, "beta", "b-1")
        trips = [await plane.stop("run:r-1"), await plane.stop("run:r-2")]
        assert [s["scope"] for s in await plane.stops()] == ["run:r-1", "run:r-2"]

        trips.append(await plane.stop("run:r-3"))
        # Answered once the escalation is written: the tenant's stop is there at the 201.
        stops = await plane.stops()
        assert [s["scope"] for s in stops] == ["run:r-1", "run:r-2", "run:r-3", "tenant:acme"]
        tenant = stops[-1]
        assert tenant["issued_by"] == "escalation"
        assert tenant["reason"].startswith("escalation tenant-after-3: 3 runs of tenant acme tripped within 600 s")
        for trip, run in zip(trips, ("r-1", "r-2", "r-3"), strict=True):
            assert f"{trip['stop_id']} (run {run}, tenant acme)" in tenant["reason"]
        issued = [r for r in await plane.audit("stop.issue") if r["target"] == "tenant:acme"]
        assert len(issued) == 1 and issued[0]["actor"] == "escalation" and issued[0]["role"] == "tripwire"
        assert issued[0]["detail"]["rule"] == "tenant-after-3"
        assert issued[0]["detail"]["caused_by"] == [t["stop_id"] for t in trips]
        assert issued[0]["detail"]["stop_id"] == tenant["stop_id"]

        # A fourth run of the tenant is refused; the running fourth one's renewal too.
        r = await plane.register("acme", "r-5")
        assert r.status_code == 409 and r.json()["error"]["code"] == "stopped", r.text
        assert r.json()["error"]["stop_id"] == tenant["stop_id"]
        r = await plane.renew("acme", "r-4")
        assert r.status_code == 409 and r.json()["error"]["stop_id"] == tenant["stop_id"]
        # Another tenant is untouched: its run renews, a new one registers.
        assert (await plane.renew("beta", "b-1")).status_code == 200
        assert (await plane.register("beta", "b-2")).status_code == 201

        # A fourth trip while the tenant is stopped writes no second tenant stop.
        await plane.stop("run:r-4")
        scopes = [s["scope"] for s in await plane.stops(every=True)]
        assert scopes.count("tenant:acme") == 1 and "global" not in scopes

        # Idempotent across the clear too: the trips behind the escalation never cause another.
        r = await plane.client.post(
            f"/v1/stops/{tenant['stop_id']}/clear", json={"reason": "fixed"}, headers=auth("operator")
        )
        assert r.status_code == 200, r.text
        await plane.stop("run:r-1", reason="again")
        assert [s["scope"] for s in await plane.stops(every=True)].count("tenant:acme") == 1
        # The escalation's stop is in the audit chain like any other.
        verified = await plane.client.get("/v1/audit/verify", headers=auth("operator"))
        assert verified.json()["ok"] is True, verified.text


async def test_the_trip_and_its_escalation_commit_together_or_not_at_all(store: dict[str, Any]) -> None:
    """Crash safety: an escalation that cannot be written takes its trip with it (503, written
    "no"), so no trip is ever recorded without the escalation it causes; the retry writes both."""
    async with rules_plane(store, escalations=[TENANT_RULE]) as plane:
        await registered(plane, "acme", "r-1", "r-2", "r-3")
        await plane.stop("run:r-1")
        await plane.stop("run:r-2")
        sql = raw_sql(store)
        sql(*failing_trigger(store, "escalations", "INSERT", "the disk is full"))
        r = await plane.client.post(
            "/v1/stops", json={"scope": "run:r-3", "reason": "tripped"}, headers={**auth("tripwire"), "Idempotency-Key": "k-3"}
        )
        assert r.status_code == 503 and r.json()["error"]["written"] == "no", r.text
        assert [s["scope"] for s in await plane.stops(every=True)] == ["run:r-1", "run:r-2"]
        sql(*dropped_trigger(store, "escalations", "INSERT"))
        r = await plane.client.post(
            "/v1/stops", json={"scope": "run:r-3", "reason": "tripped"}, headers={**auth("tripwire"), "Idempotency-Key": "k-3"}
        )
        assert r.status_code == 201, r.text
        assert [s["scope"] for s in await plane.stops()] == ["run:r-1", "run:r-2", "run:r-3", "tenant:acme"]


async def test_only_tripwire_stops_of_runs_not_cleared_within_the_window_count(store: dict[str, Any]) -> None:
    async with rules_plane(store, escalations=[TENANT_RULE]) as plane:
        await registered(plane, "acme", "r-1", "r-2", "r-3", "r-4", "r-5")
        await plane.stop("run:r-1", who="operator")  # an operator's stop is no trip
        cleared = await plane.stop("run:r-2")
        r = await plane.client.post(
            f"/v1/stops/{cleared['stop_id']}/clear", json={"reason": "false positive"},
            headers={"Authorization": "Bearer tok-operator"},
        )  # fmt: skip
        assert r.status_code == 200
        # A trip from before the window, written straight to the registry as then.
        await plane.stores.registry.issue_stop("run:r-3", "old", "tripwire-1", now=time.time() - 601)
        await plane.stop("tenant:beta")  # not a run
        await plane.stop("run:unregistered")  # no run: no tenant to count it in
        await plane.stop("run:r-4")
        await plane.stop("run:r-4", reason="twice")  # one run, counted once
        assert "tenant:acme" not in [s["scope"] for s in await plane.stops()]
        await plane.stop("run:r-5")
        assert "tenant:acme" not in [s["scope"] for s in await plane.stops()]
        # The intent limit's stops are trips too (issued as intent-limit, role tripwire).
        await plane.stores.registry.issue_stop("run:r-1", "limit", "intent-limit", now=time.time())
        await registered(plane, "acme", "r-6")
        escalated = await plane.stop("run:r-6")
        assert escalated["scope"] == "run:r-6"
        tenant = [s for s in await plane.stops() if s["scope"] == "tenant:acme"]
        assert len(tenant) == 1 and tenant[0]["reason"].startswith("escalation tenant-after-3: 4 runs")


async def test_runs_of_two_tenants_tripped_on_one_version_stop_that_version(store: dict[str, Any]) -> None:
    rule = {"to": "version", "count": 2, "window_s": 300}
    async with rules_plane(store, escalations=[rule]) as plane:
        await registered(plane, "acme", "r-1", "r-2")
        await registered(plane, "beta", "b-1")
        await registered(plane, "acme-22", "v-1")
        await plane.stop("run:r-1")
        await plane.stop("run:r-2")  # two runs, one tenant: not yet
        assert [s["scope"] for s in await plane.stops()] == ["run:r-1", "run:r-2"]
        await plane.stop("run:b-1")
        stops = await plane.stops()
        assert [s["scope"] for s in stops][-1] == "version:a1@2.1"
        assert stops[-1]["reason"].startswith("escalation run-to-version: 2 tenants of agent version a1@2.1")
        # The other version of the agent, and the agent's other tenants' runs of it, go on.
        assert (await plane.renew("acme-22", "v-1")).status_code == 200
        assert (await plane.register("gamma", "g-1")).status_code == 409
        assert (await plane.register("acme-22", "v-2")).status_code == 201


async def test_shadow_mode_stops_nothing_and_audits_what_it_would_have_once(store: dict[str, Any]) -> None:
    async with rules_plane(store, escalations=[{**TENANT_RULE, "mode": "shadow"}]) as plane:
        await registered(plane, "acme", "r-1", "r-2", "r-3", "r-4")
        trips = [await plane.stop(f"run:r-{i}") for i in (1, 2, 3)]
        assert "tenant:acme" not in [s["scope"] for s in await plane.stops(every=True)]
        shadow = await plane.audit("stop.shadow")
        assert len(shadow) == 1
        record = shadow[0]
        assert (record["actor"], record["target"]) == ("escalation", "tenant:acme")
        assert record["reason"].startswith("would have stopped tenant:acme: escalation tenant-after-3: 3 runs")
        assert record["detail"]["caused_by"] == [t["stop_id"] for t in trips]
        await plane.stop("run:r-4")  # would have been stopped already: no second record
        assert len(await plane.audit("stop.shadow")) == 1
        assert (await plane.register("acme", "r-5")).status_code == 201


async def test_a_scope_too_long_to_write_never_refuses_the_trip(tmp_path: Path) -> None:
    long = {"name": "long", "role": "agent", "token": "tok-long", "agent": "a" * 256, "version": "v" * 256}
    store = {"backend": "sqlite", "path": str(tmp_path / "control.db")}
    async with rules_plane(store, identities=[long], escalations=[{"to": "version", "count": 1, "window_s": 60}]) as plane:
        await registered(plane, "long", "r-1")
        await registered(plane, "acme", "r-2")
        await plane.stop("run:r-1")  # version:AAA...@VVV... is past a scope's 512 characters
        assert [s["scope"] for s in await plane.stops()] == ["run:r-1"]
        await plane.stop("run:r-2")
        assert [s["scope"] for s in await plane.stops()] == ["run:r-1", "run:r-2", "version:a1@2.1"]


async def test_off_and_no_rule_never_escalate(store: dict[str, Any]) -> None:
    async with rules_plane(store, escalations=[{**TENANT_RULE, "count": 1, "mode": "off"}]) as plane:
        await registered(plane, "acme", "r-1")
        await plane.stop("run:r-1")
        assert [s["scope"] for s in await plane.stops()] == ["run:r-1"]
        assert await plane.audit("stop.shadow") == []


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        ({"from": "run", "count": 3, "window_s": 60}, "escalations[0].to: Field required"),
        ({"to": "fleet", "count": 3, "window_s": 60}, "escalations[0].to: Input should be"),
        ({"from": "tenant", "to": "version", "count": 3, "window_s": 60}, "escalations[0].from: Input should be 'run'"),
        ({"to": "tenant", "count": 0, "window_s": 60}, "escalations[0].count: Input should be greater than or equal to 1"),
        ({"to": "tenant", "count": 3, "window_s": 0}, "escalations[0].window_s: Input should be greater than 0"),
        ({"to": "tenant", "count": 3, "window_s": 60, "mode": "loud"}, "escalations[0].mode: Input should be"),
        ({"to": "tenant", "count": 3, "window_s": 60, "counts": "tenants"}, 'counts: "tenants" counts one tenant'),
        ({"to": "tenant", "count": 3, "window_s": 60, "every": 3}, "escalations[0].every: Extra inputs"),
    ],
)
def test_bad_rules_are_config_errors_naming_the_key(rule: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_control_config(config_dict({"backend": "sqlite"}, escalations=[rule]), "control.toml")
    assert problem in str(info.value)
    assert str(info.value).startswith("control.toml: escalations")


def test_rule_names_are_unique_and_rules_own_their_names() -> None:
    two = [{"to": "tenant", "count": 3, "window_s": 60}, {"to": "tenant", "count": 5, "window_s": 600}]
    with pytest.raises(ConfigError, match="escalations: two rules named run-to-tenant; give each its own name"):
        parse_control_config(config_dict({"backend": "sqlite"}, escalations=two))
    named = [two[0], {**two[1], "name": "tenant-slow"}]
    config = parse_control_config(config_dict({"backend": "sqlite"}, escalations=named))
    assert [e.rule for e in config.escalations] == ["run-to-tenant", "tenant-slow"]
    assert [e.unit for e in config.escalations] == ["runs", "runs"]
    data = config_dict({"backend": "sqlite"})
    data["identities"].append({"name": "wall-clock", "role": "operator", "token": "tok-x"})
    with pytest.raises(ConfigError, match="wall-clock is the name a control-plane rule writes stops as"):
        parse_control_config(data)


@pytest.mark.parametrize("mode", ["enforce", "shadow"])
async def test_an_escalation_pages_as_one_and_a_shadow_one_as_would_have(store: dict[str, Any], mode: str) -> None:
    receiver = Receiver()
    async with receiving(receiver) as hook:
        notify = [{"name": "oncall", "kind": "webhook", "url": f"{hook}/hook"}]
        rule = {**TENANT_RULE, "mode": mode}
        async with rules_plane(store, escalations=[rule], notify=notify) as plane:
            await registered(plane, "acme", "r-1", "r-2", "r-3")
            trips = [(await plane.stop(f"run:r-{i}"))["stop_id"] for i in (1, 2, 3)]
            await receiver.wait(pages=4)
            await anyio.sleep(0.3)  # nothing more comes
    pages = [page for _, page, _ in receiver.pages]
    assert [p["event"] for p in pages] == ["stop", "stop", "stop", "escalation" if mode == "enforce" else "shadow"]
    assert [p["subject"] for p in pages[:3]] == trips
    last = pages[-1]
    assert last["scope"] == "tenant:acme" and last["rule"] == "tenant-after-3"
    if mode == "shadow":
        assert last["reason"].startswith("would have stopped tenant:acme")
