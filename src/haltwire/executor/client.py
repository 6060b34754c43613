"""The control plane's intent endpoints as the executor uses them.

``IntentClient`` is the runtime's ``ControlClient`` (runs, leases, the watch: the executor holds
a lease of its own) plus who its token is, claim, check, commit, fail and the restart's
``unknown``. Refusals
raise ``ControlRefused``, anything else ``ControlUnreachable``, as for every control client.

What it records must fit the control plane's limits (``haltwire.limits``), or the call, made,
would stay unrecorded: an error message is cut to a reason's length, and a result past the
body limit is recorded as its size and SHA-256.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any
from urllib.parse import quote

from haltwire.limits import fitted
from haltwire.runtime.client import ControlClient, ControlRefused
from haltwire.watch import WHOAMI_PATH


def _path(intent_id: str, action: str) -> str:
    return f"/v1/intents/{quote(intent_id, safe='')}/{action}"


def _not_kept(outcome: dict[str, Any]) -> dict[str, Any]:
    """A tool result in place of one too large to record: its size and hash, as a tool result."""
    data = json.dumps(outcome, separators=(",", ":")).encode()
    said = (
        f"The tool's result ({len(data)} bytes of JSON, sha256 {hashlib.sha256(data).hexdigest()}) "
        "was larger than the control plane records; it is not kept."
    )
    return {"content": [{"type": "text", "text": said}], "isError": bool(outcome.get("isError"))}


class IntentClient(ControlClient):
    """``async with IntentClient(url, executor_token) as control: ...``"""

    async def whoami(self) -> Any:
        """Who the control plane knows the token as, and whether it is sent every stop (judged by
        ``haltwire.watch.require_every_stop``, as the gateway's watch judges it)."""
        return await self._call("GET", WHOAMI_PATH)

    async def claim(self) -> dict[str, Any] | None:
        """The oldest pending intent, now claimed by this executor; None when none is pending."""
        data = await self._call("POST", "/v1/intents/claim")
        return data if isinstance(data, dict) else None

    async def check(self, intent_id: str) -> dict[str, Any]:
        """The final registry check before performing the call: the intent with its
        ``checked_revision``, or ``ControlRefused`` ``stopped`` (the intent is now cancelled)."""
        result: dict[str, Any] = await self._call("POST", _path(intent_id, "check"))
        return result

    async def commit(self, intent_id: str, outcome: dict[str, Any]) -> dict[str, Any]:
        try:
            result: dict[str, Any] = await self._call(
                "POST", _path(intent_id, "commit"), {"outcome": outcome}
            )
        except ControlRefused as exc:
            if exc.code != "payload_too_large":
                raise
            result = await self._call("POST", _path(intent_id, "commit"), {"outcome": _not_kept(outcome)})
        return result

    async def fail(self, intent_id: str, error: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("POST", _path(intent_id, "fail"), {"error": fitted(error)})
        return result

    async def mark_unknown(self) -> list[dict[str, Any]]:
        """After a restart: every intent this executor had claimed and not settled, now ``unknown``
        (with those an earlier restart left unknown), oldest first."""
        data = await self._call("POST", "/v1/intents/unknown")
        return list(data["intents"])

    async def intents(
        self, *, states: str | None = None, run: str | None = None, limit: int = 1000
    ) -> list[dict[str, Any]]:
        query: dict[str, str | int] = {"limit": limit}
        if states is not None:
            query["state"] = states
        if run is not None:
            query["run"] = run
        data = await self._call("GET", "/v1/intents", params=query)
        return list(data["intents"])
