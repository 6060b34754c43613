"""``haltwire demo loop``: the seed's scenarios, run for real on loopback and checked.

Each scenario starts a demo upstream and a fresh gateway in this process, connects the
scripted agent (``haltwire.demo.agent``) with the official MCP client over HTTP, and
compares what the agent did and what the upstream served with the numbers the seed
reports. The command exits 0 when every scenario matched and 1 otherwise, naming the
scenario and the number that deviated.

1. a budget of 20 refused with a terminal error: the agent stops at call 21;
2. the same budget refused with "Please try again": the agent runs to its own 200-step cap;
3. no gateway budget, an upstream quota of 50 on the shared key: the looping agent burns
   the quota and a second agent is refused on its first call;
4. at most 2 calls in flight, five sent at once: exactly 2 admitted, 3 told to retry;
5. an operator suspends the agent before its sixth call, then lifts the suspension;
6. the same refusal answered at the HTTP gate (``refuse_at = "edge"``): the client raises;
7. ops-bot runs under a lease from the control plane; an operator stops the run before its
   sixth call: the gateway refuses it ``stopped``, the pushed stop ends the lease, and after
   the clear the old lease stays fenced off while a new run is served.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio
import httpx2
from rich import box
from rich.console import Console
from rich.padding import Padding
from rich.table import Table

from haltwire.demo.agent import AgentLog, Answer, call_once, run_agent
from haltwire.demo.stack import (
    CONTROL_TOKENS,
    LEASE_KEYS,
    TOKENS,
    connect,
    demo_config,
    running_control_plane,
    running_gateway,
    running_upstream,
)
from haltwire.demo.upstream import DemoUpstream
from haltwire.gateway.killswitch import write_suspensions
from haltwire.meta import LEASE_META
from haltwire.runtime import ControlClient, Lease

QUOTA_TEXT: Final = "Upstream refused: 429 quota exceeded for this API key. Try again later."
TRY_AGAIN_TEXT: Final = "Rate limited. Please try again."
STEPS: Final = 200
BUDGET: Final = 20
#: No scenario waits on anything slower than a loopback round trip; this bounds a hang.
SCENARIO_TIMEOUT_S: Final = 120.0


@dataclass(slots=True)
class Row:
    """One line of a scenario's table: what one agent did."""

    who: str
    calls: int
    served: int
    refused: int
    ended: str
    last: str

    @classmethod
    def of(cls, log: AgentLog, who: str | None = None) -> Row:
        refused = log.refused + (1 if log.raised is not None else 0)
        return cls(who or log.agent, log.calls, log.served, refused, log.stopped_by, log.describe_last())


@dataclass(slots=True)
class ScenarioResult:
    number: int
    title: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    expected: dict[str, Any] = field(default_factory=dict)
    observed: dict[str, Any] = field(default_factory=dict)
    logs: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    elapsed_s: float = 0.0

    @property
    def deviations(self) -> list[str]:
        if self.error is not None:
            return [f"the scenario failed: {self.error}"]
        out = []
        for key, want in self.expected.items():
            got = self.observed.get(key, "(not observed)")
            if got != want:
                out.append(f"{key}: expected {want!r}, got {got!r}")
        return out

    @property
    def ok(self) -> bool:
        return not self.deviations

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "title": self.title,
            "ok": self.ok,
            "deviations": self.deviations,
            "agents": self.logs,
            "rows": [
                {
                    "who": r.who,
                    "calls": r.calls,
                    "served": r.served,
                    "refused": r.refused,
                    "ended": r.ended,
                    "last": r.last,
                }
                for r in self.rows
            ],
            "notes": self.notes,
            "expected": self.expected,
            "observed": self.observed,
            "elapsed_s": round(self.elapsed_s, 3),
        }


def _observe(prefix: str, log: AgentLog) -> dict[str, Any]:
    last = log.last
    return {
        f"{prefix}.calls": log.calls,
        f"{prefix}.served": log.served,
        f"{prefix}.refused": log.refused,
        f"{prefix}.stopped_by": log.stopped_by,
        f"{prefix}.last.code": last.code if last else None,
        f"{prefix}.last.retryable": last.retryable if last else None,
    }


