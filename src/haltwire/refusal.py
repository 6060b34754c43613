"""Refusals: what an enforcement point answers instead of a tool's result.

A refusal has two readers. The model reads one sentence of text; client code reads
``structuredContent.error``. Both must say the same thing, so both come from one
``Refusal`` value. A refusal is returned as a tool result with ``isError`` set, never
raised: the MCP SDK turns a raised error into bare text and drops its data, the
``retryable`` flag with it (``tests/test_refusal.py`` pins that SDK behaviour).

Every refusal is built here, by one named function per situation, and every code is of
one kind, each with its own wording rule (``tests/test_refusal.py`` finds the builders
and checks every code they give):

- terminal (``retryable: false``): the words tell the agent to stop and tell the user the
  task is incomplete, and never invite another attempt: an agent that obeys "please try
  again" keeps calling until something else stops it;
- transient (``retryable: true``): the words say how long to wait (``retry_after_s``);
- request (``retryable: false``): the call cannot be answered as made (a body too large,
  a malformed or foreign question to the ``haltwire_intent`` tool). Nothing was stopped,
  so the words say what is wrong without telling the agent to stop; the same call gets the
  same answer, so they never invite another attempt either;
- demo: ``please_try_again``, the failure mode ``haltwire demo loop`` shows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

STOP_AND_TELL: Final = "so stop calling tools and tell the user the task is incomplete."

#: Codes whose refusal is final for the call that received it.
TERMINAL_CODES: Final = frozenset(
    {
        "budget_exhausted",
        "agent_suspended",
        "stopped",
        "lease_expired",
        "lease_invalid",
        "policy_denied",
        "tripwire_tripped",
        "deadline_exceeded",
        "unauthenticated",
        "idempotency_conflict",
        "outcome_unknown",
        "intent_refused",
        "egress_denied",
    }
)

#: Codes for conditions that clear by themselves; these carry ``retry_after_s``.
TRANSIENT_CODES: Final = frozenset(
    {"too_many_in_flight", "counters_unavailable", "upstream_unavailable", "registry_unreachable"}
)

#: Codes for a call that cannot be answered as made; neither a stop nor transient.
REQUEST_CODES: Final = frozenset(
    {
        "payload_too_large",
        "invalid_request",
        "unknown_intent",
        "intent_unreadable",
        "forbidden",
        "unknown_model",
        "proxy_auth_required",
        "proxy_request_invalid",
    }
)

#: The refusal the seed warns against, kept for ``haltwire demo loop`` to show what it does.
DEMO_CODES: Final = frozenset({"rate_limited"})

#: HTTP status for each code when it is answered at the HTTP edge instead of as a tool result.
HTTP_STATUS: Final[dict[str, int]] = {
    "unauthenticated": 401,
    "agent_suspended": 403,
    "stopped": 403,
    "policy_denied": 403,
    "lease_expired": 403,
    "lease_invalid": 403,
    "tripwire_tripped": 403,
    "budget_exhausted": 429,
    "too_many_in_flight": 429,
    "counters_unavailable": 503,
    "upstream_unavailable": 503,
    "registry_unreachable": 503,
    "deadline_exceeded": 504,
    "idempotency_conflict": 409,
    "outcome_unknown": 409,
    "intent_refused": 403,
    "payload_too_large": 413,
    # A model call naming a model no [[models]] entry routes (OpenAI answers 404 too).
    "unknown_model": 404,
    # The control plane's statuses for the same codes.
    "invalid_request": 422,
    "unknown_intent": 404,
    "forbidden": 403,
    # The control plane answered the gateway with something it cannot pass on.
    "intent_unreadable": 502,
    "rate_limited": 429,
    # The egress proxy's (haltwire.egress): a host its profile does not allow, no credentials,
    # a request a forward proxy cannot serve.
    "egress_denied": 403,
    "proxy_auth_required": 407,
    "proxy_request_invalid": 400,
}


def iso_utc(epoch_s: float) -> str:
    """An ISO 8601 UTC timestamp with a ``Z`` suffix, to the second."""
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Refusal:
    """One refusal. ``message`` is the single sentence both readers get."""

    code: str
    message: str
    retryable: bool
    resets_at: str | None = None
    retry_after_s: float | None = None
    extra: tuple[tuple[str, Any], ...] = ()
    #: The tool result's ``_meta`` (the idempotency key the gateway used, say).
    meta: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def from_error(cls, error: Mapping[str, Any]) -> Refusal:
        """The refusal whose ``error()`` this is: a recorded refusal, replayed word for word."""
        fields = dict(error)
        return cls(
            code=fields.pop("code"),
            message=fields.pop("message"),
            retryable=fields.pop("retryable"),
            resets_at=fields.pop("resets_at", None),
            retry_after_s=fields.pop("retry_after_s", None),
            extra=tuple(fields.items()),
        )

    def error(self) -> dict[str, Any]:
        """The ``error`` object, as it appears in ``structuredContent`` and HTTP bodies."""
        out: dict[str, Any] = {"code": self.code, "message": self.message, "retryable": self.retryable}
        if self.resets_at is not None:
            out["resets_at"] = self.resets_at
        if self.retry_after_s is not None:
            out["retry_after_s"] = self.retry_after_s
        out.update(self.extra)
        return out

    def tool_result(self) -> dict[str, Any]:
        """The refusal as an MCP ``CallToolResult`` in wire form."""
        out: dict[str, Any] = {
            "isError": True,
            "content": [{"type": "text", "text": self.message}],
            "structuredContent": {"error": self.error()},
        }
        if self.meta:
            out["_meta"] = dict(self.meta)
        return out

    def http_body(self) -> bytes:
        return json.dumps({"error": self.error()}, separators=(",", ":")).encode()

    @property
    def http_status(self) -> int:
        # Every code here has an entry; the default is for a recorded refusal (``from_error``)
        # written by a version with other codes.
        return HTTP_STATUS.get(self.code, 403 if not self.retryable else 503)


def for_people(r: Refusal) -> str:
    """``r``'s sentence without the words for a model: the control plane answers people and runtimes."""
    tail = f", {STOP_AND_TELL}"
    return f"{r.message.removesuffix(tail)}." if r.message.endswith(tail) else r.message


