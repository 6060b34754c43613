"""The timeline of a ``haltwire demo refunds`` run: every measured event, in ms since the agent started.

Read from the agent's own log, the run report (the intents, the stop) and the requests the
demo made after the stop; printed as a table and listed in the JSON.
"""

from __future__ import annotations

from haltwire.demo.refunds_run import RunResult
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
