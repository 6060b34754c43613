"""What ``haltwire demo refunds`` prints of a run: its JSON, or the timeline, the run report beside
the shop's own ledger, the page on-call received and the reversal script; the summary table
of many runs; and the replay of the gateway's call log.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from haltwire.demo.oncall import page_lines
from haltwire.demo.refunds_backtest import Backtest
from haltwire.demo.refunds_reversal import reversal_script
from haltwire.demo.refunds_run import RunResult
from haltwire.demo.refunds_timeline import timeline


def run_json(r: RunResult) -> dict[str, Any]:
    """The run as ``--json`` prints it."""
    refused, stop, shadow, page = r.refused, r.stop, r.shadow_firing, r.page
    return {
        "run": r.number,
        "run_id": r.run_id,
        "ok": r.ok,
        "deviations": r.deviations,
        "applied": len(r.ledger),
        "proposed": len(r.agent.proposals),
        "proposals": [
            {k: v for k, v in asdict(p).items() if k in ("order_id", "amount_cents", "intent_id", "state")}
            for p in r.agent.proposals
        ],
        "committed": r.committed(),
        "ledger": r.ledger_rows(),
        "report_matches_ledger": r.matches(),
        "intents": len(r.intents()),
        "sixth": {
            "order_id": refused.get("order_id"),
            "refused": refused.get("error"),
        },
        "stop": {k: stop.get(k) for k in ("stop_id", "scope", "issued_by", "reason", "issued_at")},
        "shadow_firing": {
            "rule": (shadow.get("detail") or {}).get("rule"),
            "actor": shadow.get("actor"),
            "fired_at": (shadow.get("detail") or {}).get("fired_at"),
            "recorded_at": shadow.get("at"),
            "reason": shadow.get("reason"),
        },
        "first_committed_at": r.first_committed_at(),
        "page": {
            "received_at": r.paged_at,
            **{k: page.get(k) for k in ("page_id", "event", "subject", "summary", "run_id", "rule", "actor",
                                          "report_url")},
            "committed": [i["intent_id"] for i in page.get("committed") or []],
            "cancelled": [i["intent_id"] for i in page.get("cancelled") or []],
            "trigger": [t["action"] for t in page.get("trigger") or []],
        },
        "lease_notice": r.agent.notice,
        "agent_exited_by": r.agent.exited_by,
        "renewal_refused": r.renewal,
        "credential_refused": r.credential,
        "restart": {k: v for k, v in r.restart.items() if k in ("reason", "run_id", "checkpoint")},
        "last_checkpoint": r.agent.checkpoint,
        "timeline": [{"ms": round(ms, 1), "event": e, "detail": d} for ms, e, d in timeline(r)],
        "elapsed_s": round(r.elapsed_s, 3),
    }


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
    console.print("\n[bold]The page on-call received[/bold] (the webhook receiver's output)")
    console.print(Text("\n".join(page_lines(r.page)) if r.page else "no page"))
    console.print("\n[bold]Reversal script[/bold]")
    console.print(Text(reversal_script(r)))
    console.print()


def render_summary(console: Console, results: list[RunResult]) -> None:
    table = Table(
        "run", "run id", "refunds applied", "6th refund", "report = ledger", "paged", "ms", box=box.SIMPLE_HEAD
    )
    for r in results:
        error = r.refused.get("error") or {}
        table.add_row(
            str(r.number), r.run_id, str(len(r.ledger)), f"{error.get('code')} ({error.get('tripwire')})",
            "yes" if r.matches() else "[red]no[/red]", "yes" if r.page else "[red]no[/red]",
            f"{r.elapsed_s * 1000:,.0f}",
        )  # fmt: skip
    console.print(table)


def render_backtest(console: Console, bt: Backtest, run_id: str, kept: tuple[Path, Path] | None) -> None:
    """The replay of the call log: whether it matched, and the first run's firings."""
    console.print("\n[bold]The gateway's call log, replayed[/bold] (haltwire tripwires test)")
    verdict = "the same firings at the same calls as live" if bt.same else "[red]firings differ from live[/red]"
    console.print(f"{bt.calls} calls replayed through the gateway's {bt.rules} tripwires: {verdict}")
    for f in bt.firings:
        if f["run"] == run_id:
            seen = "live only" if f.get("replayed") is False else ("as live" if f["in_log"] else "[red]not live[/red]")
            console.print(f"  {f['rule']} ({f['mode']}) at call {f['index']}, {f['tool']}: {seen}")
    if kept:
        config, log = kept
        console.print(f"kept {config} and {log}; replay them with")
        console.print(Text(f"  haltwire tripwires test --config {config} --log {log} --expect-same"))
