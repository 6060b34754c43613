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

The package re-exports everything: callers import from ``haltwire.refusal``. ``core`` holds the
value and the codes; ``calls``, ``intents`` and ``network`` hold the builders, by area.
"""

from __future__ import annotations

from haltwire.refusal.calls import (
    agent_suspended,
    budget_exhausted,
    counters_unavailable,
    deadline_exceeded,
    idempotency_conflict,
    lease_expired,
    lease_invalid,
    lease_missing,
    outcome_unknown,
    payload_too_large,
    please_try_again,
    policy_denied,
    registry_unreachable,
    run_steps_exhausted,
    stopped,
    too_many_in_flight,
    tripwire_tripped,
    unauthenticated,
    upstream_unavailable,
)
from haltwire.refusal.core import (
    DEMO_CODES,
    HTTP_STATUS,
    REQUEST_CODES,
    STOP_AND_TELL,
    TERMINAL_CODES,
    TRANSIENT_CODES,
    Refusal,
    for_people,
    iso_utc,
)
from haltwire.refusal.intents import (
    intent_forbidden,
    intent_refused,
    intent_unreadable,
    invalid_intent_id,
    unknown_intent,
)
from haltwire.refusal.network import (
    egress_denied,
    egress_private_address,
    model_request_invalid,
    provider_unavailable,
    proxy_auth_required,
    proxy_request_invalid,
    target_unreachable,
    unknown_model,
)

__all__ = [
    "DEMO_CODES",
    "HTTP_STATUS",
    "REQUEST_CODES",
    "STOP_AND_TELL",
    "TERMINAL_CODES",
    "TRANSIENT_CODES",
    "Refusal",
    "agent_suspended",
    "budget_exhausted",
    "counters_unavailable",
    "deadline_exceeded",
    "egress_denied",
    "egress_private_address",
    "for_people",
    "idempotency_conflict",
    "intent_forbidden",
    "intent_refused",
    "intent_unreadable",
    "invalid_intent_id",
    "iso_utc",
    "lease_expired",
    "lease_invalid",
    "lease_missing",
    "model_request_invalid",
    "outcome_unknown",
    "payload_too_large",
    "please_try_again",
    "policy_denied",
    "provider_unavailable",
    "proxy_auth_required",
    "proxy_request_invalid",
    "registry_unreachable",
    "run_steps_exhausted",
    "stopped",
    "target_unreachable",
    "too_many_in_flight",
    "tripwire_tripped",
    "unauthenticated",
    "unknown_intent",
    "unknown_model",
    "upstream_unavailable",
]
