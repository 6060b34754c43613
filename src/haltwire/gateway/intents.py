"""Calls to ``irreversible`` tools become intents: the gateway records them, an executor acts.

A call to an irreversible tool never reaches the upstream from the gateway. ``IntentDesk``
records it with the control plane (``POST /v1/intents``: tool, arguments, run, idempotency
key) and answers the agent with a non-error result naming the intent and its state: the
agent only proposes, and the executor (``haltwire executor``) carries the call out after
checking the stop registry. The key is the client's (``_meta["io.haltwire/idempotency_key"]``)
or derived from (agent, run, tool, arguments) exactly as for bounded tools, so a repeat is
answered with the intent already recorded (the control plane's 200) and the same key with other
arguments is ``idempotency_conflict``.

Fail closed: a control plane that cannot be reached or answers 5xx refuses the call
``registry_unreachable`` (retryable: the key makes a retry safe even if the intent was recorded);
the call is never forwarded instead. All of this only with ``[intents] enabled`` (which needs
``[control]``); otherwise irreversible calls are forwarded under their label's deadline.

The gateway's own tool ``haltwire_intent`` (offered with intents enabled) reads an intent's
state for the agent that proposed it (``GET /v1/intents/{id}`` as the gateway).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import quote

import anyio
import httpx2
import mcp.types as types

from haltwire import refusal
from haltwire.config import ControlLink, UpstreamConfig
from haltwire.errors import describe
from haltwire.gateway.idempotency import client_key, derived_key
from haltwire.identity import Identity
from haltwire.meta import KEY_META, LABEL_META
from haltwire.refusal import Refusal
from haltwire.replicas import ReplicaHttp, Unreachable
from haltwire.upstreams.labels import Label

log = logging.getLogger("haltwire.gateway")

#: The gateway's own tool that reads an intent's state.
INTENT_TOOL: Final = "haltwire_intent"
#: The longest ``intent_id`` the status tool accepts.
MAX_INTENT_ID_CHARS: Final = 256
#: The most a request to the control plane may take, whatever the call's deadline.
CONTROL_TIMEOUT_S: Final = 10.0

STATUS_TOOL: Final = types.Tool(
    name=INTENT_TOOL,
    description=(
        "Read the state of an intent this gateway recorded for one of your calls to an "
        "irreversible tool (pending, awaiting_approval, claimed, committed, failed, cancelled, ...)."
    ),
    input_schema={
        "type": "object",
        "properties": {"intent_id": {"type": "string", "minLength": 1, "maxLength": MAX_INTENT_ID_CHARS}},
        "required": ["intent_id"],
    },
    annotations=types.ToolAnnotations(read_only_hint=True),
).model_copy(update={"meta": {LABEL_META: "cancellable"}})

#: The intent fields an agent gets back.
_SHOWN: Final = ("intent_id", "state", "tool", "idempotency_key", "run_id")
_STATUS_SHOWN: Final = (*_SHOWN, "needs_approval", "stop_id", "outcome", "error", "decision_reason")


def _control_refusal(body: dict[str, Any], status: int) -> Refusal:
    """``intent_refused``, naming the control plane's reason for its 4xx."""
    error = body.get("error")
    message = (error.get("message") if isinstance(error, dict) else None) or f"HTTP {status}"
    return refusal.intent_refused(message)


