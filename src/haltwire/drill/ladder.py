"""The ladder's rungs beyond the gateway's tool calls: ``model`` (level 3, model calls),
``broker`` (level 4), ``egress`` (level 5) and ``executor`` (irreversible calls as intents).

A rep, in this order (the stop rungs' steps, ``drill.rungs``, with the rung's canary from
``drill.canaries`` and its own record):

1. the canary runtime starts and the rep waits for its first side effect (``executor``: for
   the first intent performed);
2. a random pause, then the stop on the rep's scope (of a kind in ``KINDS``), with a
   reason starting ``drill:``; its acknowledgement is when ``POST /v1/stops`` answered, and its
   revision is kept;
3. the rep waits for the runtime's first refusal (else the rung is broken, named), then
   ``SETTLE_S`` for side effects in flight to land;
4. the runtime is cancelled, the stop cleared, the run ended; for ``executor``, the rep waits
   until every intent of the run is settled (committed, failed, cancelled or rejected);
5. the figures come from the record of the part that performed the side effects: the canary
   targets (provider tokens sent, downstream accepts, requests seen) or the canary upstream
   (intents performed). The executor's rep also lists the intents performed on a final check at
   or after the stop's revision (``decided_after_stop``: the rung fails unless there are none).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Final

import anyio
import httpx2

from haltwire.drill.agents import CanaryRun
from haltwire.drill.canaries import LADDER, Runtime, patient_client
from haltwire.drill.canary import TOOL_COMMIT
from haltwire.drill.figures import Rep
from haltwire.drill.rungs import PAUSE_S, REASON, SCOPE_KINDS, SETTLE_S, START_S, Drill, RungBroken, scope_of
from haltwire.drill.stack import Stack
from haltwire.drill.targets import MODEL
from haltwire.runtime import ControlClient

_RUN_SCOPES: Final = ("run", "tenant", "agent", "version", "global")
#: The scope kinds each rung takes round-robin: those that reach its enforcement point (a
#: ``tool:`` stop never reaches a model call, nor a credential or a tunnel: no tool is called).
KINDS: Final[dict[str, tuple[str, ...]]] = {
    "model": (*_RUN_SCOPES, "model"),
    "broker": _RUN_SCOPES,
    "egress": _RUN_SCOPES,
    "executor": (*_RUN_SCOPES, "tool"),
}
TERMINAL: Final = frozenset({"committed", "failed", "cancelled", "rejected"})


class KindCycle:
    """The scope kinds round-robin across every stop rung's reps, each rep taking the next kind
    its rung accepts, so a short drill covers every kind (``model`` too) over all its rungs."""

    ORDER: Final = (*SCOPE_KINDS, "model")

    def __init__(self) -> None:
        self._next = 0

    def take(self, rung: str) -> str:
        accepted = KINDS.get(rung, SCOPE_KINDS)
        while True:
            kind = self.ORDER[self._next % len(self.ORDER)]
            self._next += 1
            if kind in accepted:
                return kind


async def _within(
    scope: anyio.CancelScope, runtime: Runtime, run: CanaryRun, control: ControlClient, stack: Stack
) -> None:
    with scope:
        await runtime(run, control, stack)


@dataclass
class Ladder:
    """The drill, and the canary targets' record."""

    drill: Drill
    targets: httpx2.AsyncClient

    async def record(self, run_id: str) -> list[tuple[float, str]]:
        r = await self.targets.get("/record", params={"run": run_id})
        r.raise_for_status()
        return [(float(t), str(what)) for t, _, what in r.json()["effects"]]

    async def total_recorded(self) -> int:
        r = await self.targets.get("/record")
        r.raise_for_status()
        return len(r.json()["effects"])

    async def rep(self, rung: str, n: int, kind: str) -> Rep:
        """One rep of ``rung`` on a stop of ``kind``: steps 1 to 5 of the module's docstring."""
        drill = self.drill
        # The ladder's parts are the drill's own stack's (a running stack skips these rungs).
        assert isinstance(drill.stack, Stack)
        run = CanaryRun("ignoring")
        async with patient_client(drill.stack.control_url) as control, anyio.create_task_group() as tg:
            runtime = anyio.CancelScope()
            tg.start_soon(_within, runtime, LADDER[rung], run, control, drill.stack)
            await drill._started(rung, run)
            if rung == "executor":  # a call served is an intent recorded: wait for one performed
                await self._performed(run.run_id)
            await anyio.sleep(drill.rng.uniform(*PAUSE_S))
            scope = _scope(rung, kind, run.run_id)
            run.armed = True
            r = await drill.operator.post(
                "/v1/stops", json={"scope": scope, "reason": f"{REASON} {rung} rep {n}"}
            )
            ack = time.time()
            if r.status_code != 201:
                raise RungBroken(
                    f"the {rung} rung is broken: POST /v1/stops answered {r.status_code}: {r.text}"
                )
            revision = int(r.json()["revision"])
            try:
                broken = await drill._refused(rung, [run], f"a stop on {scope}")
                await anyio.sleep(SETTLE_S)
                runtime.cancel()
            finally:
                await drill._clear(str(r.json()["stop_id"]))
            await control.end_run(run.run_id)
        if rung == "executor":
            intents = await self._settled(run.run_id)
            rep = await drill._measure(rung, n, (scope, kind), run, ack)
            rep.intents = _by_state(intents)
            rep.decided_after_stop = [
                str(i["arguments"].get("what", i["intent_id"]))
                for i in intents
                if i.get("checked_revision") is not None and int(i["checked_revision"]) >= revision
            ]
        else:
            rep = await drill._measure(rung, n, (scope, kind), run, ack, await self.record(run.run_id))
        rep.broken, rep.stop_id = broken, str(r.json()["stop_id"])
        return rep

    async def _performed(self, run_id: str) -> None:
        with anyio.move_on_after(START_S):
            while True:  # the canary upstream's record, polled: no event crosses the process
                if await self.drill.record(run_id):
                    return
                await anyio.sleep(0.02)
        raise RungBroken(
            f"the executor rung is broken: no intent of run {run_id} was performed within {START_S:g} s"
        )

    async def _settled(self, run_id: str) -> list[dict[str, Any]]:
        """The run's intents once every one is settled; broken when one is not within ``START_S``."""
        with anyio.move_on_after(START_S):
            while True:
                r = await self.drill.operator.get("/v1/intents", params={"run": run_id, "limit": 1000})
                r.raise_for_status()
                intents: list[dict[str, Any]] = r.json()["intents"]
                if all(i["state"] in TERMINAL for i in intents):
                    return intents
                await anyio.sleep(0.05)
        raise RungBroken(
            f"the executor rung is broken: intents of run {run_id} were not settled within {START_S:g} s"
        )


def _scope(rung: str, kind: str, run_id: str) -> str:
    """The stop's scope: a ``tool:`` stop names the rung's tool, a ``model:`` stop the canary's model."""
    if kind == "model":
        return f"model:{MODEL}"
    if kind == "tool" and rung == "executor":
        return f"tool:{TOOL_COMMIT}"
    return scope_of(kind, run_id)


def _by_state(intents: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in intents:
        out[i["state"]] = out.get(i["state"], 0) + 1
    return out
