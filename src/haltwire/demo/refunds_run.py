"""One run of ``haltwire demo refunds``: the support agent against the stack, measured and checked.

``one_run`` runs the agent under its lease until the intent limit stops it, then measures the
layers after the tripwire (the lease renewal and the broker credential refused), reads the run
report and the shop's ledger, and restarts deliberately: the stop cleared with a reason, a new
run resumed from the last checkpoint. ``deviations`` says where the run differs from the seed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import httpx2

from haltwire.control.reports import SECTIONS
from haltwire.demo.refunds_stack import EXECUTOR, PER_RUN, TOKENS, Stack
from haltwire.demo.support_agent import AUDIENCE, TOOLS, AgentLog, support_agent
from haltwire.runtime import ControlClient, ControlRefused, Lease

#: Longest one agent run may take, from registration to the report.
RUN_TIMEOUT_S: Final = 60.0


@dataclass
class RunResult:
    number: int
    agent: AgentLog = field(default_factory=AgentLog)
    report: dict[str, Any] = field(default_factory=dict)
    #: The shop's refunds for this run's idempotency keys.
    ledger: list[dict[str, Any]] = field(default_factory=list)
    renewal: dict[str, Any] = field(default_factory=dict)
    credential: dict[str, Any] = field(default_factory=dict)
    #: The deliberate restart: the stop cleared with a reason, a new run resumed from the checkpoint.
    restart: dict[str, Any] = field(default_factory=dict)
    deviations: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def run_id(self) -> str:
        return self.agent.run_id

    @property
    def stop(self) -> dict[str, Any]:
        stops = self.report.get("stops", [])
        return stops[0] if len(stops) == 1 else {}

    @property
    def sixth(self) -> dict[str, Any]:
        """The run's sixth intent (by when it was recorded), or {} when there is none."""
        intents = sorted(self.intents(), key=lambda i: float(i["created_at"]))
        return intents[PER_RUN] if len(intents) > PER_RUN else {}

    def intents(self) -> list[dict[str, Any]]:
        """Every intent of the run the report lists, whatever its state."""
        return [i for section in SECTIONS for i in self.report.get(section, [])]

    def committed(self) -> list[dict[str, Any]]:
        """The report's committed refunds, as the shop's ledger would show them."""
        return [
            {
                "idempotency_key": i["idempotency_key"],
                "order_id": i["arguments"]["order_id"],
                "amount_cents": i["arguments"]["amount_cents"],
                "refund_id": ((i.get("outcome") or {}).get("structuredContent") or {}).get("refund_id"),
            }
            for i in self.report.get("completed", [])
        ]

    def ledger_rows(self) -> list[dict[str, Any]]:
        fields = ("idempotency_key", "order_id", "amount_cents", "refund_id")
        return [{k: r[k] for k in fields} for r in self.ledger]

    def matches(self) -> bool:
        def key(r: dict[str, Any]) -> str:
            return str(r["idempotency_key"])

        return sorted(self.committed(), key=key) == sorted(self.ledger_rows(), key=key)

    def checked_by_executor(self) -> bool:
        """The sixth intent was cancelled by the executor's final check (a refused ``intent.check``)."""
        sixth = self.sixth
        return any(
            r["action"] == "intent.check" and r["target"] == sixth.get("intent_id") and r["outcome"] == "refused"
            and r["actor"] == EXECUTOR
            for r in self.report.get("timeline", [])
        )  # fmt: skip

    @property
    def ok(self) -> bool:
        return not self.deviations


async def _refused(call: Any) -> dict[str, Any]:
    """What a control-plane request that should be refused got: its code, stop id and time."""
    at = time.time()
    try:
        await call
    except ControlRefused as exc:
        return {"at": at, "status": exc.status, "code": exc.code, "stop_id": exc.error.get("stop_id")}
    return {"at": at, "status": 200, "code": "granted", "stop_id": None}


async def one_run(stack: Stack, number: int) -> RunResult:
    result = RunResult(number)
    start = anyio.current_time()
    operator = {"Authorization": f"Bearer {TOKENS['operator']}"}
    with anyio.fail_after(RUN_TIMEOUT_S):
        async with (
            ControlClient(stack.control_url, TOKENS["runtime"]) as control,
            httpx2.AsyncClient(base_url=stack.control_url, headers=operator, timeout=10) as http,
        ):
            result.agent = await support_agent(control, f"{stack.gateway_url}/mcp", TOKENS["agent"])
            run_id = result.agent.run_id
            result.renewal = await _refused(control.renew(run_id))
            result.credential = await _refused(control.credential(run_id, AUDIENCE))
            r = await http.get(f"/v1/runs/{run_id}/report")
            r.raise_for_status()
            result.report = r.json()
            ledger = (await http.get(f"{stack.shop_url}/ledger")).json()
            if result.stop:
                result.restart = await restart(control, http, run_id, str(result.stop["stop_id"]))
    keys = {i["idempotency_key"] for i in result.intents()}
    result.ledger = [r for r in ledger["refunds"] if r["idempotency_key"] in keys]
    result.elapsed_s = anyio.current_time() - start
    result.deviations = deviations(result)
    return result


