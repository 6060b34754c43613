"""The timeline of a ``haltwire demo refunds`` run: every measured event, in ms since the agent started.

Read from the agent's own log, the run report (the intents, the stop), the content rule's shadow
firing (its audit record), the page on-call received and the requests the demo made after the
stop; printed as a table and listed in the JSON.
"""

from __future__ import annotations

from haltwire.demo.refunds_run import RunResult
from haltwire.demo.refunds_stack import PAGER
from haltwire.demo.shop import INJECTED_ORDER
from haltwire.demo.support_agent import AUDIENCE


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
    for firing in r.shadow:
        detail = firing["detail"]
        at(
            float(detail["fired_at"]),
            "content tripwire fired (shadow)",
            f"{detail['rule']} would have stopped the run here, before its first refund "
            f"(recorded at +{(float(firing['at']) - t0) * 1000:,.0f} ms)",
        )
    by_id = {i["intent_id"]: i for i in r.intents()}
    refund_ids = {c["idempotency_key"]: c["refund_id"] for c in r.committed()}
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
            at(intent["updated_at"], f"intent {n} {intent['state']}", f"by stop {intent.get('stop_id')}")
    if a.refused:
        n, error = len(a.proposals) + 1, a.refused["error"]
        money = f"{a.refused['order_id']} ${a.refused['amount_cents'] / 100:.2f}"
        at(a.refused["at"], f"refund {n} called", money)
        told = (
            f"{error.get('code')} by tripwire {error.get('tripwire')}"
            if error.get("code") != "stopped"
            else f"the agent's lease ended first (stop {error.get('stop_id')})"
        )
        at(a.refused["answered_at"], f"refund {n} refused at the gateway", f"{told}: no intent written")
    if stop:
        reason = str(stop["reason"]).splitlines()[0]
        at(stop["issued_at"], "stop written", f"{stop['scope']} by {stop['issued_by']}: {reason}")
    if a.notice is not None:
        message = str(a.notice["message"]).splitlines()[0]
        at(a.lease_ended_at, "lease ended in the agent", f"{a.notice['code']}: {message}")
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
    if r.page:
        page = r.page
        at(
            r.paged_at,
            "on-call paged",
            f"{PAGER}: run {page.get('run_id')}, {len(page.get('committed') or [])} committed, "
            f"{len(page.get('cancelled') or [])} cancelled, {page.get('report_url')}",
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
