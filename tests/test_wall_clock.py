"""The wall-clock budget (``max_wall_clock_s`` per agent class) through a real control plane on
loopback, on SQLite and PostgreSQL, with the lease desk's clock injected (no test waits for the
bound itself; the sweep looks every 20 ms).

A run past its bound is stopped by the sweep, as ``wall-clock`` with the figures in the reason,
once; a renewal past the bound is refused by that stop even before the sweep looks; two
replicas on one registry write one stop; a restarted control plane catches up; shadow mode
audits instead; other classes and runs that ended are left alone; the stops count as trips.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from haltwire.config import ConfigError
from haltwire.control import parse_control_config
from rules_harness import Plane, auth, config_dict, rules_plane

pytestmark = pytest.mark.anyio

T0 = 1_900_000_000.0  # 2030-03-17T17:46:40Z


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def classes(mode: str = "enforce", bound: float = 60) -> dict[str, Any]:
    return {
        "default": {},
        "short": {"max_wall_clock_s": bound, "wall_clock_mode": mode},
        "long": {"max_wall_clock_s": 10 * bound},
    }


@asynccontextmanager
async def plane(
    store: dict[str, Any], clock: Clock, mode: str = "enforce", every: float = 0.02, **extra: Any
) -> AsyncIterator[Plane]:
    async with rules_plane(
        store, clock, agent_classes=classes(mode), wall_clock={"check_every_s": every}, **extra
    ) as p:
        yield p


async def wall_clock_stops(p: Plane) -> list[dict[str, Any]]:
    return [s for s in await p.stops(every=True) if s["issued_by"] == "wall-clock"]


async def eventually_stopped(p: Plane, scope: str, within: float = 5.0) -> dict[str, Any]:
    with anyio.fail_after(within):
        while True:
            found = [s for s in await wall_clock_stops(p) if s["scope"] == scope]
            if found:
                return found[0]
            await anyio.sleep(0.02)


async def test_a_run_past_its_bound_is_stopped_once_with_the_figures(store: dict[str, Any]) -> None:
    clock = Clock()
    async with plane(store, clock) as p:
        for run_id, cls in (("r-1", "short"), ("r-2", "long"), ("r-3", "default")):
            assert (await p.register("acme", run_id, cls)).status_code == 201
        clock.now = T0 + 59.5
        await anyio.sleep(0.2)  # ten looks: within the bound, nothing
        assert await wall_clock_stops(p) == []
        clock.now = T0 + 61
        stop = await eventually_stopped(p, "run:r-1")
        assert stop["reason"] == (
            "wall clock: run r-1 registered at 2030-03-17T17:46:40Z is 61.0 s old, past its bound of 60 s "
            "(agent class short)"
        )
        r = await p.renew("acme", "r-1")
        assert r.status_code == 409 and r.json()["error"]["stop_id"] == stop["stop_id"], r.text
        await anyio.sleep(0.2)  # more looks: one stop, and the other classes' runs go on
        assert [s["scope"] for s in await wall_clock_stops(p)] == ["run:r-1"]
        assert (await p.renew("acme", "r-2")).status_code == 200
        assert (await p.renew("acme", "r-3")).status_code == 200
        issued = [r for r in await p.audit("stop.issue") if r["target"] == "run:r-1"]
        assert [(r["actor"], r["role"]) for r in issued] == [("wall-clock", "tripwire")]


async def test_a_renewal_past_the_bound_is_refused_before_the_sweep_looks(store: dict[str, Any]) -> None:
    clock = Clock()
    async with plane(store, clock, every=60) as p:  # one look at start-up, the next in a minute
        assert (await p.register("acme", "r-1", "short")).status_code == 201
        assert (await p.register("acme", "r-2", "short")).status_code == 201
        assert (await p.client.post("/v1/runs/r-2/end", headers={"Authorization": "Bearer tok-acme"})).status_code == 200
        clock.now = T0 + 60.5
        r = await p.renew("acme", "r-1")
        assert r.status_code == 409 and r.json()["error"]["code"] == "stopped", r.text
        (stop,) = await wall_clock_stops(p)
        assert stop["scope"] == "run:r-1" and r.json()["error"]["stop_id"] == stop["stop_id"]
        assert "is 60.5 s old, past its bound of 60 s" in stop["reason"]
        r = await p.renew("acme", "r-1")  # refused again by the same stop, no second one
        assert r.status_code == 409 and len(await wall_clock_stops(p)) == 1
        # An operator who clears it lets the run go on: the rule stopped it once.
        cleared = await p.client.post(
            f"/v1/stops/{stop['stop_id']}/clear", json={"reason": "let it finish"},
            headers={"Authorization": "Bearer tok-operator"},
        )  # fmt: skip
        assert cleared.status_code == 200
        assert (await p.renew("acme", "r-1")).status_code == 200
        # An ended run is not stopped (its renewal is refused for having ended).
        assert (await p.renew("acme", "r-2")).json()["error"]["code"] == "run_ended"
        assert len(await wall_clock_stops(p)) == 1


async def test_two_replicas_on_one_registry_write_one_stop(store: dict[str, Any]) -> None:
    clock = Clock()
    async with AsyncExitStack() as stack:
        replicas = [await stack.enter_async_context(plane(store, clock, every=0.01)) for _ in range(3)]
        for i in range(8):
            assert (await replicas[i % 3].register("acme", f"r-{i}", "short")).status_code == 201
        clock.now = T0 + 61
        for i in range(8):
            await eventually_stopped(replicas[0], f"run:r-{i}")
        await anyio.sleep(0.2)
        stops = await wall_clock_stops(replicas[0])
        assert sorted(s["scope"] for s in stops) == sorted(f"run:r-{i}" for i in range(8))


async def test_a_restarted_control_plane_catches_up(store: dict[str, Any]) -> None:
    clock = Clock()
    async with plane(store, clock) as p:
        assert (await p.register("acme", "r-1", "short")).status_code == 201
    clock.now = T0 + 3600  # down for an hour
    async with plane(store, clock) as p:
        stop = await eventually_stopped(p, "run:r-1")
        assert "is 3600.0 s old" in stop["reason"]


async def test_shadow_mode_audits_once_and_stops_nothing(store: dict[str, Any]) -> None:
    clock = Clock()
    async with plane(store, clock, mode="shadow") as p:
        assert (await p.register("acme", "r-1", "short")).status_code == 201
        clock.now = T0 + 61
        with anyio.fail_after(5):
            while not await p.audit("stop.shadow"):
                await anyio.sleep(0.02)
        await anyio.sleep(0.2)
        (record,) = await p.audit("stop.shadow")
        assert (record["actor"], record["target"]) == ("wall-clock", "run:r-1")
        assert record["reason"].startswith("would have stopped run:r-1: wall clock: run r-1 registered at")
        assert record["detail"]["bound_s"] == 60
        # The run's report shows it, with the run's own records.
        report = (await p.client.get("/v1/runs/r-1/report", headers=auth("operator"))).json()
        assert "stop.shadow" in [e["action"] for e in report["timeline"]]
        assert await wall_clock_stops(p) == []
        assert (await p.renew("acme", "r-1")).status_code == 200


async def test_wall_clock_stops_are_trips_the_escalation_counts(store: dict[str, Any]) -> None:
    clock = Clock()
    rule = {"to": "tenant", "count": 2, "window_s": 600}
    async with plane(store, clock, escalations=[rule]) as p:
        for run_id in ("r-1", "r-2"):
            assert (await p.register("acme", run_id, "short")).status_code == 201
        assert (await p.register("beta", "b-1", "long")).status_code == 201
        clock.now = T0 + 61
        await eventually_stopped(p, "run:r-2")
        with anyio.fail_after(5):
            while "tenant:acme" not in [s["scope"] for s in await p.stops()]:
                await anyio.sleep(0.02)
        assert (await p.renew("beta", "b-1")).status_code == 200


async def test_the_agents_process_runs_no_sweep_but_checks_renewals(tmp_path: Path) -> None:
    clock = Clock()
    store = {"backend": "sqlite", "path": str(tmp_path / "control.db")}
    async with rules_plane(
        store, clock, rules=False, agent_classes=classes(), wall_clock={"check_every_s": 0.01}
    ) as p:
        assert (await p.register("acme", "r-1", "short")).status_code == 201
        clock.now = T0 + 61
        await anyio.sleep(0.2)
        assert await wall_clock_stops(p) == []
        assert (await p.renew("acme", "r-1")).status_code == 409
        assert [s["scope"] for s in await wall_clock_stops(p)] == ["run:r-1"]


def test_bad_wall_clock_keys_are_config_errors() -> None:
    for extra, problem in (
        ({"agent_classes": {"default": {"max_wall_clock_s": 0}}}, "agent_classes.default.max_wall_clock_s"),
        ({"agent_classes": {"default": {"wall_clock_mode": "loud"}}}, "agent_classes.default.wall_clock_mode"),
        ({"wall_clock": {"check_every_s": 0}}, "wall_clock.check_every_s"),
        ({"wall_clock": {"check_every_s": 61}}, "wall_clock.check_every_s"),
    ):
        with pytest.raises(ConfigError, match=problem.replace(".", r"\.")):
            parse_control_config(config_dict({"backend": "sqlite"}, **extra))


def test_time_is_not_what_this_suite_waits_for() -> None:
    assert time.time() < T0  # the injected clock is ahead of the real one: nothing here sleeps for a bound
