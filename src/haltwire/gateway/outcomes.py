"""Telling the control plane what a stop did to the calls it found in flight, and what a run's
model calls used, for the run report.

When a stop reaches a call of a run in flight (``haltwire.gateway.inflight``), the gateway cuts
it or lets it finish by the tool's label, then, once the call has ended, queues its outcome here.
``CallReports.run`` (a task owned by the gateway's start-up task group) sends what is queued as
``POST /v1/runs/{run}/calls``, each request one transaction at the control plane. A run's model
usage (``record_usage``) goes the same way as ``POST /v1/runs/{run}/usage``, summed per model
over what was queued since the last request (one report id each, so a retry is recorded once).

Best effort, and never on the call path: ``record`` only puts the outcome in a bounded queue
(full: the outcome is logged and dropped, never waited for). A request that fails (control plane
unreachable, a 5xx) is retried with the same call ids, which the control plane records once,
with a doubling wait up to ``RETRY_MAX_S``, for ``RETRY_FOR_S`` in all; a 4xx is an answer
(an unknown run, say) and is not repeated. An outcome given up on, or still queued at shutdown,
is logged with its run, call and stop: the log is the record of last resort.
"""

from __future__ import annotations

import logging
import uuid
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

#: What is queued: ``calls`` or ``usage``, the run, and one call outcome or one usage item.
Item = tuple[str, str, dict[str, Any]]
Unsent = dict[tuple[str, str], list[dict[str, Any]]]


def _brief(kind: str, run: str, items: list[dict[str, Any]]) -> str:
    if kind == "usage":
        return f"run {run}: " + ", ".join(
            f"{u['model']} {u['calls']} call(s) {u['input_tokens']}+{u['output_tokens']} tokens" for u in items
        )
    return f"run {run}: " + ", ".join(
        f"{c['call_id']} {c['tool']} {c['outcome']} (stop {c['stop_id']})" for c in items
    )


def _take(unsent: Unsent, kind: str, run: str, item: dict[str, Any]) -> None:
    items = unsent.setdefault((kind, run), [])
    if kind == "usage":  # summed per model: one audit record per model and request, not per call
        same = next((u for u in items if u["model"] == item["model"]), None)
        if same is not None:
            for k in ("calls", "input_tokens", "output_tokens", "cost_micros"):
                same[k] += item[k]
            return
    items.append(item)


class CallReports:
    def __init__(self, link: ControlLink) -> None:
        self._http = ReplicaHttp(link.urls, link.resolve_token(), REQUEST_TIMEOUT_S)
        self._in, self._out = anyio.create_memory_object_stream[Item](MAX_QUEUED)
        #: Items the control plane acknowledged (recorded now or before), for tests and logs.
        self.sent = 0

    async def aclose(self) -> None:
        await self._http.aclose()

    def record(self, run: str, call: dict[str, Any]) -> None:
        """Queue one call's outcome; never blocks (the caller is a call's own task)."""
        self._queue("calls", run, call)

    def record_usage(self, run: str, model: str, input_tokens: int, output_tokens: int, cost_micros: int) -> None:
        """Queue what one model call of ``run`` used; never blocks."""
        item = {
            "report_id": uuid.uuid4().hex,
            "model": model,
            "calls": 1,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cost_micros": cost_micros,
        }
        self._queue("usage", run, item)

    def _queue(self, kind: str, run: str, item: dict[str, Any]) -> None:
        try:
            self._in.send_nowait((kind, run, item))
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            log.error("not reported (the queue is full or closed): %s", _brief(kind, run, [item]))

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Send what is queued until cancelled (the gateway's shutdown), in batches per run."""
        task_status.started()
        unsent: Unsent = {}  # taken from the queue, not yet acknowledged
        try:
            async for kind, run, item in self._out:
                _take(unsent, kind, run, item)
                while True:  # everything else already queued goes in the same requests
                    try:
                        _take(unsent, *self._out.receive_nowait())
                    except anyio.WouldBlock:
                        break
                while unsent:
                    (kind, run_id), items = next(iter(unsent.items()))
                    await self._send(kind, run_id, items[:BATCH])
                    if items[BATCH:]:
                        unsent[kind, run_id] = items[BATCH:]
                    else:
                        del unsent[kind, run_id]
        finally:
            while True:
                try:
                    _take(unsent, *self._out.receive_nowait())
                except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.EndOfStream):
                    break
            for (kind, run), items in unsent.items():
                log.warning("not reported (the gateway is stopping): %s", _brief(kind, run, items))

    async def _send(self, kind: str, run: str, items: list[dict[str, Any]]) -> None:
        """One batch, retried while the control plane cannot answer (see the module's docstring)."""
        path = f"/v1/runs/{quote(run, safe='')}/{kind}"
        wait, waited = RETRY_MIN_S, 0.0
        while True:
            try:
                with anyio.fail_after(REQUEST_TIMEOUT_S):
                    response = await self._http.request("POST", path, json={kind: items})
            except (TimeoutError, Unreachable) as exc:
                problem = describe(exc)
            else:
                if response.status_code == 200:
                    self.sent += len(items)
                    return
                if response.status_code < 500:
                    log.error(
                        "the control plane refused a report (HTTP %d: %s): %s",
                        response.status_code,
                        response.text[:300],
                        _brief(kind, run, items),
                    )
                    return
                problem = f"HTTP {response.status_code}"
            if waited >= RETRY_FOR_S:
                log.error("not reported (%s), given up: %s", problem, _brief(kind, run, items))
                return
            log.warning("reporting to the control plane failed (%s); again in %.1f s", problem, wait)
            await anyio.sleep(wait)
            waited += wait
            wait = min(wait * 2, RETRY_MAX_S)
