"""Refusals about intents: the two-step calls the gateway records at the control plane."""

from __future__ import annotations

from haltwire.refusal.core import Refusal, _request, _terminal


def intent_refused(detail: str) -> Refusal:
    """A 4xx the control plane gave a new intent, other than conflict and stopped: not transient."""
    return _terminal(
        "intent_refused", f"The control plane refused to record this call ({detail}) and it was not made"
    )


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
