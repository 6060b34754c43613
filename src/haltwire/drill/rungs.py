"""The rungs of a drill, one rep at a time: start a canary run, stop it at a random moment,
measure, clear the stop, end the run.

A stop rung's rep (``sdk``: the well-behaved runtime; ``gateway``: the runtime that ignores
stops), in this order:

1. the canary runtime starts (a task of the rep's own task group) and the rep waits for its first
   side effect;
2. a random pause (``rng``), then the stop, on the rep's scope, with a reason starting ``drill:``;
   its acknowledgement is the moment ``POST /v1/stops`` answered;
3. the rep waits for the runtime's first refusal (at most ``time_to_stop_s`` + ``GRACE_S``: no
   refusal by then is a broken rung), then ``SETTLE_S`` for side effects in flight to land;
4. the runtime is cancelled, the stop cleared (reason ``drill: measured``), the run ended;
5. the canary upstream's record of the run gives the figures.

A ``fail_closed`` rep runs one canary of each runtime, and instead of a stop pauses the control
plane (``Stack.pause_control``); step 4 resumes it and waits until the gateway serves again.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final

import anyio
import httpx2
from mcp import Client

from haltwire.drill.agents import CanaryRun, control_client, ignoring, mcp_client, well_behaved
from haltwire.drill.canary import TOOL
from haltwire.drill.figures import Rep
from haltwire.drill.stack import AGENT, CLASS_TIMING, TENANT, VERSION, Target
from haltwire.runtime import ControlClient

#: The scope kinds, taken round-robin across the stop rungs' reps.
SCOPE_KINDS: Final = ("run", "tenant", "agent", "version", "global", "tool")
#: The stop rungs, and the fail-closed rung, in the order they run.
RUNGS: Final = ("sdk", "gateway", "fail_closed")
#: Longer than the target before a rep is judged broken; the wait for side effects in flight.
GRACE_S: Final = 1.0
SETTLE_S: Final = 0.3
#: The longest wait for a canary run's first side effect, and for the gateway to serve again.
START_S: Final = 10.0
#: The random moment of the stop, after the run's first side effect.
PAUSE_S: Final = (0.05, 0.5)
#: The longest wait for a stop's clear (shielded from cancellation).
CLEAR_S: Final = 5.0
#: Every stop and clear of a drill says so.
REASON: Final = "drill:"

Runtime = Callable[[CanaryRun, ControlClient, Client], Coroutine[Any, Any, None]]
RUNTIMES: Final[dict[str, Runtime]] = {"sdk": well_behaved, "ignoring": ignoring}


async def _within(
    scope: anyio.CancelScope, runtime: Runtime, run: CanaryRun, control: ControlClient, client: Client
) -> None:
    """``runtime`` under ``scope``: the rep cancels the runtime, and nothing else, with it."""
    with scope:
        await runtime(run, control, client)


def since_stop(effects: list[tuple[float, str]], ack: float) -> list[float]:
    """Each side effect's time from the stop's acknowledgement, unrounded: one after it (``t >
    ack``, as the figures count it) is positive however soon. Rounded to 0.1 ms, an effect 30 µs
    after the stop read 0.0, before the stop on the report's timeline, while the figures counted
    it after."""
    return [t - ack for t, _ in effects]


class RungBroken(Exception):
    """A rep could not be measured; the message is a sentence naming the rung."""


def scope_of(kind: str, run_id: str) -> str:
    return {
        "run": f"run:{run_id}",
        "tenant": f"tenant:{TENANT}",
        "agent": f"agent:{AGENT}",
        "version": f"version:{AGENT}@{VERSION}",
        "global": "global",
        "tool": f"tool:{TOOL}",
    }[kind]


@dataclass
class Drill:
    """The stack, the operator's client (admin listener) and the canary's record."""

    stack: Target
    operator: httpx2.AsyncClient
    canary: httpx2.AsyncClient
    rng: random.Random
    #: The target judged (a stack the drill did not start: ``drill.remote``); None: its own class's.
    target: float | None = None

    @property
    def target_s(self) -> float:
        return CLASS_TIMING["time_to_stop_s"] if self.target is None else self.target

    async def record(self, run_id: str) -> list[tuple[float, str]]:
        r = await self.canary.get("/record", params={"run": run_id})
        r.raise_for_status()
        return [(float(t), str(what)) for t, _, what in r.json()["effects"]]

    async def total_recorded(self) -> int:
        r = await self.canary.get("/record")
        r.raise_for_status()
        return len(r.json()["effects"])

    async def left_behind(self, run_ids: list[str]) -> dict[str, int]:
        """What the drill would leave behind, asked of the control plane: its stops still active,
        and which of its runs (``run_ids``) are not ended (both 0 after a drill that ran to its end)."""
        stops = await self.operator.get("/v1/stops")
        stops.raise_for_status()
        not_ended = 0
        for run_id in run_ids:
            r = await self.operator.get(f"/v1/runs/{run_id}")
            r.raise_for_status()
            not_ended += r.json().get("ended_at") is None
        return {
            "active_stops": sum(str(s["reason"]).startswith(REASON) for s in stops.json()["stops"]),
            "runs_not_ended": not_ended,
        }

    async def _measure(
        self,
        rung: str,
        n: int,
        scope: tuple[str, str],
        run: CanaryRun,
        ack: float,
        effects: list[tuple[float, str]] | None = None,
    ) -> Rep:
        """The rep's figures, from the canary upstream's record of the run (``scope``: text, kind),
        or from ``effects``, another canary's record of it."""
        if effects is None:
            effects = await self.record(run.run_id)
        after = [(t, what) for t, what in effects if t > ack]
        last = max((t for t, _ in effects), default=ack)

        def since(t: float | None) -> float | None:
            return None if t is None else max(0.0, t - ack)

        return Rep(
            rung, n, scope[0], scope[1], run.runtime, run.run_id, ack,
            last_effect_s=max(0.0, last - ack),
            first_refusal_s=since(run.refused_at),
            lease_end_s=since(run.lease_end_at),
            refusal=run.refusal,
            effects_total=len(effects),
            effects_after=[what for _, what in after],
            served_seen=run.served,
            refused_before_stop=len(run.early),
            cut_s=since(run.cut_at),
            effects_at_s=since_stop(effects, ack),
        )  # fmt: skip

    async def _started(self, rung: str, run: CanaryRun) -> None:
        """Until the run's first side effect; broken if it never comes, or if the well-behaved
        runtime was refused (and so ended) first."""
        with anyio.move_on_after(START_S):
            while not run.first_served.is_set():
                if run.runtime == "sdk" and run.early:
                    raise RungBroken(
                        f"the {rung} rung is broken: its sdk canary was refused ({run.early[0]}) "
                        "before its first side effect, before any stop of the drill"
                    )
                await anyio.sleep(0.01)
            return
        raise RungBroken(
            f"the {rung} rung is broken: its {run.runtime} canary had no side effect within {START_S:g} s"
        )

    async def _refused(self, rung: str, runs: list[CanaryRun], how: str) -> str | None:
        """None once every run was refused; else the sentence naming the rung."""
        within = self.target_s + GRACE_S
        with anyio.move_on_after(within):
            for run in runs:
                await run.refused.wait()
            return None
        late = ", ".join(f"the {r.runtime} canary" for r in runs if r.refused_at is None)
        return f"the {rung} rung is broken: {late} was not refused within {within:g} s of {how}"

    async def stop_rep(self, rung: str, n: int, kind: str) -> Rep:
        """One rep of a stop rung (``sdk`` or ``gateway``): steps 1 to 5 of the module's docstring."""
        run = CanaryRun("sdk" if rung == "sdk" else "ignoring")
        async with (
            control_client(self.stack.control_url, self.stack.tokens["runtime"]) as control,
            mcp_client(self.stack.mcp_url, self.stack.tokens["agent"]) as client,
            anyio.create_task_group() as tg,
        ):
            runtime = anyio.CancelScope()  # the runtime's alone: the clear below is not cancelled
            tg.start_soon(_within, runtime, RUNTIMES[run.runtime], run, control, client)
            await self._started(rung, run)
            await anyio.sleep(self.rng.uniform(*PAUSE_S))
            scope = scope_of(kind, run.run_id)
            run.armed = True
            r = await self.operator.post(
                "/v1/stops", json={"scope": scope, "reason": f"{REASON} {rung} rep {n}"}
            )
            ack = time.time()
            if r.status_code != 201:
                raise RungBroken(
                    f"the {rung} rung is broken: POST /v1/stops answered {r.status_code}: {r.text}"
                )
            try:
                broken = await self._refused(rung, [run], f"a stop on {scope}")
                await anyio.sleep(SETTLE_S)
                runtime.cancel()
            finally:
                await self._clear(str(r.json()["stop_id"]))
            await control.end_run(run.run_id)
        rep = await self._measure(rung, n, (scope, kind), run, ack)
        rep.broken, rep.stop_id = broken, str(r.json()["stop_id"])
        return rep

    async def fail_closed_rep(self, n: int) -> list[Rep]:
        """One rep of the fail-closed rung: both runtimes, the control plane paused."""
        runs = [CanaryRun("sdk"), CanaryRun("ignoring")]
        async with (
            control_client(self.stack.control_url, self.stack.tokens["runtime"]) as control,
            mcp_client(self.stack.mcp_url, self.stack.tokens["agent"]) as client,
        ):
            async with anyio.create_task_group() as tg:
                scopes = [anyio.CancelScope() for _ in runs]
                for run, scope in zip(runs, scopes, strict=True):
                    tg.start_soon(_within, scope, RUNTIMES[run.runtime], run, control, client)
                for run in runs:
                    await self._started("fail_closed", run)
                await anyio.sleep(self.rng.uniform(*PAUSE_S))
                for run in runs:
                    run.armed = True
                self.stack.pause_control()
                ack = time.time()
                try:
                    broken = await self._refused("fail_closed", runs, "the control plane's pause")
                    await anyio.sleep(SETTLE_S)
                    for scope in scopes:
                        scope.cancel()
                finally:
                    self.stack.resume_control()
            await self._serving_again()
            for run in runs:
                await control.end_run(run.run_id)
        paused = ("control plane paused", "unreachable")
        reps = [await self._measure("fail_closed", n, paused, run, ack) for run in runs]
        for rep in reps:
            rep.broken = broken
        return reps

    async def _clear(self, stop_id: str) -> None:
        """Clear the rep's stop, even while the rep is being cancelled (a drill leaves no stop)."""
        with anyio.CancelScope(shield=True), anyio.fail_after(CLEAR_S):
            r = await self.operator.post(f"/v1/stops/{stop_id}/clear", json={"reason": f"{REASON} measured"})
        if r.status_code != 200:
            raise RungBroken(f"clearing the drill's stop {stop_id} answered {r.status_code}: {r.text}")
        await anyio.sleep(0.1)  # the gateway hears the clear before the next run starts

    async def _serving_again(self) -> None:
        """Until the gateway, following the resumed control plane, is ready again."""
        with anyio.move_on_after(START_S):
            async with httpx2.AsyncClient(timeout=1.0) as http:
                while True:
                    try:
                        if (await http.get(f"{self.stack.gateway_url}/readyz")).status_code == 200:
                            return
                    except httpx2.HTTPError:
                        pass
                    await anyio.sleep(0.05)
        raise RungBroken(
            f"the fail_closed rung is broken: the gateway was not ready {START_S:g} s after the control plane resumed"
        )


def operator_client(stack: Target) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(
        base_url=stack.admin_url, headers={"Authorization": f"Bearer {stack.tokens['operator']}"}, timeout=5.0
    )
