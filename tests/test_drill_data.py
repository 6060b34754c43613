"""Drill data in the control plane (``haltwire.control.drills``), on SQLite and PostgreSQL: what a
``drill = true`` identity writes and whatever concerns a drill tenant's runs is marked in the
audit log and the API, and left out of what counts incidents (escalation, paging); nothing else is.
"""

from __future__ import annotations

from typing import Any

import pytest

from haltwire.config import ConfigError
from haltwire.control import parse_control_config
from rules_harness import Plane, auth, config_dict, rules_plane, token

pytestmark = pytest.mark.anyio

TENANT_RULE = {"name": "tenant-after-3", "from": "run", "to": "tenant", "count": 3, "window_s": 600}
DRILL = [
    {"name": "drill-tripwire", "role": "tripwire", "token": token("drill-tripwire"), "drill": True},
    {"name": "drill-canary", "role": "agent", "agent": "canary", "tenant": "drill", "version": "1.0",
     "token": token("drill-canary"), "drill": True},
]  # fmt: skip
ONCALL = {"name": "oncall", "kind": "webhook", "url": "http://127.0.0.1:9/page"}


async def _registered(plane: Plane, who: str, *run_ids: str) -> None:
    for run_id in run_ids:
        r = await plane.register(who, run_id)
        assert r.status_code == 201, r.text


def _marked(records: list[dict[str, Any]]) -> dict[tuple[str, str], bool]:
    return {(r["action"], r["target"]): r["detail"].get("drill") is True for r in records}


async def test_drill_stops_and_runs_are_marked_and_count_for_no_incident(store: dict[str, Any]) -> None:
    async with rules_plane(store, identities=DRILL, escalations=[TENANT_RULE], notify=[ONCALL]) as plane:
        await _registered(plane, "drill-canary", "d-1", "d-2", "d-3")
        await _registered(plane, "acme", "r-1", "r-2", "r-3", "r-4")
        # A real tripwire trips three drill runs: a drill tenant's runs are no incident.
        for run in ("d-1", "d-2", "d-3"):
            await plane.stop(f"run:{run}")
        # The drill's tripwire trips three real runs: a drill identity's stops are no incident either.
        drill_stops = [await plane.stop(f"run:r-{n}", who="drill-tripwire") for n in (1, 2, 3)]
        assert "tenant:drill" not in [s["scope"] for s in await plane.stops()]
        assert "tenant:acme" not in [s["scope"] for s in await plane.stops()]
        # What the drill did pages no one; a real stop does (and the tenant rule still counts real trips).
        for n in (1, 2, 3):
            await plane.stop(f"run:r-{n}", reason="real")
        scopes = [s["scope"] for s in await plane.stops()]
        assert "tenant:acme" in scopes and "tenant:drill" not in scopes
        pages = plane.stores.pages
        assert all([await pages.for_subject(s["stop_id"]) == [] for s in drill_stops])
        listed = {(s["scope"], s["issued_by"]): s for s in await plane.stops()}
        assert await pages.for_subject(listed[("run:r-1", "tripwire-1")]["stop_id"]) != []
        assert await pages.for_subject(listed[("run:d-1", "tripwire-1")]["stop_id"]) == []

        # The API says which stops and runs are a drill's.
        assert {k: s["drill"] for k, s in listed.items()} == {
            ("run:d-1", "tripwire-1"): True, ("run:d-2", "tripwire-1"): True, ("run:d-3", "tripwire-1"): True,
            ("run:r-1", "drill-tripwire"): True, ("run:r-2", "drill-tripwire"): True,
            ("run:r-3", "drill-tripwire"): True, ("run:r-1", "tripwire-1"): False,
            ("run:r-2", "tripwire-1"): False, ("run:r-3", "tripwire-1"): False, ("tenant:acme", "escalation"): False,
        }  # fmt: skip
        runs = (await plane.client.get("/v1/runs", headers=auth("operator"))).json()["runs"]
        assert {r["run_id"]: r["drill"] for r in runs} == {
            "d-1": True, "d-2": True, "d-3": True, "r-1": False, "r-2": False, "r-3": False, "r-4": False,
        }  # fmt: skip
        one = (await plane.client.get("/v1/runs/d-1", headers=auth("operator"))).json()
        assert one["drill"] is True
        report = (await plane.client.get("/v1/runs/d-1/report", headers=auth("operator"))).json()
        assert report["drill"] is True and report["timeline"] and all(e["drill"] for e in report["timeline"])
        report = (await plane.client.get("/v1/runs/r-4/report", headers=auth("operator"))).json()
        assert report["drill"] is False and not any(e["drill"] for e in report["timeline"])

        # A real operator's writes about drill data are marked too: by target, by the stop cleared.
        cleared = await plane.client.post(
            f"/v1/stops/{drill_stops[0]['stop_id']}/clear", json={"reason": "done"}, headers=auth("operator")
        )
        assert cleared.status_code == 200 and cleared.json()["drill"] is True
        await plane.stop("tenant:drill", who="operator")
        await plane.stop("tenant:beta", who="operator")
        marked = _marked(await plane.audit())
        assert marked[("stop.clear", drill_stops[0]["stop_id"])] is True
        assert marked[("stop.issue", "tenant:drill")] is True
        assert marked[("stop.issue", "tenant:beta")] is False
        assert marked[("run.register", "d-1")] is True and marked[("run.register", "r-1")] is False
        assert marked[("stop.issue", "tenant:acme")] is False


async def test_without_drill_identities_nothing_is_marked(store: dict[str, Any]) -> None:
    async with rules_plane(store) as plane:
        await _registered(plane, "acme", "r-1")
        await plane.stop("run:r-1")
        stops = await plane.stops()
        assert [s["drill"] for s in stops] == [False]
        assert not any(r["detail"].get("drill") for r in await plane.audit())


def test_a_real_agent_in_a_drill_tenant_is_a_config_error(tmp_path: Any) -> None:
    data = config_dict({"backend": "sqlite", "path": str(tmp_path / "c.db")})
    data["identities"] += [*DRILL, {"name": "intruder", "role": "agent", "agent": "w", "tenant": "drill", "token": "t"}]
    with pytest.raises(ConfigError, match=r"intruder \(tenant drill\) is in a drill tenant; give it drill = true"):
        parse_control_config(data)
