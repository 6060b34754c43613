"""The ``Refusal`` value, the codes by kind, and their HTTP statuses (see the package docstring)."""

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
