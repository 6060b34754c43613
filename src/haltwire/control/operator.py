"""The operator commands of the ``haltwire`` CLI, talking to a control plane over HTTP.

``haltwire stop``, ``clear``, ``stops``, ``audit``, ``audit verify``, ``credentials RUN``, ``intents``,
``approve ID``, ``reject ID`` and ``report RUN``. The control plane is
``--url`` or ``HALTWIRE_CONTROL_URL``; the caller's token is ``--token`` or ``HALTWIRE_TOKEN``.

``stop`` and ``clear`` send an ``Idempotency-Key`` (``--request-key``, or a new one) and
retry with it when the control plane cannot be reached or answers 503, so a retry never issues
a second stop; past the last attempt the key is printed, to repeat the command with it.

Exit codes: 0 done; 1 refused or failed (the control plane's message is printed, and a refused
write names the role it needed; ``audit verify`` exits 1 when the log was tampered with);
2 bad usage (including no URL or token); 3 the control plane cannot be reached or answered 503.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlsplit

import httpx2

from haltwire.store.audit import Head

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
#: Seconds before each retry of a keyed write (``--request-key``): four attempts in about 3.5 s.
RETRY_DELAYS_S = (0.5, 1.0, 2.0)

_SCOPE_FLAGS = (
    ("--run", "run", "ID", "every call in one run"),
    ("--tenant", "tenant", "ID", "every run of a tenant"),
    ("--tool", "tool", "NAME", "every call to one tool, by anyone"),
    ("--model", "model", "NAME", "every call to one model through the gateways, by anyone"),
    ("--agent", "agent", "ID", "one agent identity"),
    ("--version", "version", "AGENT@VERSION", "one agent version"),
)


class _Failed(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _request(args: argparse.Namespace, method: str, path: str, body: Any = None, key: str | None = None) -> Any:
    url = args.url or os.environ.get("HALTWIRE_CONTROL_URL")
    token = args.token or os.environ.get("HALTWIRE_TOKEN")
    if not url or not token:
        raise _Failed(
            EXIT_USAGE, "give the control plane's --url and --token (or HALTWIRE_CONTROL_URL, HALTWIRE_TOKEN)"
        )
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        hint = f"; did you mean http://{url}?" if "://" not in url else ""
        raise _Failed(EXIT_USAGE, f"the control plane's URL {url!r} is not an http:// or https:// URL{hint}")
    headers = {"Authorization": f"Bearer {token}"}
    if key is None:
        return _answer(_send(url, args.timeout, method, path, body, headers))
    headers["Idempotency-Key"] = key
    for delay in (*RETRY_DELAYS_S, None):
        try:
            return _answer(_send(url, args.timeout, method, path, body, headers))
        except _Failed as exc:
            if exc.code != EXIT_UNREACHABLE:
                raise
            if delay is None:
                raise _Failed(exc.code, f"{exc}; to learn whether it was done, repeat with --request-key {key}") from None
            print(f"{exc}; retrying in {delay:g} s with the same request key", file=sys.stderr)
            time.sleep(delay)
    raise AssertionError("unreachable")


def _send(url: str, timeout: float, method: str, path: str, body: Any, headers: dict[str, str]) -> httpx2.Response:
    try:
        with httpx2.Client(base_url=url, timeout=timeout) as client:
            return client.request(method, path, json=body, headers=headers)
    except httpx2.TransportError as exc:
        raise _Failed(EXIT_UNREACHABLE, f"cannot reach the control plane at {url}: {exc}") from None


def _answer(r: httpx2.Response) -> Any:
    try:
        data = r.json()
    except ValueError:
        data = None
    if r.is_success:
        return data
    error = data.get("error", {}) if isinstance(data, dict) else {}
    message = error.get("message") or f"HTTP {r.status_code}"
    raise _Failed(EXIT_UNREACHABLE if r.status_code == 503 else EXIT_REFUSED, f"{r.status_code}: {message}")


def _stop(args: argparse.Namespace) -> None:
    if args.global_:
        scope = "global"
    else:
        scope = next(f"{kind}:{getattr(args, kind)}" for _, kind, _, _ in _SCOPE_FLAGS if getattr(args, kind))
    body = {"scope": scope, "reason": args.reason}
    stop = _request(args, "POST", "/v1/stops", body, args.request_key or str(uuid.uuid4()))
    print(stop["stop_id"])


def _clear(args: argparse.Namespace) -> None:
    path, body = f"/v1/stops/{args.stop_id}/clear", {"reason": args.reason}
    stop = _request(args, "POST", path, body, args.request_key or str(uuid.uuid4()))
    print(f"cleared {stop['stop_id']} ({stop['scope']})")


def _stops(args: argparse.Namespace) -> None:
    stops = _request(args, "GET", "/v1/stops?all=1" if args.all else "/v1/stops")["stops"]
    if args.json:
        print(json.dumps(stops, indent=2))
        return
    if not stops:
        print("no stops" if args.all else "no active stops")
    for s in stops:
        state = f"cleared by {s['cleared_by']}" if s["cleared"] else "active"
        drill = "  [drill]" if s.get("drill") else ""
        print(f"{s['stop_id']}  {s['scope']:<24}  {state:<20}  by {s['issued_by']}: {s['reason']}{drill}")


def _audit(args: argparse.Namespace) -> None:
    if args.action == "head":
        head = _request(args, "GET", "/v1/audit/head")
        print(json.dumps(head) if args.json else head["head"])
        return
    if args.action == "verify":
        path = "/v1/audit/verify"
        if args.expect_head is not None:
            try:
                Head.parse(args.expect_head)
            except ValueError as exc:
                raise _Failed(EXIT_USAGE, f"--expect-head: {exc}") from None
            path += f"?{httpx2.QueryParams({'expect_head': args.expect_head})}"
        result = _request(args, "GET", path)
        if args.json:
            print(json.dumps(result))
        if result["ok"]:
            sealed = f", {result['sealed']} of them from before the log had a key" if result.get("sealed") else ""
            held = f", the held head {args.expect_head} among them" if args.expect_head else ""
            print(f"audit log intact: {result['checked']} records verified{sealed}{held}")
            print(f"head {result['head_seq']}:{result['head_hash']}")
            return
        where = "" if result["first_bad_seq"] is None else f" at seq {result['first_bad_seq']}"
        raise _Failed(EXIT_REFUSED, f"audit log TAMPERED{where}: {result['problem']}")
    if args.run:  # the records about the run, as its report's timeline has them (one rule)
        records = _request(args, "GET", f"/v1/runs/{quote(args.run, safe='')}/report")["timeline"]
    else:
        path = "/v1/audit" if args.target is None else f"/v1/audit?{httpx2.QueryParams({'target': args.target})}"
        records = _request(args, "GET", path)["records"]
    if args.json:
        print(json.dumps(records, indent=2))
        return
    for r in records:
        drill = "[drill] " if r.get("drill") or (r.get("detail") or {}).get("drill") else ""
        print(
            f"{r['seq']:>5}  {drill}{r['actor']} ({r['role']})  {r['action']} {r['target']}  {r['outcome']}: {r['reason']}"
        )


def _credentials(args: argparse.Namespace) -> None:
    run_id: str = args.run_id
    records = _request(args, "GET", f"/v1/runs/{quote(run_id, safe='')}/credentials")["credentials"]
    if args.json:
        print(json.dumps(records, indent=2))
        return
    if not records:
        print(f"no credentials issued to run {run_id}")
    now = time.time()
    for c in records:
        state = "expired" if c["expires_at"] <= now else "unexpired"
        print(
            f"{c['jti']}  {c['audience']:<20}  kid {c['kid']:<12}  issued {_when(c['issued_at'])}  "
            f"expires {_when(c['expires_at'])} ({state})"
        )


def _intents(args: argparse.Namespace) -> None:
    query = httpx2.QueryParams({"run": args.run} if args.run else {})
    intents = _request(args, "GET", f"/v1/intents?{query}" if args.run else "/v1/intents")["intents"]
    if args.json:
        print(json.dumps(intents, indent=2))
        return
    if not intents:
        print("no intents" + (f" in run {args.run}" if args.run else ""))
    for i in intents:
        why = i["stop_id"] or i["error"] or i["decision_reason"] or ""
        print(
            f"{i['intent_id']}  {i['state']:<17}  {i['tool']:<20}  run {i['run_id'] or '-':<16}  "
            f"agent {i['agent']}  key {i['idempotency_key']}" + (f"  ({why})" if why else "")
        )


def _approve(args: argparse.Namespace) -> None:
    intent = _request(args, "POST", f"/v1/intents/{quote(args.intent_id, safe='')}/approve")
    print(f"approved {intent['intent_id']} ({intent['tool']}): now {intent['state']}")


def _reject(args: argparse.Namespace) -> None:
    path = f"/v1/intents/{quote(args.intent_id, safe='')}/reject"
    intent = _request(args, "POST", path, {"reason": args.reason})
    print(f"rejected {intent['intent_id']} ({intent['tool']})")


def _report(args: argparse.Namespace) -> None:
    # rich only here: the other commands print plain lines.
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    run_id: str = args.run_id
    report = _request(args, "GET", f"/v1/runs/{quote(run_id, safe='')}/report")
    if args.json:
        print(json.dumps(report, indent=2))
        return
    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console.width = max(console.width, 160)  # piped or captured: do not cut ids to 80 columns
    run = report["run"]
    ended = f"ended {_when(run['ended_at'])}" if run["ended_at"] is not None else "not ended"
    console.print(
        f"run {run['run_id']}  agent {run['agent']}@{run['version']}  tenant {run['tenant']}  "
        f"registered {_when(run['registered_at'])}  {ended}"
        + ("  [drill: a drill's run, not an incident]" if report.get("drill") else ""),
        markup=False,
    )
    stops = {s["stop_id"]: s for s in report["stops"]}

    def section(title: str, columns: list[str], rows: list[list[str]]) -> None:
        if not rows:
            console.print(f"{title}: none", markup=False)
            return
        table = Table(title=f"{title} ({len(rows)})", title_justify="left")
        for column in columns:
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))  # recorded text, not rich markup
        console.print(table)

    def intent_rows(key: str, last: Any) -> list[list[str]]:
        return [
            [i["intent_id"], i["tool"], json.dumps(i["arguments"]), i["idempotency_key"], *last(i)]
            for i in report[key]
        ]

    base = ["intent", "tool", "arguments", "key"]
    section(
        "Completed actions",
        [*base, "committed"],
        intent_rows("completed", lambda i: [_when(i["updated_at"])]),
    )
    section(
        "In flight, outcome unknown",
        [*base, "state", "executor"],
        intent_rows("unknown", lambda i: [i["state"], i["claimed_by"] or "-"]),
    )
    section("Failed", [*base, "error"], intent_rows("failed", lambda i: [i["error"] or ""]))

    def cancelled_by(i: dict[str, Any]) -> list[str]:
        stop = stops.get(i["stop_id"])
        who = f"{stop['issued_by']}: {stop['reason']}" if stop else ""
        return [i["stop_id"] or "-", who]

    section("Cancelled", [*base, "stop", "stopped by"], intent_rows("cancelled", cancelled_by))
    section(
        "Calls in flight when a stop came",
        ["call", "tool", "label", "stop", "what the gateway did", "ended"],
        [
            [c["call_id"], c["tool"], c["label"], c["stop_id"], _did(c["outcome"]), _when(c["ended_at"])]
            for c in report["calls"]
        ],
    )
    section(
        "Awaiting approval",
        [*base, "recorded"],
        intent_rows("awaiting_approval", lambda i: [_when(i["created_at"])]),
    )
    section("Pending", [*base, "recorded"], intent_rows("pending", lambda i: [_when(i["created_at"])]))
    section(
        "Rejected",
        [*base, "by", "reason"],
        intent_rows("rejected", lambda i: [i["decided_by"] or "", i["decision_reason"] or ""]),
    )
    section(
        "Stops",
        ["stop", "scope", "issued by", "issued", "reason", "state"],
        [
            [
                s["stop_id"],
                s["scope"],
                s["issued_by"],
                _when(s["issued_at"]),
                s["reason"],
                f"cleared by {s['cleared_by']} {_when(s['cleared_at'])}: {s['clear_reason']}"
                if s["cleared"]
                else "active",
            ]
            for s in report["stops"]
        ],
    )
    section(
        "Timeline",
        ["seq", "at", "actor", "action", "target", "outcome", "reason"],
        [
            [
                str(r["seq"]),
                # Milliseconds: many records of one run land within the same second.
                datetime.fromtimestamp(r["at"], UTC)
                .isoformat(timespec="milliseconds")
                .replace("+00:00", "Z"),
                f"{r['actor']} ({r['role']})",
                r["action"],
                r["target"],
                r["outcome"],
                r["reason"],
            ]
            for r in report["timeline"]
        ],
    )


def _did(outcome: str) -> str:
    if outcome == "cancelled":
        return "cut it"
    if outcome == "abandoned":
        return "let it run; the agent's request went away first"
    return f"let it finish: {outcome}"


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _run(func: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            func(args)
        except _Failed as exc:
            print(f"haltwire {args.command}: {exc}", file=sys.stderr)
            return exc.code
        return EXIT_OK

    return run


def add_parsers(sub: Any) -> None:
    """Add the operator commands to the CLI's subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=None, help="the control plane (default: $HALTWIRE_CONTROL_URL)")
    common.add_argument("--token", default=None, help="your bearer token (default: $HALTWIRE_TOKEN)")
    common.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for an answer")

    stop = sub.add_parser("stop", parents=[common], help="stop a scope; prints the stop id")
    which = stop.add_mutually_exclusive_group(required=True)
    for flag, dest, metavar, what in _SCOPE_FLAGS:
        which.add_argument(flag, dest=dest, metavar=metavar, help=f"stop {what}")
    which.add_argument("--global", dest="global_", action="store_true", help="stop everything")
    stop.add_argument("--reason", required=True, help="why (recorded and shown to whoever is refused)")
    stop.add_argument("--request-key", default=None, help="repeat an earlier attempt: the key it printed")
    stop.set_defaults(func=_run(_stop))

    clear = sub.add_parser("clear", parents=[common], help="clear a stop (role operator)")
    clear.add_argument("stop_id", metavar="STOP_ID")
    clear.add_argument("--reason", required=True, help="why the stop can be lifted")
    clear.add_argument("--request-key", default=None, help="repeat an earlier attempt: the key it printed")
    clear.set_defaults(func=_run(_clear))

    stops = sub.add_parser("stops", parents=[common], help="list active stops (--all: every stop)")
    stops.add_argument("--all", action="store_true", help="include cleared and expired stops")
    stops.add_argument("--json", action="store_true", help="print JSON")
    stops.set_defaults(func=_run(_stops))

    audit = sub.add_parser(
        "audit",
        parents=[common],
        help="list the audit log; 'audit head' prints its head; 'audit verify' checks it",
    )
    audit.add_argument(
        "action",
        nargs="?",
        choices=["verify", "head"],
        help="head: SEQ:HASH of the newest record, to hold outside; verify: exit 1 if the log was tampered with",
    )
    audit.add_argument(
        "--expect-head", default=None, metavar="SEQ:HASH", help="verify: a head held from earlier must still be there"
    )
    audit.add_argument("--target", default=None, help="only records for this target (a scope or stop id)")
    audit.add_argument("--run", default=None, help="only the records about run ID (its report's timeline)")
    audit.add_argument("--json", action="store_true", help="print JSON")
    audit.set_defaults(func=_run(_audit))

    credentials = sub.add_parser(
        "credentials", parents=[common], help="list every credential the broker issued to a run"
    )
    credentials.add_argument("run_id", metavar="RUN")
    credentials.add_argument("--json", action="store_true", help="print JSON")
    credentials.set_defaults(func=_run(_credentials))

    intents = sub.add_parser("intents", parents=[common], help="list intents (calls to irreversible tools)")
    intents.add_argument("--run", default=None, help="only the intents of run ID")
    intents.add_argument("--json", action="store_true", help="print JSON")
    intents.set_defaults(func=_run(_intents))

    report = sub.add_parser(
        "report",
        parents=[common],
        help="what a run did: intents by state, the stops that hit it, its timeline",
    )
    report.add_argument("run_id", metavar="RUN")
    report.add_argument("--json", action="store_true", help="print the API's JSON")
    report.set_defaults(func=_run(_report))

    approve = sub.add_parser("approve", parents=[common], help="approve an intent awaiting approval")
    approve.add_argument("intent_id", metavar="ID")
    approve.set_defaults(func=_run(_approve))

    reject = sub.add_parser("reject", parents=[common], help="reject an intent awaiting approval")
    reject.add_argument("intent_id", metavar="ID")
    reject.add_argument("--reason", required=True, help="why (recorded on the intent)")
    reject.set_defaults(func=_run(_reject))