def _upstream(demo: DemoUpstream) -> dict[str, int]:
    return {"upstream.served": sum(demo.served.values()), "upstream.refused": sum(demo.refused.values())}


def _upstream_note(demo: DemoUpstream) -> str:
    u = _upstream(demo)
    return f"upstream served {u['upstream.served']}, refused {u['upstream.refused']}"


@contextmanager
def http_error_statuses(url: str) -> Iterator[list[int]]:
    """The status of every HTTP response of 400 or more that this process's clients got from ``url``.

    Read from the HTTP client's own request log, so it is what went over the wire; the
    official MCP client turns these responses into an exception without the status.
    """
    statuses: list[int] = []
    logger = logging.getLogger("httpx2")
    saved_level = logger.level
    shown_from = logger.getEffectiveLevel()

    def capture(record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and str(args[1]).startswith(url):
            status = args[3]
            if isinstance(status, int) and status >= 400:
                statuses.append(status)
        # Pass on only what would have been logged without this capture.
        return record.levelno >= shown_from

    logger.addFilter(capture)
    logger.setLevel(min(shown_from, logging.INFO))
    try:
        yield statuses
    finally:
        logger.removeFilter(capture)
        logger.setLevel(saved_level)


@asynccontextmanager
async def _kill_switch() -> AsyncIterator[Path]:
    with tempfile.TemporaryDirectory(prefix="haltwire-demo-") as tmp:
        yield Path(tmp) / "suspended.json"


async def scenario_terminal_budget() -> ScenarioResult:
    r = ScenarioResult(1, f"a budget of {BUDGET} calls an hour, refused with a terminal error")
    async with (
        running_upstream() as (demo, url),
        running_gateway(demo_config(url, limits={"budget": BUDGET})) as (_, gw),
        connect(gw, TOKENS["ops-bot"]) as client,
    ):
        log = await run_agent(client, "ops-bot", max_steps=STEPS)
    r.rows.append(Row.of(log))
    r.logs.append(log.to_dict())
    r.notes.append(_upstream_note(demo))
    r.observed = {**_observe("ops-bot", log), **_upstream(demo)}
    r.expected = {
        "ops-bot.calls": BUDGET + 1,
        "ops-bot.served": BUDGET,
        "ops-bot.refused": 1,
        "ops-bot.stopped_by": "the server",
        "ops-bot.last.code": "budget_exhausted",
        "ops-bot.last.retryable": False,
        "upstream.served": BUDGET,
        "upstream.refused": 0,
    }
    return r


async def scenario_please_try_again() -> ScenarioResult:
    r = ScenarioResult(2, f'the same budget, refused with "{TRY_AGAIN_TEXT}"')
    async with running_upstream() as (demo, url):
        config = demo_config(
            url, limits={"budget": BUDGET}, gateway={"development": True, "refusal_style": "please-try-again"}
        )
        async with running_gateway(config) as (_, gw), connect(gw, TOKENS["ops-bot"]) as client:
            log = await run_agent(client, "ops-bot", max_steps=STEPS)
    r.rows.append(Row.of(log))
    r.logs.append(log.to_dict())
    r.notes.append(_upstream_note(demo))
    r.notes.append(
        f"the budget held (the upstream served {BUDGET}); the words kept the agent calling, "
        f"{log.refused} refusals later"
    )
    r.observed = {**_observe("ops-bot", log), **_upstream(demo)}
    r.observed["ops-bot.last.text"] = log.last.text if log.last else None
    r.expected = {
        "ops-bot.calls": STEPS,
        "ops-bot.served": BUDGET,
        "ops-bot.refused": STEPS - BUDGET,
        "ops-bot.stopped_by": f"its own {STEPS}-step cap",
        "ops-bot.last.text": TRY_AGAIN_TEXT,
        "upstream.served": BUDGET,
        "upstream.refused": 0,
    }
    return r


async def scenario_upstream_quota(quota: int = 50) -> ScenarioResult:
    r = ScenarioResult(3, f"no gateway budget, an upstream quota of {quota} calls for the shared key")
    async with (
        running_upstream(quota=quota) as (demo, url),
        running_gateway(demo_config(url)) as (_, gw),
    ):
        async with connect(gw, TOKENS["ops-bot"]) as client:
            log = await run_agent(client, "ops-bot", max_steps=STEPS)
        async with connect(gw, TOKENS["billing-bot"]) as client:
            first = await call_once(client)
    r.rows.append(Row.of(log))
    r.rows.append(
        Row(
            "billing-bot",
            1,
            0 if first.is_error else 1,
            1 if first.is_error else 0,
            "its single call",
            first.describe(),
        )
    )
    r.logs.append(log.to_dict())
    r.logs.append({"agent": "billing-bot", "calls": 1, "first": first.to_dict()})
    verdict = "refused" if first.is_error else "served"
    r.notes.append(f"billing-bot's first call: {verdict}; it shares the key, so it shares the quota")
    r.notes.append(_upstream_note(demo))
    r.observed = {
        **_observe("ops-bot", log),
        "ops-bot.last.text": log.last.text if log.last else None,
        "billing-bot.first.is_error": first.is_error,
        "billing-bot.first.text": first.text,
        **_upstream(demo),
    }
    r.expected = {
        "ops-bot.calls": STEPS,
        "ops-bot.served": quota,
        "ops-bot.refused": STEPS - quota,
        "ops-bot.stopped_by": f"its own {STEPS}-step cap",
        "ops-bot.last.code": None,
        "ops-bot.last.text": QUOTA_TEXT,
        "billing-bot.first.is_error": True,
        "billing-bot.first.text": QUOTA_TEXT,
        "upstream.served": quota,
        "upstream.refused": STEPS - quota + 1,
    }
    return r


async def scenario_in_flight(cap: int = 2, burst: int = 5) -> ScenarioResult:
    r = ScenarioResult(4, f"at most {cap} calls in flight, {burst} sent at once")
    answers: list[Answer] = []
    async with (
        running_upstream() as (demo, url),
        running_gateway(demo_config(url, limits={"max_in_flight": cap})) as (_, gw),
        connect(gw, TOKENS["ops-bot"]) as client,
    ):

        async def one() -> None:
            answers.append(await call_once(client, "hold", {}))

        async with anyio.create_task_group() as tg:
            for _ in range(burst):
                tg.start_soon(one)
            # The upstream holds every admitted call, so no slot frees up until all calls of
            # the burst are either held there or answered with a refusal; then let them go.
            while len(answers) + demo.in_flight < burst:  # noqa: ASYNC110 - polls two counters
                await anyio.sleep(0.005)
            held = demo.in_flight
            demo.release()
    refused = [a for a in answers if a.is_error]
    served = len(answers) - len(refused)
    codes = sorted({a.code or "(none)" for a in refused})
    kinds = sorted({a.describe() for a in refused})
    r.rows.append(Row("ops-bot", burst, served, len(refused), f"a burst of {burst}", "; ".join(kinds)))
    r.logs.append({"agent": "ops-bot", "answers": [a.to_dict() for a in answers], "held_at_once": held})
    r.notes.append(f"{held} calls were held in the upstream at once when the burst was settled")
    r.notes.append(_upstream_note(demo))
    r.observed = {
        "ops-bot.served": served,
        "ops-bot.refused": len(refused),
        "ops-bot.refused.codes": codes,
        "ops-bot.refused.retryable": sorted({a.retryable for a in refused}, key=str),
        "ops-bot.refused.retry_after_s": sorted({a.retry_after_s for a in refused}, key=str),
        "upstream.held_at_once": held,
        **_upstream(demo),
    }
    r.expected = {
        "ops-bot.served": cap,
        "ops-bot.refused": burst - cap,
        "ops-bot.refused.codes": ["too_many_in_flight"],
        "ops-bot.refused.retryable": [True],
        "ops-bot.refused.retry_after_s": [1.0],
        "upstream.held_at_once": cap,
        "upstream.served": cap,
        "upstream.refused": 0,
    }
    return r


async def scenario_kill_switch(before: int = 6) -> ScenarioResult:
    r = ScenarioResult(5, f"an operator suspends ops-bot before its {_ordinal(before)} call")
    async with _kill_switch() as path, running_upstream() as (demo, url):
        config = demo_config(url, gateway={"development": True, "suspended_file": str(path)})
        async with running_gateway(config) as (_, gw), connect(gw, TOKENS["ops-bot"]) as client:

            async def operator(step: int) -> None:
                if step == before:
                    write_suspensions(path, ["ops-bot"])

            log = await run_agent(client, "ops-bot", max_steps=STEPS, before_call=operator)
            write_suspensions(path, [])
            after = await call_once(client)
    r.rows.append(Row.of(log))
    r.logs.append(log.to_dict())
    r.logs.append({"agent": "ops-bot", "after_clear": after.to_dict()})
    r.notes.append(f"switch cleared, same connection, next call: {'refused' if after.is_error else 'served'}")
    r.notes.append(_upstream_note(demo))
    r.observed = {
        **_observe("ops-bot", log),
        "ops-bot.after_clear.served": not after.is_error,
        **_upstream(demo),
    }
    r.expected = {
        "ops-bot.calls": before,
        "ops-bot.served": before - 1,
        "ops-bot.refused": 1,
        "ops-bot.stopped_by": "the server",
        "ops-bot.last.code": "agent_suspended",
        "ops-bot.last.retryable": False,
        "ops-bot.after_clear.served": True,
        "upstream.served": before,
        "upstream.refused": 0,
    }
    return r


async def scenario_http_gate(budget: int = 5) -> ScenarioResult:
    r = ScenarioResult(6, "the same refusals in the tool and at the HTTP gate (refuse_at = edge)")
    async with _kill_switch() as path, running_upstream() as (demo, url):
        config = demo_config(
            url, gateway={"development": True, "suspended_file": str(path)}, limits={"budget": budget}
        )
        config["identities"].append({"agent": "edge-bot", "token": TOKENS["edge-bot"], "refuse_at": "edge"})
        async with running_gateway(config) as (_, gw):
            async with connect(gw, TOKENS["ops-bot"]) as client:
                tool_log = await run_agent(client, "ops-bot", max_steps=STEPS)
            with http_error_statuses(gw) as budget_statuses:
                async with connect(gw, TOKENS["edge-bot"]) as client:
                    edge_log = await run_agent(client, "edge-bot", max_steps=STEPS)
            write_suspensions(path, ["edge-bot"])
            with http_error_statuses(gw) as suspended_statuses:
                async with connect(gw, TOKENS["edge-bot"]) as client:
                    suspended_log = await run_agent(client, "edge-bot", max_steps=STEPS)
    r.rows.append(Row.of(tool_log, "ops-bot (in the tool)"))
    r.rows.append(Row.of(edge_log, "edge-bot (at the gate)"))
    r.rows.append(Row.of(suspended_log, "edge-bot, suspended"))
    r.logs.extend(log.to_dict() for log in (tool_log, edge_log, suspended_log))
    if tool_log.last is not None:
        r.notes.append(f'in the tool, the model reads: "{tool_log.last.text}"')
    r.notes.append(
        f"at the gate, it reads nothing: HTTP {_statuses(budget_statuses)} over budget and "
        f"HTTP {_statuses(suspended_statuses)} suspended, each one attempt, then the client raised"
    )
    r.notes.append(_upstream_note(demo))
    r.observed = {
        **_observe("ops-bot", tool_log),
        "edge-bot.calls": edge_log.calls,
        "edge-bot.served": edge_log.served,
        "edge-bot.raised": (edge_log.raised or "").split(":")[0] or None,
        "edge-bot.http_errors": budget_statuses,
        "edge-bot.suspended.calls": suspended_log.calls,
        "edge-bot.suspended.raised": (suspended_log.raised or "").split(":")[0] or None,
        "edge-bot.suspended.http_errors": suspended_statuses,
        **_upstream(demo),
    }
    r.expected = {
        "ops-bot.calls": budget + 1,
        "ops-bot.served": budget,
        "ops-bot.refused": 1,
        "ops-bot.stopped_by": "the server",
        "ops-bot.last.code": "budget_exhausted",
        "ops-bot.last.retryable": False,
        "edge-bot.calls": budget + 1,
        "edge-bot.served": budget,
        "edge-bot.raised": "MCPError",
        "edge-bot.http_errors": [429],
        "edge-bot.suspended.calls": 1,
        "edge-bot.suspended.raised": "MCPError",
        "edge-bot.suspended.http_errors": [403],
        "upstream.served": 2 * budget,
        "upstream.refused": 0,
    }
    return r


def _statuses(statuses: list[int]) -> str:
    return ", ".join(str(s) for s in statuses) or "(none)"


def _ordinal(n: int) -> str:
    words = {1: "first", 2: "second", 3: "third", 4: "fourth", 5: "fifth", 6: "sixth", 7: "seventh"}
    return words.get(n, f"{n}th")


async def scenario_control_plane_stop(before: int = 6) -> ScenarioResult:
    r = ScenarioResult(
        7, f"an operator stops ops-bot's run through the control plane before its {_ordinal(before)} call"
    )
    with tempfile.TemporaryDirectory(prefix="haltwire-demo-") as tmp:
        async with (
            running_control_plane(Path(tmp) / "control.db") as control_url,
            running_upstream() as (demo, url),
        ):
            link = {"url": control_url, "token": CONTROL_TOKENS["gateway"], "staleness_s": 5.0}
            config = demo_config(url, control=link, leases={"keys": LEASE_KEYS})
            async with (
                running_gateway(config) as (app, gw),
                connect(gw, TOKENS["ops-bot"]) as client,
                ControlClient(control_url, CONTROL_TOKENS["ops-bot"]) as runtime,
                Lease.start(runtime) as lease,
                httpx2.AsyncClient(base_url=control_url, timeout=10) as http,
            ):
                operator = {"Authorization": f"Bearer {CONTROL_TOKENS['operator']}"}
                watch = app.gateway.stops
                assert watch is not None
                issued: dict[str, Any] = {}

                async def stop_the_run(step: int) -> None:
                    if step != before:
                        return
                    reply = await http.post(
                        "/v1/stops",
                        json={"scope": f"run:{lease.run_id}", "reason": "refund storm"},
                        headers=operator,
                    )
                    answered = anyio.current_time()
                    issued.update(reply.json())
                    with anyio.fail_after(5):  # the push to the gateway, measured below
                        await watch.reached(issued["revision"])
                    issued["reached_gateway_ms"] = (anyio.current_time() - answered) * 1000

                meta = {LEASE_META: lease.token}
                log = await run_agent(client, "ops-bot", max_steps=STEPS, before_call=stop_the_run, meta=meta)
                with anyio.move_on_after(5):
                    await lease.ended.wait()
                await http.post(
                    f"/v1/stops/{issued['stop_id']}/clear", json={"reason": "fixed"}, headers=operator
                )
                with anyio.fail_after(5):  # the clear reaches the gateway
                    await watch.reached(issued["revision"] + 1)
                old = await call_once(client, meta=meta)
                async with Lease.start(runtime) as fresh:
                    new = await call_once(client, meta={LEASE_META: fresh.token})
    r.rows.append(Row.of(log))
    r.logs.append(log.to_dict())
    r.logs.append({"agent": "ops-bot", "after_clear": {"old_lease": old.to_dict(), "new_run": new.to_dict()}})
    notice = lease.notice
    r.notes.append(
        f"stop {issued.get('stop_id')} on run:{lease.run_id} reached the gateway "
        f"{issued.get('reached_gateway_ms', float('nan')):.1f} ms after the API answered"
    )
    r.notes.append(
        f"the lease in the agent process ended by push: {notice.message if notice else '(not ended)'}"
    )
    r.notes.append(
        f"after the clear: the old lease is {old.code}, a new run is {'refused' if new.is_error else 'served'}"
    )
    r.notes.append(_upstream_note(demo))
    r.observed = {
        **_observe("ops-bot", log),
        "ops-bot.lease.ended_by": notice.stop_id if notice else None,
        "ops-bot.after_clear.old_lease": old.code,
        "ops-bot.after_clear.new_run.served": not new.is_error,
        **_upstream(demo),
    }
    r.expected = {
        "ops-bot.calls": before,
        "ops-bot.served": before - 1,
        "ops-bot.refused": 1,
        "ops-bot.stopped_by": "the server",
        "ops-bot.last.code": "stopped",
        "ops-bot.last.retryable": False,
        "ops-bot.lease.ended_by": issued.get("stop_id"),
        "ops-bot.after_clear.old_lease": "lease_invalid",
        "ops-bot.after_clear.new_run.served": True,
        "upstream.served": before,
        "upstream.refused": 0,
    }
    return r


SCENARIOS: Final[dict[int, Callable[[], Awaitable[ScenarioResult]]]] = {
    1: scenario_terminal_budget,
    2: scenario_please_try_again,
    3: scenario_upstream_quota,
    4: scenario_in_flight,
    5: scenario_kill_switch,
    6: scenario_http_gate,
    7: scenario_control_plane_stop,
}


async def run_scenario(number: int) -> ScenarioResult:
    """Run one scenario; a scenario that raises or hangs is a deviation, not a crash."""
    start = anyio.current_time()
    try:
        with anyio.fail_after(SCENARIO_TIMEOUT_S):
            result = await SCENARIOS[number]()
    except Exception as exc:
        result = ScenarioResult(number, f"scenario {number}", error=f"{type(exc).__name__}: {exc}")
    result.elapsed_s = anyio.current_time() - start
    return result


async def run_all(numbers: list[int] | None = None) -> list[ScenarioResult]:
    return [await run_scenario(n) for n in (numbers or sorted(SCENARIOS))]


def render(results: list[ScenarioResult], console: Console) -> None:
    for r in results:
        console.print(f"[bold]{r.number}. {r.title}[/bold]")
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
        table.add_column("agent", no_wrap=True)
        table.add_column("calls", justify="right")
        table.add_column("served", justify="right")
        table.add_column("refused", justify="right")
        table.add_column("ended by")
        table.add_column("last answer", overflow="fold")
        for row in r.rows:
            table.add_row(row.who, str(row.calls), str(row.served), str(row.refused), row.ended, row.last)
        if r.rows:
            console.print(Padding(table, (0, 0, 0, 2), expand=False))
        for note in r.notes:
            console.print(f"  {note}", soft_wrap=True)
        if r.ok:
            console.print(f"  [green]as expected[/green] ({r.elapsed_s:.1f} s)")
        else:
            for d in r.deviations:
                console.print(f"  [red]deviated:[/red] {d}")
        console.print()
    failed = [r for r in results if not r.ok]
    if failed:
        which = ", ".join(str(r.number) for r in failed)
        console.print(f"[red]scenario {which} deviated from the expected numbers[/red]")
    else:
        what = f"all {len(results)} scenarios" if len(results) > 1 else f"scenario {results[0].number}"
        console.print(f"[green]{what} behaved as expected[/green]")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="haltwire demo loop",
        description="Run the seed's scenarios against a real gateway and upstream on loopback.",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--only",
        type=int,
        action="append",
        choices=sorted(SCENARIOS),
        metavar="N",
        help="run scenario N only (repeatable)",
    )
    args = parser.parse_args(argv)
    results = anyio.run(run_all, sorted(set(args.only)) if args.only else None)
    ok = all(r.ok for r in results)
    if args.json:
        print(json.dumps({"ok": ok, "scenarios": [r.to_dict() for r in results]}, indent=2))
    else:
        console = Console(highlight=False)
        if not console.is_terminal:
            console.width = max(console.width, 140)
        render(results, console)
    if not ok:
        failed = ", ".join(str(r.number) for r in results if not r.ok)
        print(f"haltwire demo loop: scenario {failed} deviated", file=sys.stderr)
    return 0 if ok else 1
