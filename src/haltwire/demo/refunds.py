"""``haltwire demo refunds``: the seed's refund incident, end to end with real processes.

A support agent (scripted: no model) reads orders and may refund up to $200 an order through
the gateway, whose ``issue_refund`` is irreversible: every call becomes an intent that the
executor carries out after checking the stop registry. One order's review carries a prompt
injection; once the agent has read it, it refunds every order it reads. The seed's tripwires are
the gateway's ``[[tripwires]]``: at most 20 refunds per tenant per hour, and a stop for any run
with more than 5 refunds (checked at admission: the sixth ``issue_refund`` call is refused
``tripwire_tripped`` before any intent is written, and the gateway writes the run's stop as its
tripwire identity); the built-in content detector runs in shadow mode on ``read_order`` and
records that it would have stopped the run at the injected review, before its first refund.

The demo starts the control plane, the shop (the refunds API, which records every refund it
applies), the gateway, the executor and on-call (a webhook receiver the control plane pages,
``[[notify]]``) as separate processes on loopback, runs the agent in this process under a
10-second lease, and then measures what the layers did: the stop, the lease ended, the renewal
and the broker credential refused, the page. It prints the timeline, the run report beside the
shop's own ledger, the page on-call received and a script reversing the committed refunds.
Last, it stops the gateway and replays the gateway's call log through its tripwires
(``refunds_backtest``, what ``haltwire tripwires test`` does): the replay must fire the same
rules at the same calls as the gateway did live (``--keep DIR`` keeps the log and the config for
you to replay). It exits 1, naming the run and the deviation, unless every run was capped at
exactly five refunds, its report matches the ledger, on-call's page matches the report and the
replay matches.

This module is the command. The stack is ``refunds_stack`` (on-call ``oncall``), one run and its
checks ``refunds_run``, and what is printed ``refunds_output`` (with ``refunds_timeline`` and
``refunds_reversal``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import anyio
import httpx2
from rich.console import Console

from haltwire.demo.processes import StackFailed
from haltwire.demo.refunds_backtest import backtest, keep
from haltwire.demo.refunds_output import render_backtest, render_run, render_summary, run_json
from haltwire.demo.refunds_run import run_all
from haltwire.demo.refunds_stack import PER_RUN, running_stack
from haltwire.tripwires.backtest import MalformedLog


def _progress(text: str) -> None:
    """A long step as it happens, on stderr (stdout is the results, JSON with ``--json``)."""
    print(f"haltwire demo refunds: {text}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="haltwire demo refunds",
        description="The seed's refund incident, end to end with real processes, measured and checked.",
    )
    parser.add_argument("--runs", type=int, default=1, help="agent runs against one stack (default 1)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--verbose", action="store_true", help="print every run's timeline, not only the first"
    )
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="copy the gateway's config and call log into DIR, for haltwire tripwires test",
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    began = time.monotonic()
    try:
        _progress("starting the stack: control plane, shop, gateway, executor, on-call (about 20 s)")
        with running_stack(tenants=args.runs) as stack:
            started_s = time.monotonic() - began
            _progress(f"stack up in {started_s:.1f} s; {args.runs} run{'s' if args.runs > 1 else ''} of the support agent")
            results = anyio.run(run_all, stack, args.runs, _progress)
            total = len(httpx2.get(f"{stack.shop_url}/ledger", timeout=10).json()["refunds"])
            stack.stop_gateway()  # its call log's last records are written at shutdown
            _progress("replaying the gateway's call log through its tripwires")
            replayed = anyio.run(backtest, stack.gateway_toml, stack.call_log, [r.run_id for r in results])
            kept = keep(stack.gateway_toml, stack.call_log, args.keep) if args.keep else None
    except StackFailed as exc:
        print(f"haltwire demo refunds: {exc}", file=sys.stderr)
        return 1
    except (OSError, MalformedLog) as exc:  # the call log unreadable, or --keep's directory unwritable
        print(f"haltwire demo refunds: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("haltwire demo refunds: interrupted; the stack is down", file=sys.stderr)
        return 1
    elapsed_s = time.monotonic() - began
    for r in results:
        r.deviations.extend(f"call log replay: {d}" for d in replayed.deviations.get(r.run_id, []))
    problems = [f"run {r.number} ({r.run_id}): {d}" for r in results for d in r.deviations]
    problems += [f"call log replay: {d}" for d in replayed.deviations.get("", [])]
    if total != sum(len(r.ledger) for r in results):
        problems.append(
            f"the shop applied {total} refunds in all, not only the runs' {sum(len(r.ledger) for r in results)}"
        )
    if args.json:
        print(json.dumps({
            "ok": not problems, "problems": problems, "runs": [run_json(r) for r in results],
            "backtest": replayed.json(), "kept": [str(p) for p in kept] if kept else None,
            "shop_applied_total": total, "stack_start_s": round(started_s, 3), "elapsed_s": round(elapsed_s, 3),
        }, indent=2))  # fmt: skip
    else:
        console = Console(highlight=False)
        if not console.is_terminal:
            console.width = max(console.width, 160)
        for r in results if args.verbose else results[:1]:
            render_run(console, r)
        if len(results) > 1:
            render_summary(console, results)
        render_backtest(console, replayed, results[0].run_id, kept)
        capped = sum(len(r.ledger) == PER_RUN and not r.deviations for r in results)
        colour = "green" if not problems else "red"
        console.print(
            f"[{colour}]{capped}/{len(results)} runs capped at exactly {PER_RUN} refunds, report = ledger[/{colour}] "
            f"(stack up in {started_s:.1f} s, {elapsed_s:.1f} s in all)"
        )
    for problem in problems:
        print(f"haltwire demo refunds: {problem}", file=sys.stderr)
    return 1 if problems else 0