def _terminal(code: str, clause: str, **fields: Any) -> Refusal:
    return Refusal(code=code, message=f"{clause}, {STOP_AND_TELL}", retryable=False, **fields)


def _request(code: str, sentence: str) -> Refusal:
    return Refusal(code=code, message=sentence, retryable=False)


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
    return _terminal(
        "tripwire_tripped", clause, extra=(("tripwire", name), ("scope", scope or f"run:{run}"))
    )


def intent_refused(detail: str) -> Refusal:
    """A 4xx the control plane gave a new intent, other than conflict and stopped: not transient."""
    return _terminal(
        "intent_refused", f"The control plane refused to record this call ({detail}) and it was not made"
    )


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


def provider_unavailable(provider: str, retry_after_s: float = 5.0) -> Refusal:
    """``upstream_unavailable`` for a model call: its provider (``[[models]]``) cannot be reached."""
    return Refusal(
        code="upstream_unavailable",
        message=(
            f"The model provider {provider} cannot be reached right now, "
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


def egress_denied(run: str, target: str, profile: str) -> Refusal:
    """The egress proxy's profile for the run does not allow ``target`` (``HOST:PORT``)."""
    if profile == "none":
        clause = f"Run {run} may reach nothing through the egress proxy (its profile is none) and {target} was not contacted"
    else:
        clause = f"Run {run} may not reach {target} through the egress proxy (profile {profile})"
    return _terminal("egress_denied", clause, extra=(("run", run), ("target", target), ("profile", profile)))


def egress_private_address(run: str, target: str, address: str, profile: str) -> Refusal:
    """``egress_denied``: ``target``'s name resolves to a private, loopback or otherwise non-public
    ``address`` that the profile does not list by address."""
    return _terminal(
        "egress_denied",
        f"Run {run} may not reach {target} through the egress proxy because it resolves to the "
        f"non-public address {address} and profile {profile} does not list that address",
        extra=(("run", run), ("target", target), ("profile", profile), ("address", address)),
    )


def proxy_auth_required(why: str) -> Refusal:
    """No usable proxy credentials (answered 407 with ``Proxy-Authenticate``)."""
    return _request(
        "proxy_auth_required",
        f"The egress proxy needs the run's lease token as proxy credentials ({why}): send it as the "
        "password of Proxy-Authorization Basic (HTTPS_PROXY=http://RUN:TOKEN@HOST:PORT) or as a Bearer token.",
    )


def proxy_request_invalid(why: str) -> Refusal:
    """A request a forward proxy cannot serve: not an absolute http URI nor a CONNECT, say."""
    return _request("proxy_request_invalid", f"The egress proxy cannot forward this request ({why}).")


def target_unreachable(target: str, retry_after_s: float = 5.0) -> Refusal:
    """``upstream_unavailable`` at the egress proxy: ``target`` does not resolve or does not answer."""
    return Refusal(
        code="upstream_unavailable",
        message=(
            f"The egress proxy cannot reach {target} right now, "
            f"so wait {retry_after_s:g} s and then send this request again."
        ),
        retryable=True,
        retry_after_s=retry_after_s,
    )


def payload_too_large(limit: int) -> Refusal:
    return _request(
        "payload_too_large", f"The request body is larger than the {limit} bytes this gateway accepts."
    )


def unknown_model(model: str) -> Refusal:
    """A model call naming a model no ``[[models]]`` entry of the gateway routes."""
    return _request("unknown_model", f"No model provider of this gateway serves the model {model!r}.")


def model_request_invalid(why: str) -> Refusal:
    """A model call whose body the gateway cannot route (``invalid_request``)."""
    return _request("invalid_request", f"This model request cannot be routed ({why}).")


def invalid_intent_id(max_chars: int) -> Refusal:
    """``haltwire_intent`` called without a usable ``intent_id``."""
    return _request("invalid_request", f"intent_id must be a string of 1 to {max_chars} characters.")


def unknown_intent(intent_id: str) -> Refusal:
    return _request("unknown_intent", f"No intent has the id {intent_id}.")


def intent_unreadable(intent_id: str) -> Refusal:
    """The control plane answered the gateway's read of an intent with a 4xx other than 404."""
    return _request("intent_unreadable", f"The control plane did not give intent {intent_id}.")


def intent_forbidden(intent_id: str, who: str) -> Refusal:
    """An intent another agent than ``who`` proposed: the answer reveals nothing of it."""
    return _request("forbidden", f"Intent {intent_id} belongs to another agent than {who}.")


def please_try_again(retry_after_s: float = 0.0) -> Refusal:
    """The refusal style the seed warns against. Only ``haltwire demo loop`` configures it."""
    return Refusal(
        code="rate_limited",
        message="Rate limited. Please try again.",
        retryable=True,
        retry_after_s=retry_after_s,
    )
