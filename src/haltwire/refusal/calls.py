"""Refusals of a tool call at the gateway: budgets, stops, leases, tripwires, deadlines,
idempotency, and the transient conditions that clear by themselves."""

from __future__ import annotations

from haltwire.refusal.core import Refusal, _request, _terminal, iso_utc


def budget_exhausted(who: str, budget: int, resets_at_s: float, tool: str | None = None) -> Refusal:
    resets = iso_utc(resets_at_s)
    what = f"all {budget} calls to {tool}" if tool else f"all {budget} tool calls"
    return _terminal(
        "budget_exhausted",
        f"{who} has used {what} allowed until {resets} and every further call is refused until then",
        resets_at=resets,
    )


def run_steps_exhausted(run: str, steps: int) -> Refusal:
    """``budget_exhausted`` for a run: it has no reset time, the run is over."""
    return _terminal(
        "budget_exhausted",
        f"Run {run} has made all {steps} tool calls a run is allowed",
        extra=(("run", run),),
    )


def agent_suspended(who: str, by: str = "an operator") -> Refusal:
    return _terminal("agent_suspended", f"{who} is suspended by {by}")


def deadline_exceeded(tool: str, deadline_s: float, *, irreversible: bool = False) -> Refusal:
    """A call cut off at its deadline. For an irreversible tool the outcome is unknown, not failed:
    the action may have happened before the cut, and an agent that takes it for a failure
    would do it twice."""
    if irreversible:
        return _terminal(
            "deadline_exceeded",
            f"The call to {tool} did not finish within {deadline_s:g} s and was cancelled with its "
            "outcome unknown: the action may or may not have happened and must not be repeated blindly",
            extra=(("outcome", "unknown"),),
        )
    return _terminal(
        "deadline_exceeded",
        f"The call to {tool} did not finish within {deadline_s:g} s and was cancelled "
        "with its outcome unknown",
    )


def idempotency_conflict(key: str) -> Refusal:
    return _terminal(
        "idempotency_conflict",
        f"The idempotency key {key} was first used with different arguments and this call was not made",
        extra=(("idempotency_key", key),),
    )


def outcome_unknown(tool: str, key: str) -> Refusal:
    """A repeat of a call that has no recorded outcome: still in flight, or cut off by a crash or a
    disconnect. Making it again could apply it twice, so it is not made."""
    return _terminal(
        "outcome_unknown",
        f"An earlier call to {tool} with the idempotency key {key} is still in flight or ended "
        "with its outcome unknown and this call was not made",
        extra=(("outcome", "unknown"), ("idempotency_key", key)),
    )


def unauthenticated(reason: str) -> Refusal:
    return _terminal("unauthenticated", f"This request is not authenticated ({reason})")


def stopped(scope: str, stop_id: str, reason: str) -> Refusal:
    return _terminal(
        "stopped",
        f"Work in scope {scope} was stopped by an operator ({reason})",
        extra=(("scope", scope), ("stop_id", stop_id), ("reason", reason)),
    )


def lease_expired(run: str) -> Refusal:
    return _terminal("lease_expired", f"The lease of run {run} has expired")


def lease_invalid(why: str) -> Refusal:
    return _terminal("lease_invalid", f"The lease presented is not valid ({why})")


def lease_missing(who: str) -> Refusal:
    """``lease_invalid`` for a call with no lease at all, naming the two ways to fix it."""
    return _terminal(
        "lease_invalid",
        f"{who} sent no lease: its tool calls must carry the lease token of a run registered with "
        "the control plane (in the call's _meta or a Haltwire-Lease header), or the gateway's "
        f'config must set lease = "optional" for {who}',
    )


def policy_denied(who: str, tool: str) -> Refusal:
    return _terminal("policy_denied", f"{who} may not call {tool}")


def tripwire_tripped(name: str, run: str, *, scope: str | None = None, detail: str | None = None) -> Refusal:
    """A tripwire stopped ``run`` (or, with ``scope``, the work in that scope: a tenant, an agent);
    ``detail``: what it measured."""
    what = f"work in scope {scope}" if scope is not None else f"run {run}"
    clause = f"Tripwire {name} stopped {what}" + (f" ({detail})" if detail else "")
    return _terminal("tripwire_tripped", clause, extra=(("tripwire", name), ("scope", scope or f"run:{run}")))


def too_many_in_flight(who: str, cap: int, retry_after_s: float = 1.0) -> Refusal:
    return Refusal(
        code="too_many_in_flight",
        message=(
            f"{who} already has {cap} tool calls in flight, the most allowed at once, "
            f"so wait {retry_after_s:g} s for one to finish and then send this call again."
        ),
        retryable=True,
        retry_after_s=retry_after_s,
    )


def counters_unavailable(retry_after_s: float = 5.0) -> Refusal:
    return Refusal(
        code="counters_unavailable",
        message=(
            "The gateway cannot reach its call counters and admits no calls until they are back, "
            f"so wait {retry_after_s:g} s and then send this call again."
        ),
        retryable=True,
        retry_after_s=retry_after_s,
    )


def upstream_unavailable(upstream: str, retry_after_s: float = 5.0) -> Refusal:
    return Refusal(
        code="upstream_unavailable",
        message=(
            f"The tool server {upstream} cannot be reached right now, "
            f"so wait {retry_after_s:g} s and then send this call again."
        ),
        retryable=True,
        retry_after_s=retry_after_s,
    )


def registry_unreachable(retry_after_s: float = 5.0, point: str = "gateway") -> Refusal:
    """``point``: which enforcement point lost touch (``gateway``, ``egress proxy``)."""
    what = "calls" if point == "gateway" else "requests"
    return Refusal(
        code="registry_unreachable",
        message=(
            f"The {point} has lost touch with the stop registry and admits no {what} until it is back, "
            f"so wait {retry_after_s:g} s and then send this call again."
        ),
        retryable=True,
        retry_after_s=retry_after_s,
    )


def payload_too_large(limit: int) -> Refusal:
    return _request(
        "payload_too_large", f"The request body is larger than the {limit} bytes this gateway accepts."
    )


def please_try_again(retry_after_s: float = 0.0) -> Refusal:
    """The refusal style the seed warns against. Only ``haltwire demo loop`` configures it."""
    return Refusal(
        code="rate_limited",
        message="Rate limited. Please try again.",
        retryable=True,
        retry_after_s=retry_after_s,
    )
