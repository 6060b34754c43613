"""``haltwire drill --embedded [--reps N] [--rungs R,...] [--json] [--html FILE] [--seed S]``.

In this order:

1. the arguments are checked (exit 2 and a sentence for bad usage: this slice drills only the
   stack it starts itself, ``--embedded``);
2. the stack starts (``drill.stack``);
3. each rung runs its ``--reps`` reps (``drill.rungs``), a progress bar on stderr; the stop
   rungs take the scope kinds round-robin (run, tenant, agent, version, global, tool), so three
   reps of ``sdk`` and ``gateway`` cover every kind; a rep that cannot be measured ends its rung
   (broken) and the drill goes on with the next;
4. the canary upstream's whole record is counted, the control plane asked what the drill left
   behind (its stops still active, its runs not ended: both 0), the stack taken down with its
   temporary directory;
5. the figures are printed (a table, or ``--json``; with ``--html FILE`` also the report,
   ``drill.html``), then a sentence for each broken rung and each missed target.

Exit status: 0 when every rung met the class's ``time_to_stop_s``, 1 when a target was missed or
a rung is broken, 2 for bad usage, 130 when interrupted (Ctrl-C or SIGTERM: the stack is taken
down first).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import signal
import sys
from datetime import UTC, datetime
from typing import Final

import anyio
import httpx2
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from haltwire import __version__
from haltwire.demo.processes import StackFailed
from haltwire.drill.figures import Rep, RungSummary, summarize, table, to_json
from haltwire.drill.html import render
from haltwire.drill.rungs import RUNGS, SCOPE_KINDS, Drill, RungBroken, operator_client
from haltwire.drill.stack import AGENT_CLASS, CLASS_TIMING, running_stack
from haltwire.errors import unwrapped
from haltwire.runtime import ControlRefused, ControlUnreachable, StopRequested

#: A hard bound on one rep (its own waits are shorter): a hang is a failure, not a wait.
REP_TIMEOUT_S: Final = 60.0


def _usage(message: str) -> int:
    print(f"haltwire drill: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    rungs = [r.strip() for r in str(args.rungs).split(",") if r.strip()]
    if not args.embedded:
        return _usage("this version drills only a stack it starts itself: give --embedded")
    if args.reps < 1:
        return _usage(f"--reps must be at least 1, not {args.reps}")
    unknown = [r for r in rungs if r not in RUNGS]
    if unknown or not rungs:
        return _usage(f"unknown rung {', '.join(unknown) or '(none)'}; the rungs are {', '.join(RUNGS)}")
    if not args.verbose:  # the fail-closed rung's failed renewals are what it drills
        logging.getLogger("haltwire.runtime").setLevel(logging.ERROR)
    # SIGTERM as Ctrl-C: the stack's processes are taken down either way (``running_stack``).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if args.html is not None and not args.html.parent.is_dir():
        return _usage(f"--html {args.html}: its directory does not exist")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    err = Console(stderr=True)
    try:
        reps, broken, total, left = anyio.run(_drill, rungs, args.reps, seed, args.broken, err)
    except StackFailed as exc:
        print(f"haltwire drill: the stack did not start: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("haltwire drill: interrupted; its stack is down", file=sys.stderr)
        return 130
    summaries = summarize(reps, CLASS_TIMING["time_to_stop_s"])
    for rung in broken:  # a rung broken before its first rep was measured
        if not any(s.rung == rung for s in summaries):
            summaries.append(RungSummary(rung, [], CLASS_TIMING["time_to_stop_s"]))
    data = to_json(summaries, total, seed)
    data["broken"] = broken
    data["left_behind"] = left
    data["agent_class"] = {"name": AGENT_CLASS, **CLASS_TIMING}
    data["ok"] = data["ok"] and not broken and not any(left.values())
    data.update(reps=args.reps, started_at=started_at, haltwire_version=__version__, stack="embedded")
    if args.html is not None:
        args.html.write_text(render(data), encoding="utf-8")
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        err.print(f"seed {seed} (--seed {seed} stops at the same moments)")
        out = Console()
        if not out.is_terminal:  # a file or a pipe: the table whole, not cut to 80 columns
            out = Console(width=120)
        out.print(table(summaries))
    return _verdict(summaries, broken, left, err)


def _verdict(summaries: list[RungSummary], broken: dict[str, str], left: dict[str, int], err: Console) -> int:
    ok = not any(left.values())
    if not ok:
        err.print(
            f"[red]the drill left behind {left['active_stops']} stops and {left['runs_not_ended']} runs[/red]"
        )
    for sentence in broken.values():
        err.print(f"[red]{sentence}[/red]")
        ok = False
    for s in summaries:
        for rep in s.missed:
            err.print(
                f"[red]the {s.rung} rung missed its target: a side effect {rep.last_effect_s:.3f} s after the stop "
                f"({rep.scope}, {rep.runtime} canary) > time_to_stop_s {s.target_s:g} s[/red]"
            )
            ok = False
    if ok:
        err.print(
            f"every rung met time_to_stop_s {CLASS_TIMING['time_to_stop_s']:g} s (agent class {AGENT_CLASS})"
        )
    return 0 if ok else 1


async def _drill(
    rungs: list[str], reps: int, seed: int, break_: str | None, err: Console
) -> tuple[list[Rep], dict[str, str], int, dict[str, int]]:
    """Steps 2 to 4 of the module's docstring: the reps, the broken rungs' sentences, the size of
    the canary's record, and what the drill left behind (its active stops, its runs not ended)."""
    out: list[Rep] = []
    broken: dict[str, str] = {}
    kinds = iter(SCOPE_KINDS[k % len(SCOPE_KINDS)] for k in range(10**9))
    with running_stack(broken=break_) as stack:
        async with (
            operator_client(stack) as operator,
            httpx2.AsyncClient(base_url=stack.canary_url, timeout=5.0) as canary,
        ):
            drill = Drill(stack, operator, canary, random.Random(seed))
            columns = (
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
            )
            with Progress(*columns, console=err, transient=True) as progress:
                for rung in rungs:
                    task = progress.add_task(f"drill: {rung}", total=reps)
                    for n in range(reps):
                        try:
                            with anyio.fail_after(REP_TIMEOUT_S), unwrapped():
                                if rung == "fail_closed":
                                    measured = await drill.fail_closed_rep(n)
                                else:
                                    measured = [await drill.stop_rep(rung, n, next(kinds))]
                        except RungBroken as exc:
                            broken[rung] = str(exc)
                            break
                        except (StopRequested, ControlRefused, ControlUnreachable, httpx2.HTTPError) as exc:
                            broken[rung] = f"the {rung} rung is broken: rep {n} failed: {exc}"
                            break
                        except TimeoutError:
                            broken[rung] = (
                                f"the {rung} rung is broken: rep {n} did not end within {REP_TIMEOUT_S:g} s"
                            )
                            break
                        out.extend(measured)
                        progress.advance(task)
                        sentences = [r.broken for r in measured if r.broken]
                        if sentences:
                            broken[rung] = str(sentences[0])
                            break
            total = await drill.total_recorded()
            left = await drill.left_behind([r.run_id for r in out])
    return out, broken, total, left
