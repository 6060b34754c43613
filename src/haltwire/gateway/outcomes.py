"""Telling the control plane what a stop did to the calls it found in flight, for the run report.

When a stop reaches a call of a run in flight (``haltwire.gateway.inflight``), the gateway cuts
it or lets it finish by the tool's label, then, once the call has ended, queues its outcome here.
``CallReports.run`` (a task owned by the gateway's start-up task group) sends what is queued as
``POST /v1/runs/{run}/calls``, each request one transaction at the control plane.

Best effort, and never on the call path: ``record`` only puts the outcome in a bounded queue
(full: the outcome is logged and dropped, never waited for). A request that fails (control plane
unreachable, a 5xx) is retried with the same call ids, which the control plane records once,
with a doubling wait up to ``RETRY_MAX_S``, for ``RETRY_FOR_S`` in all; a 4xx is an answer
(an unknown run, say) and is not repeated. An outcome given up on, or still queued at shutdown,
is logged with its run, call and stop: the log is the record of last resort.
"""

from __future__ import annotations

import logging
from typing import Any, Final
from urllib.parse import quote

import anyio
import anyio.abc

from haltwire.config import ControlLink
from haltwire.errors import describe
from haltwire.limits import MAX_CALLS_PER_REPORT
from haltwire.replicas import ReplicaHttp, Unreachable
from haltwire.stops import CallOutcome

log = logging.getLogger("haltwire.gateway")

Outcome = CallOutcome

#: Outcomes waiting to be sent; past it, one is logged and dropped rather than waited for.
MAX_QUEUED: Final = 10_000
#: Calls in one request: as many as the control plane takes.
BATCH: Final = MAX_CALLS_PER_REPORT
#: One request's timeout.
REQUEST_TIMEOUT_S: Final = 10.0
#: The first wait after a failed request, doubling up to ``RETRY_MAX_S``, for ``RETRY_FOR_S``.
RETRY_MIN_S: Final = 0.5
RETRY_MAX_S: Final = 10.0
RETRY_FOR_S: Final = 300.0

Item = tuple[str, dict[str, Any]]


def _brief(run: str, calls: list[dict[str, Any]]) -> str:
    return f"run {run}: " + ", ".join(
        f"{c['call_id']} {c['tool']} {c['outcome']} (stop {c['stop_id']})" for c in calls
    )


class CallReports:
    def __init__(self, link: ControlLink) -> None:
        self._http = ReplicaHttp(link.urls, link.resolve_token(), REQUEST_TIMEOUT_S)
        self._in, self._out = anyio.create_memory_object_stream[Item](MAX_QUEUED)
        #: Outcomes the control plane acknowledged (recorded now or before), for tests and logs.
        self.sent = 0

    async def aclose(self) -> None:
        await self._http.aclose()

    def record(self, run: str, call: dict[str, Any]) -> None:
        """Queue one call's outcome; never blocks (the caller is a call's own task)."""
        try:
            self._in.send_nowait((run, call))
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            log.error("call outcome not reported (the queue is full or closed): %s", _brief(run, [call]))

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Send what is queued until cancelled (the gateway's shutdown), in batches per run."""
        task_status.started()
        unsent: dict[str, list[dict[str, Any]]] = {}  # taken from the queue, not yet acknowledged
        try:
            async for run, call in self._out:
                unsent[run] = [call]
                while True:  # everything else already queued goes in the same requests
                    try:
                        more_run, more = self._out.receive_nowait()
                    except anyio.WouldBlock:
                        break
                    unsent.setdefault(more_run, []).append(more)
                while unsent:
                    run_id, calls = next(iter(unsent.items()))
                    await self._send(run_id, calls[:BATCH])
                    if calls[BATCH:]:
                        unsent[run_id] = calls[BATCH:]
                    else:
                        del unsent[run_id]
        finally:
            while True:
                try:
                    run, call = self._out.receive_nowait()
                except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.EndOfStream):
                    break
                unsent.setdefault(run, []).append(call)
            for run, calls in unsent.items():
                log.warning("call outcomes not reported (the gateway is stopping): %s", _brief(run, calls))

    async def _send(self, run: str, calls: list[dict[str, Any]]) -> None:
        """One batch, retried while the control plane cannot answer (see the module's docstring)."""
        path = f"/v1/runs/{quote(run, safe='')}/calls"
        wait, waited = RETRY_MIN_S, 0.0
        while True:
            try:
                with anyio.fail_after(REQUEST_TIMEOUT_S):
                    response = await self._http.request("POST", path, json={"calls": calls})
            except (TimeoutError, Unreachable) as exc:
                problem = describe(exc)
            else:
                if response.status_code == 200:
                    self.sent += len(calls)
                    return
                if response.status_code < 500:
                    log.error(
                        "the control plane refused call outcomes (HTTP %d: %s): %s",
                        response.status_code,
                        response.text[:300],
                        _brief(run, calls),
                    )
                    return
                problem = f"HTTP {response.status_code}"
            if waited >= RETRY_FOR_S:
                log.error("call outcomes not reported (%s), given up: %s", problem, _brief(run, calls))
                return
            log.warning("reporting call outcomes failed (%s); again in %.1f s", problem, wait)
            await anyio.sleep(wait)
            waited += wait
            wait = min(wait * 2, RETRY_MAX_S)
