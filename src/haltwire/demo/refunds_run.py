"""One run of ``haltwire demo refunds``: the support agent against the stack, measured and checked.

``one_run`` runs the agent under its lease until the per-run tripwire stops it, then measures
the layers after the tripwire (the lease renewal and the broker credential refused), reads the
run report, the content rule's shadow firing (its audit record) and the shop's ledger, waits for
on-call's page, and restarts deliberately: the stop cleared with a reason, a new run resumed
from the last checkpoint. ``deviations`` says where the run differs from the seed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import httpx2

from haltwire.control.reports import SECTIONS
from haltwire.demo.refunds_stack import (
    CONTENT_RULE,
    PER_RUN,
    RUN_RULE,
    TOKENS,
    TRIPWIRE,
    Stack,
    agent_token,
    runtime_token,
)
from haltwire.demo.support_agent import AUDIENCE, TOOLS, AgentLog, support_agent
from haltwire.runtime import ControlClient, ControlRefused, Lease

#: Longest one agent run may take, from registration to the report.
RUN_TIMEOUT_S: Final = 60.0
#: Longest the demo waits for on-call's page of the stop.
PAGE_WAIT_S: Final = 10.0


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
    #: The content rule's shadow firings about the run (``stop.shadow`` audit records, with detail).
    shadow: list[dict[str, Any]] = field(default_factory=list)
    #: The page on-call received for the run's stop (``haltwire.page/1``), and when.
    page: dict[str, Any] = field(default_factory=dict)
    paged_at: float | None = None
    deviations: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def run_id(self) -> str:
        return self.agent.run_id

    @property
    def stop(self) -> dict[str, Any]:
        stops = self.report.get("stops", [])
        return stops[0] if len(stops) == 1 else {}

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

    @property
    def refused(self) -> dict[str, Any]:
        """The refund call the gateway refused (the sixth), or {}."""
        return self.agent.refused or {}

    @property
    def shadow_firing(self) -> dict[str, Any]:
        """The content rule's one shadow firing, or {} (none, or more than one)."""
        return self.shadow[0] if len(self.shadow) == 1 else {}

    def first_committed_at(self) -> float | None:
        done = [float(i["updated_at"]) for i in self.report.get("completed", [])]
        return min(done) if done else None

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
            ControlClient(stack.control_url, runtime_token(number)) as control,
            httpx2.AsyncClient(base_url=stack.control_url, headers=operator, timeout=10) as http,
        ):
            result.agent = await support_agent(control, f"{stack.gateway_url}/mcp", agent_token(number))
            run_id = result.agent.run_id
            result.renewal = await _refused(control.renew(run_id))
            result.credential = await _refused(control.credential(run_id, AUDIENCE))
            r = await http.get(f"/v1/runs/{run_id}/report")
            r.raise_for_status()
            result.report = r.json()
            audit = await http.get("/v1/audit", params={"target": f"run:{run_id}"})
            audit.raise_for_status()
            result.shadow = [
                a for a in audit.json()["records"] if a["action"] == "stop.shadow" and a["actor"] == TRIPWIRE
            ]
            ledger = (await http.get(f"{stack.shop_url}/ledger")).json()
            result.page, result.paged_at = await _page(http, stack.oncall_url, run_id)
            if result.stop:
                result.restart = await restart(control, http, run_id, str(result.stop["stop_id"]))
    keys = {i["idempotency_key"] for i in result.intents()}
    result.ledger = [r for r in ledger["refunds"] if r["idempotency_key"] in keys]
    result.elapsed_s = anyio.current_time() - start
    result.deviations = deviations(result)
    return result