def _json(response: httpx2.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


class IntentDesk:
    """Policy for irreversible calls, with a small HTTP client to the control plane."""

    def __init__(self, link: ControlLink, upstreams: list[UpstreamConfig]) -> None:
        self.link = link
        # (upstream, its tool name) pairs whose intents wait for an operator.
        self._approval = frozenset((u.name, t) for u in upstreams for t in u.approval)
        self._http = ReplicaHttp(link.urls, link.resolve_token(), CONTROL_TIMEOUT_S)

    async def aclose(self) -> None:
        await self._http.aclose()

    def catalogue(self, tools: list[types.Tool], label_of: Callable[[str], Label | None]) -> list[types.Tool]:
        """The tools as offered: irreversible ones without their ``outputSchema`` (a call answers
        an intent, never the tool's output, and clients validate results against the schema),
        and ``haltwire_intent``."""
        offered = [
            t.model_copy(update={"output_schema": None}) if label_of(t.name) == "irreversible" else t
            for t in tools
        ]
        return [*offered, STATUS_TOOL]

    def needs_approval(self, upstream: str, tool: str) -> bool:
        return (upstream, tool) in self._approval

    async def propose(
        self,
        identity: Identity,
        run: str | None,
        upstream: str,
        tool: str,
        exposed: str,
        arguments: dict[str, Any] | None,
        meta: dict[str, Any] | None,
        deadline_s: float,
    ) -> dict[str, Any] | Refusal:
        """Record the call as an intent: a tool result naming it, or the refusal.

        ``tool`` is the upstream's name for it, ``exposed`` the gateway's; the intent records
        ``exposed`` (the name stops and the agent know). Raises ``InvalidKey`` for a malformed
        client key, as for bounded tools.
        """
        key = client_key(meta)
        if key is None:
            key = derived_key(identity.agent, identity.tenant, run, exposed, arguments)
        tag = {KEY_META: key}
        body = {
            "run_id": run,
            "agent": identity.agent,
            "tenant": identity.tenant,
            "version": identity.version,
            "tool": exposed,
            "arguments": arguments or {},
            "idempotency_key": key,
            "needs_approval": self.needs_approval(upstream, tool),
        }
        try:
            with anyio.fail_after(min(deadline_s, CONTROL_TIMEOUT_S)):
                response = await self._http.request("POST", "/v1/intents", json=body)
        except (TimeoutError, Unreachable) as exc:
            # Possibly recorded: a retry with the same key answers that intent, never a second one.
            log.warning("control plane: recording an intent failed: %s", describe(exc))
            return _with_meta(refusal.registry_unreachable(), tag)
        answer = _json(response)
        if response.status_code in (200, 201) and isinstance(answer, dict):
            return _proposed(answer, key)
        error = answer.get("error") if isinstance(answer, dict) else None
        error = error if isinstance(error, dict) else {}
        code = error.get("code")
        if response.status_code == 409 and code == "idempotency_conflict":
            return _with_meta(refusal.idempotency_conflict(key), tag)
        if response.status_code == 409 and code == "stopped":
            stopped = refusal.stopped(str(error["scope"]), str(error["stop_id"]), str(error["reason"]))
            return _with_meta(stopped, tag)
        if not isinstance(answer, dict):
            log.warning("control plane: recording an intent: HTTP %d without a JSON body", response.status_code)
            return _with_meta(refusal.registry_unreachable(), tag)
        log.error("control plane refused an intent: HTTP %d %s", response.status_code, error)
        return _with_meta(_control_refusal(answer, response.status_code), tag)

    async def status(
        self, identity: Identity, arguments: dict[str, Any] | None, deadline_s: float
    ) -> dict[str, Any] | Refusal:
        """The ``haltwire_intent`` tool: the state of one of this agent's intents."""
        intent_id = (arguments or {}).get("intent_id")
        if not isinstance(intent_id, str) or not 1 <= len(intent_id) <= MAX_INTENT_ID_CHARS:
            return refusal.invalid_intent_id(MAX_INTENT_ID_CHARS)
        try:
            with anyio.fail_after(min(deadline_s, CONTROL_TIMEOUT_S)):
                response = await self._http.request("GET", f"/v1/intents/{quote(intent_id, safe='')}")
        except (TimeoutError, Unreachable) as exc:
            log.warning("control plane: reading intent %s failed: %s", intent_id, describe(exc))
            return refusal.registry_unreachable()
        answer = _json(response)
        if response.status_code == 404:
            return refusal.unknown_intent(intent_id)
        if response.status_code != 200 or not isinstance(answer, dict):
            if not isinstance(answer, dict):
                return refusal.registry_unreachable()
            return refusal.intent_unreadable(intent_id)
        # The control plane's own answers to an agent (``control.access.ownership``): another
        # tenant's intent is as unknown, another agent's of the same tenant forbidden.
        if answer.get("tenant") != identity.tenant:
            return refusal.unknown_intent(intent_id)
        if answer.get("agent") != identity.agent:
            return refusal.intent_forbidden(intent_id, identity.agent)
        shown = {k: answer.get(k) for k in _STATUS_SHOWN}
        text = f"Intent {intent_id} for {answer.get('tool')} is {answer.get('state')}."
        return {
            "content": [{"type": "text", "text": text}],
            "structuredContent": {"intent": shown},
        }


def _with_meta(r: Refusal, extra: dict[str, Any]) -> Refusal:
    return dataclasses.replace(r, meta=(*r.meta, *extra.items()))


def _proposed(intent: dict[str, Any], key: str) -> dict[str, Any]:
    shown = {k: intent.get(k) for k in _SHOWN}
    text = (
        f"Recorded intent {shown['intent_id']} for {shown['tool']} (state {shown['state']}); "
        "an executor will carry it out: this call did not perform it."
    )
    return {
        "content": [{"type": "text", "text": text}],
        "structuredContent": {"intent": shown},
        "_meta": {KEY_META: key},
    }
