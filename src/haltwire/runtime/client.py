"""The control plane's API as an agent runtime uses it: runs, lease renewals, checkpoints, the watch.

A thin typed client over ``httpx2``. Every answer the control plane refuses (a 4xx, or 501
for a feature it is not configured with, with an ``error`` body) raises ``ControlRefused``
carrying that body; anything else that goes wrong on the way (connection refused, timeout,
another 5xx) raises ``ControlUnreachable``. The lease
treats the two differently: a refusal ends the run, an unreachable control plane only fails
to extend it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import httpx2

from haltwire.replicas import ReplicaHttp, Unreachable
from haltwire.sse import sse_events
from haltwire.tokens import Grant


class ControlUnreachable(Exception):
    """The control plane did not answer, or answered 5xx. The lease is not extended."""


class ControlRefused(Exception):
    """The control plane refused (4xx). ``error`` is its ``{"code", "message", ...}`` body."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        super().__init__(f"{status} {error.get('code', '?')}: {error.get('message', '')}")
        self.status = status
        self.error = error

    @property
    def code(self) -> str:
        return str(self.error.get("code", ""))


@dataclass(frozen=True, slots=True)
class Registration:
    run: dict[str, Any]
    grant: Grant
    #: The latest checkpoint of the run this one resumes from, if any.
    checkpoint: dict[str, Any] | None = None


@dataclass(slots=True)
class Renewals:
    granted: dict[str, Grant] = field(default_factory=dict)
    refused: dict[str, dict[str, Any]] = field(default_factory=dict)


class ControlClient:
    """``async with ControlClient(url, token) as control: ...`` (an agent-role token).

    ``url`` is the control plane's URL, or a list of its replicas' URLs: requests go to the
    replica that answered last, and one that fails is left for the next (``haltwire.replicas``).
    """

    def __init__(self, url: str | Sequence[str], token: str, *, timeout_s: float = 5.0) -> None:
        self._http = ReplicaHttp(url, token, httpx2.Timeout(timeout_s))
        self.replicas = self._http.replicas

    @property
    def url(self) -> str:
        """The replica in use."""
        return self.replicas.current

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(
        self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None
    ) -> Any:
        try:
            r = await self._http.request(method, path, json=body, params=params)
        except Unreachable as exc:
            raise ControlUnreachable(str(exc)) from exc
        if r.status_code == 204:
            return None
        try:
            data = r.json()
        except ValueError:
            raise ControlUnreachable(f"{method} {path}: HTTP {r.status_code} without a JSON body") from None
        if r.status_code >= 400:
            error = data.get("error") if isinstance(data, dict) else None
            raise ControlRefused(r.status_code, error if isinstance(error, dict) else {"message": str(data)})
        return data

    async def register_run(
        self,
        *,
        run_id: str | None = None,
        tools: Sequence[str] = (),
        agent_class: str = "default",
        resume_from: str | None = None,
    ) -> Registration:
        body: dict[str, Any] = {"tools": list(tools), "agent_class": agent_class}
        if run_id is not None:
            body["run_id"] = run_id
        if resume_from is not None:
            body["resume_from"] = resume_from
        data = await self._call("POST", "/v1/runs", body)
        return Registration(data["run"], Grant.from_json(data["lease"]), data.get("checkpoint"))

    async def renew(self, run_id: str) -> Grant:
        return Grant.from_json(await self._call("POST", f"/v1/runs/{run_id}/lease"))

    async def renew_many(self, run_ids: Sequence[str]) -> Renewals:
        """One request for many runs (a runtime hosting many runs)."""
        data = await self._call("POST", "/v1/leases/renew", {"runs": list(run_ids)})
        return Renewals(
            {run: Grant.from_json(g) for run, g in data.get("leases", {}).items()},
            dict(data.get("refused", {})),
        )

    async def credential(self, run_id: str, audience: str) -> dict[str, Any]:
        """A run credential from the broker: ``{"token", "jti", "audience", "issued_at", "expires_at", "kid"}``."""
        result: dict[str, Any] = await self._call(
            "POST", f"/v1/runs/{run_id}/credentials", {"audience": audience}
        )
        return result

    async def end_run(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("POST", f"/v1/runs/{run_id}/end")
        return result

    async def save_checkpoint(self, run_id: str, data: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("PUT", f"/v1/runs/{run_id}/checkpoint", {"data": data})
        return result

    async def latest_checkpoint(self, run_id: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self._call("GET", f"/v1/runs/{run_id}/checkpoint")
        except ControlRefused as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def watch(self, since: int, silence_s: float = 30.0) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Registry changes after revision ``since`` as ``(kind, change)``, until the stream ends.

        Heartbeats are consumed here; a stream silent for ``silence_s`` (no event, no
        heartbeat) is a dead one and raises ``ControlUnreachable``. The caller reconnects
        (from the last revision it saw).
        """
        headers = {"Last-Event-ID": str(since)}
        url = self.replicas.current
        try:
            async with self._http.http.stream(
                "GET", f"{url}/v1/watch", headers=headers, timeout=httpx2.Timeout(10.0, read=silence_s)
            ) as response:
                if response.status_code != 200:
                    raise ControlUnreachable(f"GET /v1/watch: HTTP {response.status_code}")
                async for event in sse_events(response.aiter_lines()):
                    if event.kind in ("stop", "clear"):
                        yield event.kind, json.loads(event.data)
        except (httpx2.HTTPError, ControlUnreachable) as exc:
            self.replicas.failed(url)  # the caller's next watch follows the next replica
            if isinstance(exc, ControlUnreachable):
                raise
            raise ControlUnreachable(f"GET /v1/watch: {type(exc).__name__}: {exc}") from exc