async def _page(http: httpx2.AsyncClient, oncall_url: str, run_id: str) -> tuple[dict[str, Any], float | None]:
    """The page on-call received for the run's stop (waiting up to ``PAGE_WAIT_S``), and when; the
    shadow firing's page comes earlier and is not it."""
    with anyio.move_on_after(PAGE_WAIT_S):
        while True:
            received = (await http.get(f"{oncall_url}/pages")).json()["pages"]
            for p in received:
                if p["page"].get("run_id") == run_id and p["page"].get("event") == "stop":
                    return p["page"], float(p["received_at"])
            await anyio.sleep(0.05)
    return {}, None


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
    stop, refused, report = r.stop, r.refused, r.report
    if len(r.ledger) != PER_RUN:
        out.append(f"the shop applied {len(r.ledger)} refunds for the run, not {PER_RUN}")
    if not r.matches():
        out.append("the report's committed refunds differ from the shop's ledger")
    if len(report["completed"]) != PER_RUN:
        out.append(f"the report lists {len(report['completed'])} committed refunds, not {PER_RUN}")
    stops = report["stops"]
    if len(stops) != 1:
        out.append(f"{len(stops)} stops hit the run, not 1")
    elif (stop["scope"], stop["issued_by"]) != (f"run:{r.run_id}", TRIPWIRE):
        out.append(f"the stop is {stop['scope']} by {stop['issued_by']}, not run:{r.run_id} by {TRIPWIRE}")
    elif not str(stop["reason"]).startswith(f"tripwire {RUN_RULE} (steps, enforce)"):
        out.append(f"the stop's reason does not name the rule {RUN_RULE}: {stop['reason']!r}")
    error = refused.get("error") or {}
    tripped = (error.get("code"), error.get("tripwire"), error.get("scope")) == (
        "tripwire_tripped", RUN_RULE, f"run:{r.run_id}"
    )
    # Under load the stop's push can end the lease in the agent before the refusal reaches it.
    if not tripped and (error.get("code"), error.get("stop_id")) != ("stopped", stop.get("stop_id")):
        out.append(f"the sixth refund was answered {error or 'nothing'}, not refused by the tripwire {RUN_RULE}")
    elif not str(stop.get("reason", "")).rstrip().endswith(" refused"):
        out.append("the stop's evidence does not end with the sixth refund refused at the gateway")
    if len(r.intents()) != PER_RUN or len(r.agent.proposals) != PER_RUN:
        out.append(f"{len(r.intents())} intents were written, not {PER_RUN}: the sixth refund was not refused first")
    for section in ("cancelled", "unknown", "failed", "pending", "awaiting_approval", "rejected"):
        if report[section]:
            out.append(f"{len(report[section])} intents are {section}")
    first = [p.order_id for p in r.agent.proposals[:PER_RUN]]
    if [c["order_id"] for c in r.committed()] != first:
        out.append(
            f"the committed orders {[c['order_id'] for c in r.committed()]} are not the first five proposed {first}"
        )
    shadow, first_commit = r.shadow_firing, r.first_committed_at()
    if not shadow or shadow["detail"].get("rule") != CONTENT_RULE:
        out.append(f"{len(r.shadow)} shadow firings of {CONTENT_RULE} were recorded, not 1")
    elif r.agent.injected_at is None or float(shadow["detail"]["fired_at"]) > r.agent.injected_at:
        out.append("the content rule's shadow firing is not at the read of the injected review")
    elif first_commit is None or float(shadow["at"]) > first_commit:
        out.append("the content rule's shadow firing was recorded after the first refund was committed")
    if (r.renewal.get("code"), r.renewal.get("stop_id")) != ("stopped", stop.get("stop_id")):
        out.append(f"the lease renewal answered {r.renewal.get('code')}, not stopped by the stop")
    if r.credential.get("code") != "stopped":
        out.append(f"the broker answered {r.credential.get('code')} to a credential renewal, not stopped")
    notice = r.agent.notice or {}
    if notice.get("stop_id") != stop.get("stop_id"):
        out.append(f"the lease in the agent ended by {notice.get('code')!r}, not by the stop")
    out.extend(page_deviations(r))
    if r.restart.get("reason") != CLEAR_REASON:
        out.append("the stop was not cleared with its reason")
    elif r.restart.get("checkpoint") != r.agent.checkpoint:
        out.append(
            f"the restart resumed from {r.restart.get('checkpoint')}, not the last checkpoint {r.agent.checkpoint}"
        )
    return out


def page_deviations(r: RunResult) -> list[str]:
    """Where on-call's page differs from the stop and the run report."""
    page, stop = r.page, r.stop
    if not page:
        return [f"on-call received no page for the run within {PAGE_WAIT_S:g} s"]
    out = []
    if (page.get("event"), page.get("subject"), page.get("actor")) != ("stop", stop.get("stop_id"), TRIPWIRE):
        out.append(f"the page is {page.get('event')} {page.get('subject')} by {page.get('actor')}, not the stop")
    ids = [i["intent_id"] for i in r.report.get("completed", [])]
    if [i["intent_id"] for i in page.get("committed") or []] != ids or page.get("cancelled") != r.report["cancelled"]:
        out.append("the page's committed and cancelled intents differ from the run report's")
    if not str(page.get("report_url", "")).endswith(f"/v1/runs/{r.run_id}/report"):
        out.append(f"the page links {page.get('report_url')}, not the run report")
    timeline = (page.get("report") or {}).get("timeline") or []
    if not any(t["action"] == "stop.shadow" and t["actor"] == TRIPWIRE for t in timeline):
        out.append("the page's run report leaves out the review's shadow firing")
    return out


async def run_all(stack: Stack, runs: int, progress: Callable[[str], None] = lambda _: None) -> list[RunResult]:
    """Every run, one after the other; ``progress`` is told of each as it ends."""
    results = []
    for n in range(1, runs + 1):
        stack.processes.check_alive()
        try:
            results.append(await one_run(stack, n))
        except Exception as exc:  # a run that raises or hangs is a deviation, not a crash
            results.append(RunResult(n, deviations=[f"the run failed: {type(exc).__name__}: {exc}"]))
        r = results[-1]
        progress(f"run {n}/{runs}: {len(r.ledger)} refunds, {'as expected' if not r.deviations else 'DEVIATES'}")
    return results