#: Why the on-call engineer clears the stop: after the report, before the restart.
CLEAR_REASON: Final = "refunds reviewed and reversed; resuming from the last checkpoint"


async def restart(
    control: ControlClient, http: httpx2.AsyncClient, run_id: str, stop_id: str
) -> dict[str, Any]:
    """Restart deliberately: clear the stop with a reason, then register a new run that resumes
    from the stopped run's last checkpoint (not from the context that caused the problem)."""
    cleared_at = time.time()
    r = await http.post(f"/v1/stops/{stop_id}/clear", json={"reason": CLEAR_REASON})
    r.raise_for_status()
    lease = await Lease.register(control, agent_class="support", tools=TOOLS, resume_from=run_id)
    resumed_at = time.time()
    await control.end_run(lease.run_id)  # the demo stops here; a real agent would go on
    return {
        "cleared_at": cleared_at,
        "reason": r.json()["clear_reason"],
        "run_id": lease.run_id,
        "resumed_at": resumed_at,
        "checkpoint": (lease.checkpoint or {}).get("data"),
    }


def deviations(r: RunResult) -> list[str]:
    """What differs from the seed's outcome, one sentence each; empty when it matched."""
    out: list[str] = []
    stop, sixth, report = r.stop, r.sixth, r.report
    if len(r.ledger) != PER_RUN:
        out.append(f"the shop applied {len(r.ledger)} refunds for the run, not {PER_RUN}")
    if not r.matches():
        out.append("the report's committed refunds differ from the shop's ledger")
    if len(report["completed"]) != PER_RUN:
        out.append(f"the report lists {len(report['completed'])} committed refunds, not {PER_RUN}")
    stops = report["stops"]
    if len(stops) != 1:
        out.append(f"{len(stops)} stops hit the run, not 1")
    elif (stop["scope"], stop["issued_by"]) != (f"run:{r.run_id}", "intent-limit"):
        out.append(f"the stop is {stop['scope']} by {stop['issued_by']}, not run:{r.run_id} by intent-limit")
    if (sixth.get("state"), sixth.get("stop_id")) != ("cancelled", stop.get("stop_id")):
        out.append(
            f"the sixth intent is {sixth.get('state')} (stop {sixth.get('stop_id')}), not cancelled by the stop"
        )
    elif not r.checked_by_executor():
        out.append("the sixth intent was not cancelled by the executor's final check")
    if report["cancelled"] != ([sixth] if sixth else []):
        out.append(f"{len(report['cancelled'])} intents were cancelled, not only the sixth")
    for section in ("unknown", "failed", "pending", "awaiting_approval", "rejected"):
        if report[section]:
            out.append(f"{len(report[section])} intents are {section}")
    first = [p.order_id for p in r.agent.proposals[:PER_RUN]]
    if [c["order_id"] for c in r.committed()] != first:
        out.append(
            f"the committed orders {[c['order_id'] for c in r.committed()]} are not the first five proposed {first}"
        )
    if (r.renewal.get("code"), r.renewal.get("stop_id")) != ("stopped", stop.get("stop_id")):
        out.append(f"the lease renewal answered {r.renewal.get('code')}, not stopped by the stop")
    if r.credential.get("code") != "stopped":
        out.append(f"the broker answered {r.credential.get('code')} to a credential renewal, not stopped")
    notice = r.agent.notice or {}
    if notice.get("stop_id") != stop.get("stop_id"):
        out.append(f"the lease in the agent ended by {notice.get('code')!r}, not by the stop")
    if r.restart.get("reason") != CLEAR_REASON:
        out.append("the stop was not cleared with its reason")
    elif r.restart.get("checkpoint") != r.agent.checkpoint:
        out.append(
            f"the restart resumed from {r.restart.get('checkpoint')}, not the last checkpoint {r.agent.checkpoint}"
        )
    return out


async def run_all(stack: Stack, runs: int) -> list[RunResult]:
    results = []
    for n in range(1, runs + 1):
        stack.processes.check_alive()
        try:
            results.append(await one_run(stack, n))
        except Exception as exc:  # a run that raises or hangs is a deviation, not a crash
            results.append(RunResult(n, deviations=[f"the run failed: {type(exc).__name__}: {exc}"]))
    return results
