"""``haltwire demo refunds``: the seed's refund incident, end to end with real processes.

A support agent (scripted: no model) reads orders and may refund up to $200 an order through
the gateway, whose ``issue_refund`` is irreversible: every call becomes an intent that the
executor carries out after checking the stop registry. One order's review carries a prompt
injection; once the agent has read it, it refunds every order it reads. The control plane's
per-run intent limit (5 ``issue_refund``) is the tripwire: the sixth intent to reach the
executor's final check writes a stop for the run and is cancelled by it.

The demo starts the control plane, the shop (the refunds API, which records every refund it
applies), the gateway and the executor as separate processes on loopback, runs the agent in
this process under a 10-second lease, and then measures what the layers did: the stop, the
sixth intent cancelled, the lease ended, the renewal and the broker credential refused. It
prints the timeline, the run report beside the shop's own ledger, and a script reversing the
committed refunds. It exits 1, naming the run and the deviation, unless every run was capped
at exactly five refunds and its report matches the ledger.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio
import httpx2
import tomli_w
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from haltwire.control.reports import SECTIONS
from haltwire.demo.processes import Processes, StackFailed, free_port
from haltwire.demo.shop import INJECTED_ORDER
from haltwire.demo.support_agent import AUDIENCE, TOOLS, AgentLog, support_agent
from haltwire.runtime import ControlClient, ControlRefused, Lease

#: The per-run limit the control plane enforces on ``issue_refund`` intents.
PER_RUN: Final = 5
#: Plain tokens and the lease key of the demo's development configs.
TOKENS: Final = {
    "operator": "tok-refunds-oncall",
    "gateway": "tok-refunds-gateway",
    "executor": "tok-refunds-executor",
    "runtime": "tok-refunds-runtime",
    "agent": "tok-refunds-support",
}
LEASE_KEY: Final = {"kid": "demo", "secret": "demo-refunds-lease-key-never-in-production-0123"}
EXECUTOR: Final = "executor-1"
AGENT: Final = "support-bot"
#: Longest one agent run may take, from registration to the report.
RUN_TIMEOUT_S: Final = 60.0


# -- the configs -------------------------------------------------------------------------------


def control_config(db: Path, port: int) -> dict[str, Any]:
    """The control plane: a 10-second lease for ``support``, the broker, the per-run limit."""
    return {
        "control": {"development": True, "port": port, "heartbeat_s": 1.0},
        "registry": {"backend": "sqlite", "path": str(db)},
        "leases": {"signing_key": LEASE_KEY["kid"], "keys": [LEASE_KEY]},
        "agent_classes": {
            "default": {"ttl_s": 15.0, "renew_every_s": 5.0, "renew_timeout_s": 10.0},
            "support": {"ttl_s": 10.0, "renew_every_s": 3.0, "renew_timeout_s": 8.0},
        },
        "broker": {"audiences": [AUDIENCE], "generate": True, "ttl_s": 300.0},
        "intent_limits": [{"tool": "issue_refund", "per_run": PER_RUN}],
        "identities": [
            {"name": "oncall", "role": "operator", "token": TOKENS["operator"]},
            {"name": "gateway-1", "role": "gateway", "token": TOKENS["gateway"]},
            {"name": EXECUTOR, "role": "executor", "token": TOKENS["executor"]},
            {
                "name": "support-runtime",
                "role": "agent",
                "agent": AGENT,
                "tenant": "acme",
                "version": "1.0",
                "token": TOKENS["runtime"],
            },
        ],
    }


def gateway_config(port: int, control_url: str, shop_url: str) -> dict[str, Any]:
    """The gateway (and the executor, which reads the same file): leases required, intents on."""
    return {
        "gateway": {"development": True, "port": port},
        "control": {"url": control_url, "token": TOKENS["gateway"], "staleness_s": 5.0},
        "leases": {"keys": [LEASE_KEY]},
        "intents": {"enabled": True},
        "executor": {"token": TOKENS["executor"], "poll_s": 0.05, "retry_s": 0.1},
        "identities": [
            {
                "agent": AGENT,
                "tenant": "acme",
                "version": "1.0",
                "token": TOKENS["agent"],
                "lease": "required",
            }
        ],
        "upstreams": [{"name": "shop", "url": f"{shop_url}/mcp"}],
    }


# -- the processes -----------------------------------------------------------------------------


class Stack:
    """The control plane, the shop, the gateway and the executor, each its own process."""

    def __init__(self, directory: Path) -> None:
        self.processes = Processes(directory)
        self.directory = directory
        self.control_url = f"http://127.0.0.1:{free_port()}"
        self.shop_url = f"http://127.0.0.1:{free_port()}"
        self.gateway_url = f"http://127.0.0.1:{free_port()}"

    @staticmethod
    def _port(url: str) -> int:
        return int(url.rsplit(":", 1)[1])

    def start(self) -> None:
        cp_toml, gw_toml = self.directory / "control.toml", self.directory / "gateway.toml"
        control_data = control_config(self.directory / "control.db", self._port(self.control_url))
        cp_toml.write_text(tomli_w.dumps(control_data))
        gw_toml.write_text(
            tomli_w.dumps(gateway_config(self._port(self.gateway_url), self.control_url, self.shop_url))
        )
        spawn = self.processes.spawn
        ledger = str(self.directory / "ledger.db")
        shop = spawn(
            "shop", "-m", "haltwire.demo.shop", "--port", str(self._port(self.shop_url)), "--ledger", ledger
        )
        control = spawn("control plane", "-m", "haltwire", "control", "--config", str(cp_toml))
        shop.wait_http(f"{self.shop_url}/ledger")
        control.wait_http(f"{self.control_url}/healthz")
        gateway = spawn("gateway", "-m", "haltwire", "gateway", "--config", str(gw_toml))
        executor = spawn("executor", "-m", "haltwire", "executor", "--config", str(gw_toml))
        gateway.wait_http(f"{self.gateway_url}/healthz")
        executor.wait_log("committing intents")


@contextmanager
def running_stack() -> Iterator[Stack]:
    """The stack in a temporary directory, torn down however the block ends (Ctrl-C too)."""
    with tempfile.TemporaryDirectory(prefix="haltwire-refunds-") as tmp:
        stack = Stack(Path(tmp))
        try:
            stack.start()
            yield stack
        finally:
            stack.processes.close()


# -- one run, measured and checked ---------------------------------------------------------------


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

    def to_dict(self) -> dict[str, Any]:
        sixth, stop = self.sixth, self.stop
        return {
            "run": self.number,
            "run_id": self.run_id,
            "ok": self.ok,
            "deviations": self.deviations,
            "applied": len(self.ledger),
            "proposed": len(self.agent.proposals),
            "proposals": [
                {
                    k: v
                    for k, v in asdict(p).items()
                    if k in ("order_id", "amount_cents", "intent_id", "state")
                }
                for p in self.agent.proposals
            ],
            "committed": self.committed(),
            "ledger": self.ledger_rows(),
            "report_matches_ledger": self.matches(),
            "sixth": {
                "intent_id": sixth.get("intent_id"),
                "order_id": (sixth.get("arguments") or {}).get("order_id"),
                "state": sixth.get("state"),
                "stop_id": sixth.get("stop_id"),
                "claimed_by": sixth.get("claimed_by"),
                "cancelled_by_check": self.checked_by_executor(),
            },
            "stop": {k: stop.get(k) for k in ("stop_id", "scope", "issued_by", "reason", "issued_at")},
            "lease_notice": self.agent.notice,
            "agent_exited_by": self.agent.exited_by,
            "renewal_refused": self.renewal,
            "credential_refused": self.credential,
            "restart": {k: v for k, v in self.restart.items() if k in ("reason", "run_id", "checkpoint")},
            "last_checkpoint": self.agent.checkpoint,
            "timeline": [{"ms": round(ms, 1), "event": e, "detail": d} for ms, e, d in timeline(self)],
            "elapsed_s": round(self.elapsed_s, 3),
        }


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


def timeline(r: RunResult) -> list[tuple[float, str, str]]:
    """(ms since the agent started, event, detail), in time order."""
    a, stop = r.agent, r.stop
    t0 = a.started_at
    events: list[tuple[float, str, str]] = []

    def at(t: float | None, event: str, detail: str) -> None:
        if t is not None:
            events.append(((t - t0) * 1000, event, detail))

    run = r.report.get("run", {})
    at(run.get("registered_at"), "run registered", f"{r.run_id}, agent class support (10 s lease)")
    if a.credential:
        ttl = float(a.credential["expires_at"]) - float(a.credential["issued_at"])
        at(float(a.credential["issued_at"]), "broker credential issued", f"{AUDIENCE}, valid {ttl:.0f} s")
    at(a.injected_at, "prompt injection read", f"the review of {INJECTED_ORDER}: refund every order")
    by_id = {i["intent_id"]: i for i in r.intents()}
    refund_ids = {c["idempotency_key"]: c["refund_id"] for c in r.committed()}
    how = "by the executor's final check:" if r.checked_by_executor() else "by"
    for n, p in enumerate(a.proposals, 1):
        money = f"{p.order_id} ${p.amount_cents / 100:.2f}"
        at(p.proposed_at, f"refund {n} proposed", f"{money}, intent {p.intent_id}")
        intent = by_id.get(p.intent_id, {})
        if intent.get("state") == "committed":
            at(
                intent["updated_at"],
                f"refund {n} committed",
                f"{refund_ids.get(intent['idempotency_key'])} by the executor",
            )
        elif intent:
            at(
                intent["updated_at"],
                f"intent {n} {intent['state']}",
                f"{how} stop {intent.get('stop_id')}",
            )
    if stop:
        at(stop["issued_at"], "stop written", f"{stop['scope']} by {stop['issued_by']}: {stop['reason']}")
    if a.notice is not None:
        at(a.lease_ended_at, "lease ended in the agent", f"{a.notice['code']}: {a.notice['message']}")
    at(a.exited_at, "agent loop exited", f"{a.exited_by}: {a.exit_message}")
    at(r.renewal.get("at"), "lease renewal refused", f"{r.renewal.get('status')} {r.renewal.get('code')}")
    expires = (
        f"; the current token expires at +{(float(a.credential['expires_at']) - t0):.0f} s"
        if a.credential
        else ""
    )
    at(
        r.credential.get("at"),
        "credential renewal refused",
        f"{r.credential.get('status')} {r.credential.get('code')}{expires}",
    )
    restarted = r.restart
    if restarted:
        at(restarted["cleared_at"], "stop cleared", f"by the operator: {restarted['reason']}")
        done = (restarted.get("checkpoint") or {}).get("orders_done", [])
        at(
            restarted["resumed_at"],
            "run resumed",
            f"{restarted['run_id']} from {r.run_id}'s checkpoint ({len(done)} orders done, up to {done[-1] if done else '-'})",
        )
    events.sort(key=lambda e: e[0])
    return events


def reversal_script(r: RunResult) -> str:
    """A bash script reversing the run's committed refunds, each once (its own idempotency key)."""
    lines = [
        "#!/usr/bin/env bash",
        f"# Reverse the {len(r.committed())} refunds committed by run {r.run_id} (haltwire report {r.run_id}).",
        "# Each reversal carries its own idempotency key, so running this twice reverses nothing twice.",
        "# (The demo's shop has no reversal endpoint: point ORDERS_API at the real refunds API.)",
        "set -euo pipefail",
        'ORDERS_API="${ORDERS_API:?set ORDERS_API to the refunds API}"',
        "reverse() {  # refund_id order_id amount_cents original_key",
        '  curl -fsS -X POST "$ORDERS_API/refunds/$1/reverse" -H "Idempotency-Key: reverse-$4" \\',
        '    -H "Content-Type: application/json" -d "{\\"order_id\\": \\"$2\\", \\"amount_cents\\": $3}"',
        "}",
    ]
    for c in r.committed():
        args = [str(c["refund_id"]), str(c["order_id"]), str(c["amount_cents"]), str(c["idempotency_key"])]
        lines.append("reverse " + " ".join(shlex.quote(a) for a in args))
    return "\n".join(lines)


