"""Scenario 7 of ``haltwire demo loop``: an operator stops a run through the control plane.

A control plane, a demo upstream and a gateway that requires leases run in this process;
ops-bot calls under a lease, and the stop, the push that ends the lease and the fence after
the clear are measured over real sockets.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import anyio
import httpx2

from haltwire.demo.agent import call_once, run_agent
from haltwire.demo.loop_results import Row, ScenarioResult, observe, upstream_counts, upstream_note
from haltwire.demo.loop_scenarios import STEPS, ordinal
from haltwire.demo.stack import (
    CONTROL_TOKENS,
    LEASE_KEYS,
    TOKENS,
    connect,
    demo_config,
    running_control_plane,
    running_gateway,
    running_upstream,
)
from haltwire.meta import LEASE_META
from haltwire.runtime import ControlClient, Lease


async def scenario_control_plane_stop(before: int = 6) -> ScenarioResult:
    r = ScenarioResult(
        7, f"an operator stops ops-bot's run through the control plane before its {ordinal(before)} call"
    )
    with tempfile.TemporaryDirectory(prefix="haltwire-demo-") as tmp:
        async with (
            running_control_plane(Path(tmp) / "control.db") as control_url,
            running_upstream() as (demo, url),
        ):
            link = {"url": control_url, "token": CONTROL_TOKENS["gateway"], "staleness_s": 5.0}
            config = demo_config(url, control=link, leases={"keys": LEASE_KEYS})
            async with (
                running_gateway(config) as (app, gw),
                connect(gw, TOKENS["ops-bot"]) as client,
                ControlClient(control_url, CONTROL_TOKENS["ops-bot"]) as runtime,
                Lease.start(runtime) as lease,
                httpx2.AsyncClient(base_url=control_url, timeout=10) as http,
            ):
                operator = {"Authorization": f"Bearer {CONTROL_TOKENS['operator']}"}
                watch = app.gateway.stops
                assert watch is not None
                issued: dict[str, Any] = {}

                async def stop_the_run(step: int) -> None:
                    if step != before:
                        return
                    reply = await http.post(
                        "/v1/stops",
                        json={"scope": f"run:{lease.run_id}", "reason": "refund storm"},
                        headers=operator,
                    )
                    answered = anyio.current_time()
                    issued.update(reply.json())
                    with anyio.fail_after(5):  # the push to the gateway, measured below
                        await watch.reached(issued["revision"])
                    issued["reached_gateway_ms"] = (anyio.current_time() - answered) * 1000

                meta = {LEASE_META: lease.token}
                log = await run_agent(client, "ops-bot", max_steps=STEPS, before_call=stop_the_run, meta=meta)
                with anyio.move_on_after(5):
                    await lease.ended.wait()
                await http.post(
                    f"/v1/stops/{issued['stop_id']}/clear", json={"reason": "fixed"}, headers=operator
                )
                with anyio.fail_after(5):  # the clear reaches the gateway
                    await watch.reached(issued["revision"] + 1)
                old = await call_once(client, meta=meta)
                async with Lease.start(runtime) as fresh:
                    new = await call_once(client, meta={LEASE_META: fresh.token})
    r.rows.append(Row.of(log))
    r.logs.append(log.to_dict())
    r.logs.append({"agent": "ops-bot", "after_clear": {"old_lease": old.to_dict(), "new_run": new.to_dict()}})
    notice = lease.notice
    r.notes.append(
        f"stop {issued.get('stop_id')} on run:{lease.run_id} reached the gateway "
        f"{issued.get('reached_gateway_ms', float('nan')):.1f} ms after the API answered"
    )
    r.notes.append(
        f"the lease in the agent process ended by push: {notice.message if notice else '(not ended)'}"
    )
    r.notes.append(
        f"after the clear: the old lease is {old.code}, a new run is {'refused' if new.is_error else 'served'}"
    )
    r.notes.append(upstream_note(demo))
    r.observed = {
        **observe("ops-bot", log),
        "ops-bot.lease.ended_by": notice.stop_id if notice else None,
        "ops-bot.after_clear.old_lease": old.code,
        "ops-bot.after_clear.new_run.served": not new.is_error,
        **upstream_counts(demo),
    }
    r.expected = {
        "ops-bot.calls": before,
        "ops-bot.served": before - 1,
        "ops-bot.refused": 1,
        "ops-bot.stopped_by": "the server",
        "ops-bot.last.code": "stopped",
        "ops-bot.last.retryable": False,
        "ops-bot.lease.ended_by": issued.get("stop_id"),
        "ops-bot.after_clear.old_lease": "lease_invalid",
        "ops-bot.after_clear.new_run.served": True,
        "upstream.served": before,
        "upstream.refused": 0,
    }
    return r
