"""Pages on the wire: the three payload shapes, and the sender that posts them (``[[notify]]``).

The rule side (what a page is owed for, the outbox, claims, settling and its audit records, what a
page says) is ``haltwire.control.notify``; this module is its HTTP: the JSON a receiver gets and
the task that posts it. It sits with the routes because it writes the same JSON they answer (a
generic page carries the run report exactly as ``GET /v1/runs/{id}/report`` serves it).

Shapes (``body``):

- ``webhook``: ``{"schema": "haltwire.page/1", "page_id", "event", "subject", "summary", "scope",
  "reason", "actor", "at", "rule", "detail", "run_id", "report_url", "stop", "committed",
  "cancelled", "trigger", "report"}`` (docs/configuration.md, ``[[notify]]``), signed with
  ``Haltwire-Signature: t=UNIX,v1=HEX`` (HMAC-SHA256 of ``"{t}.{body}"``) when ``secret_env``
  is set;
- ``slack``: an incoming webhook's ``{"text", "blocks"}``: a header, the scope, reason and who,
  the committed and cancelled actions (the first ``LISTED`` of each), the triggering records, a
  button to the report;
- ``pagerduty``: an Events API v2 ``trigger`` with ``dedup_key`` the subject (the stop id: a page
  sent twice is one incident), ``payload.custom_details`` holding what the webhook's body holds but
  the whole report, and ``links`` to the report.

``Sender.run`` is one task per receiver (so a receiver that hangs delays no other), owned by the
app's lifespan in the control plane's main process. It never runs on the stop's path: a stop only
writes its pages to the outbox and wakes it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, Final

import aiohttp
import anyio

from haltwire.control import notify
from haltwire.control.notify import Content, Receiver
from haltwire.control.plane import Plane
from haltwire.control.routes.views import intent_json, report_json, stop_json
from haltwire.intents import Intent
from haltwire.store.pages import PageRecord
from haltwire.store.registry import RegistryUnavailable

log = logging.getLogger("haltwire.control")

#: How many committed and cancelled actions a Slack page and a PagerDuty event list by name.
LISTED: Final = 20
#: One post: (url, body, headers, deadline) -> (HTTP status, the answer's start).
Post = Callable[[str, bytes, dict[str, str], float], Awaitable[tuple[int, str]]]
#: The answers worth another attempt; any other 4xx is the page's fault and is given up at once.
RETRYABLE_4XX: Final = frozenset({408, 409, 425, 429})

_TITLES: Final = {"stop": "stopped", "escalation": "escalated", "shadow": "would have stopped (shadow)"}


def summary(c: Content) -> str:
    """One line: what happened, where, why, and what it left."""
    e = c.event
    what = f"haltwire {_TITLES.get(e.kind, e.kind)} {e.scope}"
    if e.rule:
        what += f" (rule {e.rule})"
    tail = f"{len(c.report.completed)} committed, " if c.report is not None else ""
    return f"{what}: {e.reason} [{tail}{len(c.cancelled)} cancelled; by {e.actor}]"


def _action(i: Intent) -> dict[str, Any]:
    return {"intent_id": i.intent_id, "tool": i.tool, "idempotency_key": i.idempotency_key, "state": i.state}


def webhook_body(c: Content) -> dict[str, Any]:
    """The generic page (``haltwire.page/1``)."""
    e = c.event
    return {
        "schema": "haltwire.page/1",
        "page_id": c.page.page_id,
        "event": e.kind,
        "subject": e.subject,
        "summary": summary(c),
        "scope": e.scope,
        "reason": e.reason,
        "actor": e.actor,
        "at": e.at,
        "rule": e.rule,
        "detail": e.detail,
        "run_id": c.run_id,
        "report_url": c.report_url,
        # As GET /v1/stops has it; never a drill's: a drill's stop pages no one (``control.drills``).
        "stop": None if c.stop is None else stop_json(c.stop) | {"drill": False},
        "committed": [intent_json(i) for i in c.report.completed] if c.report is not None else [],
        "cancelled": [intent_json(i) for i in c.cancelled],
        "trigger": [asdict(t) for t in c.trigger],
        "report": None if c.report is None else report_json(c.report),
    }


def _lines(title: str, items: list[str]) -> str:
    shown = items[:LISTED]
    more = f"\n… and {len(items) - len(shown)} more" if len(items) > len(shown) else ""
    body = "\n".join(f"• {x}" for x in shown) or "none"
    return f"*{title} ({len(items)})*\n{body}{more}"[:3000]


def _intent_line(i: Intent) -> str:
    return f"`{i.intent_id}` {i.tool} (key `{i.idempotency_key}`)"


def slack_body(c: Content) -> dict[str, Any]:
    """A Slack incoming webhook's message: ``text`` for notifications, ``blocks`` for the channel."""
    e = c.event
    facts = f"*Scope* `{e.scope}`\n*Reason* {e.reason}\n*By* {e.actor}"
    if e.rule:
        facts += f"\n*Rule* {e.rule}"
    if c.run_id:
        facts += f"\n*Run* `{c.run_id}`"
    blocks: list[dict[str, Any]] = [
        {
            "type": "header",
            "text": {
                "type": "plain_text",
                "text": f"haltwire: {_TITLES.get(e.kind, e.kind)} {e.scope}"[:150],
            },
        },
        {"type": "section", "text": {"type": "mrkdwn", "text": facts[:3000]}},
    ]
    if c.report is not None:
        blocks.append(_section(_lines("Committed", [_intent_line(i) for i in c.report.completed])))
    blocks.append(_section(_lines("Cancelled", [_intent_line(i) for i in c.cancelled])))
    trigger = [f"#{t.seq} {t.action} `{t.target}` by {t.actor}: {t.reason}" for t in c.trigger]
    blocks.append(_section(_lines("Audit records that triggered it", trigger)))
    if c.report_url:
        button = {"type": "button", "text": {"type": "plain_text", "text": "Run report"}, "url": c.report_url}
        blocks.append({"type": "actions", "elements": [button]})
    return {"text": summary(c), "blocks": blocks}


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def pagerduty_body(c: Content, routing_key: str, severity: str) -> dict[str, Any]:
    """A PagerDuty Events API v2 ``trigger``; ``dedup_key`` is the subject (a stop is one incident)."""
    e = c.event
    details: dict[str, Any] = {
        "event": e.kind,
        "page_id": c.page.page_id,
        "scope": e.scope,
        "reason": e.reason,
        "actor": e.actor,
        "rule": e.rule,
        "run_id": c.run_id,
        "report_url": c.report_url,
        "committed": [_action(i) for i in c.report.completed[:LISTED]] if c.report is not None else [],
        "committed_count": len(c.report.completed) if c.report is not None else 0,
        "cancelled": [_action(i) for i in c.cancelled[:LISTED]],
        "cancelled_count": len(c.cancelled),
        "trigger": [asdict(t) for t in c.trigger],
        "detail": e.detail,
    }
    out: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": e.subject,
        "payload": {
            "summary": summary(c)[:1024],
            "source": "haltwire",
            "severity": severity,
            "timestamp": datetime.fromtimestamp(e.at, UTC).isoformat(),
            "component": e.scope,
            "group": c.run_id or e.scope,
            "class": e.kind,
            "custom_details": details,
        },
    }
    if c.report_url:
        out["links"] = [{"href": c.report_url, "text": "Run report"}]
    return out