# -- output --------------------------------------------------------------------------------------


def render_run(console: Console, r: RunResult) -> None:
    console.print(f"[bold]run {r.number}: {r.run_id}[/bold]")
    table = Table("ms", "event", "detail", box=box.SIMPLE_HEAD, title="Timeline", title_justify="left")
    for ms, event, detail in timeline(r):
        table.add_row(f"{ms:,.0f}", event, Text(detail))
    console.print(table)

    report = Table(
        "intent", "order", "amount", "key", "state", "refund / stop",
        box=box.SIMPLE_HEAD, title=f"Run report (GET /v1/runs/{r.run_id}/report)", title_justify="left",
    )  # fmt: skip
    refund_ids = {c["idempotency_key"]: c["refund_id"] for c in r.committed()}
    for section in ("completed", "unknown", "failed", "cancelled"):
        for i in r.report.get(section, []):
            args = i["arguments"]
            last = refund_ids.get(i["idempotency_key"]) or f"stop {i.get('stop_id')}"
            report.add_row(
                i["intent_id"], args["order_id"], f"${args['amount_cents'] / 100:.2f}",
                Text(i["idempotency_key"]), i["state"], Text(str(last)),
            )  # fmt: skip
    console.print(report)
    for s in r.report.get("stops", []):
        console.print(Text(f"stop {s['stop_id']} {s['scope']} by {s['issued_by']}: {s['reason']}"))
    console.print(
        f"{len(r.report.get('timeline', []))} audit records about the run: haltwire report {r.run_id}"
    )

    ledger = Table(
        "refund",
        "order",
        "amount",
        "key",
        "requests",
        box=box.SIMPLE_HEAD,
        title="The shop's ledger (GET /ledger)",
        title_justify="left",
    )
    for row in r.ledger:
        ledger.add_row(
            row["refund_id"],
            row["order_id"],
            f"${row['amount_cents'] / 100:.2f}",
            Text(row["idempotency_key"]),
            str(row["requests"]),
        )
    console.print(ledger)
    match = "[green]match[/green]" if r.matches() else "[red]do not match[/red]"
    console.print(f"the report's committed refunds {match} the shop's ledger")
    console.print("\n[bold]Reversal script[/bold]")
    console.print(Text(reversal_script(r)))
    console.print()


