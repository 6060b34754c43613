"""On-call of ``haltwire demo refunds``: a local webhook receiver standing in for the pager.

The control plane pages it as a ``[[notify]]`` receiver of kind ``webhook`` (schema
``haltwire.page/1``). It prints each page it receives, one block on its stderr (the summary, the
run, the rule and reason, the committed actions, the cancelled intents, the report link), keeps
them in memory with when each came, and serves them back at ``GET /pages`` (``{"pages":
[{"received_at", "page"}]}``) so the demo can print and check them.
Pages are deduplicated by ``page_id`` (delivery is at least once).

``python -m haltwire.demo.oncall --port PORT`` runs it; the demo starts it as a process of its own.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


def page_lines(page: dict[str, Any]) -> list[str]:
    """What on-call reads of a page: one line each, as the receiver prints it."""
    reason = str(page.get("reason") or "").splitlines()
    summary = str(page.get("summary") or "").splitlines()
    lines = [
        f"PAGE {page.get('page_id')} ({page.get('event')}): {summary[0] if summary else ''}",
        f"  run:       {page.get('run_id')}",
        f"  issued by: {page.get('actor')}",
        f"  reason:    {reason[0] if reason else ''}",
    ]
    if page.get("rule") not in (None, page.get("actor")):
        lines.append(f"  rule:      {page.get('rule')}")
    for intent in page.get("committed") or []:
        args = intent.get("arguments") or {}
        lines.append(
            f"  committed: {intent.get('tool')} {args.get('order_id')} {args.get('amount_cents')} cents "
            f"(intent {intent.get('intent_id')}, key {intent.get('idempotency_key')})"
        )
    cancelled = page.get("cancelled") or []
    for intent in cancelled:
        args = intent.get("arguments") or {}
        lines.append(
            f"  cancelled: {intent.get('tool')} {args.get('order_id')} (intent {intent.get('intent_id')})"
        )
    if not cancelled:
        lines.append("  cancelled: none")
    for record in page.get("trigger") or []:
        lines.append(f"  trigger:   {record.get('actor')} {record.get('action')} {record.get('outcome')}")
    # The audit record of what set the run off, from the run report the page carries.
    for record in (page.get("report") or {}).get("timeline") or []:
        if record.get("action") == "stop.shadow":
            lines.append(f"  shadow:    {record.get('actor')}: {str(record.get('reason')).splitlines()[0]}")
    lines.append(f"  report:    {page.get('report_url')}")
    return lines


class OnCall:
    def __init__(self) -> None:
        #: Every page received (first delivery of each ``page_id``) and when, in arrival order.
        self.pages: list[dict[str, Any]] = []
        self.app = Starlette(
            routes=[
                Route("/page", self._page, methods=["POST"]),
                Route("/pages", self._pages, methods=["GET"]),
            ]
        )

    async def _page(self, request: Request) -> Response:
        try:
            page = json.loads(await request.body())
        except ValueError:
            return JSONResponse({"error": "not JSON"}, status_code=400)
        if not isinstance(page, dict):
            return JSONResponse({"error": "not a JSON object"}, status_code=400)
        if all(p["page"].get("page_id") != page.get("page_id") for p in self.pages):
            self.pages.append({"received_at": time.time(), "page": page})
            print("\n".join(page_lines(page)), file=sys.stderr, flush=True)
        return JSONResponse({"ok": True})

    async def _pages(self, request: Request) -> Response:
        return JSONResponse({"pages": self.pages})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m haltwire.demo.oncall", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8902)
    args = parser.parse_args(argv)
    import uvicorn

    print(f"on-call receiver on http://{args.host}:{args.port}/page", file=sys.stderr, flush=True)
    uvicorn.run(OnCall().app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