def body(receiver: Receiver, c: Content) -> tuple[bytes, dict[str, str]]:
    """The bytes to post to ``receiver`` and their headers."""
    kind = receiver.target.kind
    if kind == "slack":
        data = slack_body(c)
    elif kind == "pagerduty":
        assert receiver.routing_key is not None
        severity = receiver.target.severity.get(c.event.kind, "critical")
        data = pagerduty_body(c, receiver.routing_key, severity)
    else:
        data = webhook_body(c)
    raw = json.dumps(data, separators=(",", ":")).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "haltwire",
        "Idempotency-Key": c.page.page_id,
    }
    if receiver.secret is not None:
        t = str(int(time.time()))
        mac = hmac.new(receiver.secret, t.encode() + b"." + raw, hashlib.sha256).hexdigest()
        headers["Haltwire-Signature"] = f"t={t},v1={mac}"
    return raw, headers


class Sender:
    """Posts the outbox's pages, one task per receiver (``run``, until cancelled)."""

    def __init__(self, plane: Plane, receivers: list[Receiver], post: Post | None = None) -> None:
        self.plane = plane
        self.receivers = receivers
        self._post = post
        self._session: aiohttp.ClientSession | None = None

    async def run(self) -> None:
        # aiohttp, as the gateway's upstream leg; proxies from the environment (a page to Slack
        # or PagerDuty may have to leave through one).
        async with aiohttp.ClientSession(trust_env=True) as session:
            self._session = session
            async with anyio.create_task_group() as tg:
                for receiver in self.receivers:
                    tg.start_soon(self._work, receiver)

    async def post(self, url: str, data: bytes, headers: dict[str, str], timeout_s: float) -> tuple[int, str]:
        if self._post is not None:
            return await self._post(url, data, headers, timeout_s)
        assert self._session is not None
        with anyio.fail_after(timeout_s):
            async with self._session.post(
                url,
                data=data,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
                allow_redirects=False,
            ) as answer:
                return answer.status, (await answer.content.read(200)).decode("utf-8", "replace")

    async def _work(self, receiver: Receiver) -> None:
        plane = self.plane
        while True:
            changed = plane.changed
            got: PageRecord | float | None
            try:
                await notify.drop_excess(plane, receiver)
                got = await notify.claim(plane, receiver, time.time())
                if isinstance(got, PageRecord):
                    await self._attempt(receiver, got)
                    continue
            except RegistryUnavailable as exc:  # a page claimed is tried again when its claim ends
                log.warning("paging %s: the registry failed (%s); trying again", receiver.name, exc)
                got = time.time() + notify.POLL_S
            except Exception:  # paging never takes the control plane down with it
                log.exception("paging %s failed; trying again", receiver.name)
                got = time.time() + notify.POLL_S
            if got is None:  # nothing waits: a new page comes with a registry change, or within POLL_S
                with anyio.move_on_after(notify.POLL_S):
                    await changed.wait()
            else:  # the oldest page waits for its retry, and every new one behind it: no wake-up helps
                await anyio.sleep(max(0.0, min(got - time.time(), notify.RECHECK_S)))

    async def _attempt(self, receiver: Receiver, page: PageRecord) -> None:
        attempts = page.attempts + 1
        c = await notify.content(self.plane, receiver, page)
        data, headers = body(receiver, c)
        try:
            status, text = await self.post(receiver.url, data, headers, receiver.target.timeout_s)
        except TimeoutError:
            await notify.settle(
                self.plane,
                receiver,
                page,
                "failed",
                attempts,
                f"no answer within {receiver.target.timeout_s:g} s",
            )
            return
        except (aiohttp.ClientError, OSError) as exc:
            await notify.settle(
                self.plane, receiver, page, "failed", attempts, f"{type(exc).__name__}: {exc}"
            )
            return
        if 200 <= status < 300:
            await notify.settle(self.plane, receiver, page, "delivered", attempts, f"HTTP {status}")
            return
        final = 400 <= status < 500 and status not in RETRYABLE_4XX
        detail = f"HTTP {status}: {text.strip()[:200]}"
        await notify.settle(self.plane, receiver, page, "failed", attempts, detail, give_up=final)