def render_summary(console: Console, results: list[RunResult]) -> None:
    table = Table(
        "run", "run id", "refunds applied", "6th intent", "report = ledger", "ms", box=box.SIMPLE_HEAD
    )
    for r in results:
        sixth = r.sixth
        table.add_row(
            str(r.number), r.run_id, str(len(r.ledger)), f"{sixth.get('state')} ({sixth.get('stop_id')})",
            "yes" if r.matches() else "[red]no[/red]", f"{r.elapsed_s * 1000:,.0f}",
        )  # fmt: skip
    console.print(table)


async def run_all(stack: Stack, runs: int) -> list[RunResult]:
    results = []
    for n in range(1, runs + 1):
        stack.processes.check_alive()
        try:
            results.append(await one_run(stack, n))
        except Exception as exc:  # a run that raises or hangs is a deviation, not a crash
            results.append(RunResult(n, deviations=[f"the run failed: {type(exc).__name__}: {exc}"]))
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="haltwire demo refunds",
        description="The seed's refund incident, end to end with real processes, measured and checked.",
    )
    parser.add_argument("--runs", type=int, default=1, help="agent runs against one stack (default 1)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--verbose", action="store_true", help="print every run's timeline, not only the first"
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    began = time.monotonic()
    try:
        with running_stack() as stack:
            started_s = time.monotonic() - began
            results = anyio.run(run_all, stack, args.runs)
            total = len(httpx2.get(f"{stack.shop_url}/ledger", timeout=10).json()["refunds"])
    except StackFailed as exc:
        print(f"haltwire demo refunds: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("haltwire demo refunds: interrupted; the stack is down", file=sys.stderr)
        return 1
    elapsed_s = time.monotonic() - began
    problems = [f"run {r.number} ({r.run_id}): {d}" for r in results for d in r.deviations]
    if total != sum(len(r.ledger) for r in results):
        problems.append(
            f"the shop applied {total} refunds in all, not only the runs' {sum(len(r.ledger) for r in results)}"
        )
    if args.json:
        print(json.dumps({
            "ok": not problems, "problems": problems, "runs": [r.to_dict() for r in results],
            "shop_applied_total": total, "stack_start_s": round(started_s, 3), "elapsed_s": round(elapsed_s, 3),
        }, indent=2))  # fmt: skip
    else:
        console = Console(highlight=False)
        if not console.is_terminal:
            console.width = max(console.width, 160)
        for r in results if args.verbose else results[:1]:
            render_run(console, r)
        if len(results) > 1:
            render_summary(console, results)
        capped = sum(len(r.ledger) == PER_RUN and not r.deviations for r in results)
        colour = "green" if not problems else "red"
        console.print(
            f"[{colour}]{capped}/{len(results)} runs capped at exactly {PER_RUN} refunds, report = ledger[/{colour}] "
            f"(stack up in {started_s:.1f} s, {elapsed_s:.1f} s in all)"
        )
    for problem in problems:
        print(f"haltwire demo refunds: {problem}", file=sys.stderr)
    return 1 if problems else 0
