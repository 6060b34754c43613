"""``haltwire demo loop``: the seed's scenarios, run for real on loopback and checked.

Each scenario starts a demo upstream and a fresh gateway in this process, connects the
scripted agent (``haltwire.demo.agent``) with the official MCP client over HTTP, and
compares what the agent did and what the upstream served with the numbers the seed
reports. The command exits 0 when every scenario matched and 1 otherwise, naming the
scenario and the number that deviated. This module numbers, runs and prints the scenarios;
they are in ``loop_scenarios`` (1 to 6), ``loop_control_plane`` (7) and ``loop_tripwire`` (8):

1. a budget of 20 refused with a terminal error: the agent stops at call 21;
2. the same budget refused with "Please try again": the agent runs to its own 200-step cap;
3. no gateway budget, an upstream quota of 50 on the shared key: the looping agent burns
   the quota and a second agent is refused on its first call;
4. at most 2 calls in flight, five sent at once: exactly 2 admitted, 3 told to retry;
5. an operator suspends the agent before its sixth call, then lifts the suspension;
6. the same refusal answered at the HTTP gate (``refuse_at = "edge"``): the client raises;
7. ops-bot runs under a lease from the control plane; an operator stops the run before its
   sixth call: the gateway refuses it ``stopped``, the pushed stop ends the lease, and after
   the clear the old lease stays fenced off while a new run is served;
8. the same call again and again under a budget of 50: the budget stops it at call 51, a
   ``repeated_calls`` tripwire of 5 in a row (enforce) at call 5 (``tripwire_tripped``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Final

import anyio
from rich import box
from rich.console import Console
from rich.padding import Padding
from rich.table import Table

from haltwire.demo.loop_control_plane import scenario_control_plane_stop
from haltwire.demo.loop_results import ScenarioResult
from haltwire.demo.loop_scenarios import (
    scenario_http_gate,
    scenario_in_flight,
    scenario_kill_switch,
    scenario_please_try_again,
    scenario_terminal_budget,
    scenario_upstream_quota,
)
from haltwire.demo.loop_tripwire import scenario_repeated_calls

#: No scenario waits on anything slower than a loopback round trip; this bounds a hang.
SCENARIO_TIMEOUT_S: Final = 120.0

#: The seed's numbering: ``--only N`` and the report name a scenario by it.
SCENARIOS: Final[dict[int, Callable[[], Awaitable[ScenarioResult]]]] = {
    1: scenario_terminal_budget,
    2: scenario_please_try_again,
    3: scenario_upstream_quota,
    4: scenario_in_flight,
    5: scenario_kill_switch,
    6: scenario_http_gate,
    7: scenario_control_plane_stop,
    8: scenario_repeated_calls,
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
