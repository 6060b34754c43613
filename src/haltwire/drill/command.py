"""``haltwire drill`` (``--embedded``, or a running stack's ``--control``, ``--agents``,
``--gateway`` and ``--token-file``) ``[--reps N] [--rungs R,...] [--json] [--html FILE] [--seed S]``.

In this order:

1. the arguments are checked (exit 2 and a sentence for bad usage, a bad token file among it);
2. the stack starts (``drill.stack``), or for a running stack its canary, and ``drill.remote``
   checks that the stack has what a drill needs (exit 1 and a sentence naming what is missing);
3. each rung runs its ``--reps`` reps (``drill.rungs``, ``drill.ladder``), a progress bar on
   stderr; the stop rungs take the scope kinds round-robin (run, tenant, agent, version,
   global, tool, model; a running stack's without ``global``), each rep the next kind its rung
   accepts; a rep that cannot be measured ends its rung (broken) and the drill goes on with the
   next; a rung whose part cannot run here (``drill.parts``), or that a running stack cannot
   drill (``fail_closed`` and the ladder's rungs), is skipped, with a sentence saying why;
4. the canary records of the drill are counted (the upstream's, the targets'), the control plane asked what the drill
   left behind (its stops still active, its runs not ended, the audit records of its runs and
   stops not marked as drill data: all 0), its processes taken down (the embedded stack with its
   temporary directory);
5. the figures are printed (a table, or ``--json``; with ``--html FILE`` also the report,
   ``drill.html``), then a sentence for each broken rung, skipped rung and missed target.

Exit status: 0 when every rung met the class's ``time_to_stop_s``, 1 when a target was missed, a
rung is broken or the drill left something behind, 2 for bad usage, 130 when interrupted (Ctrl-C
or SIGTERM: the stack is taken down first).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import anyio
import httpx2
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from haltwire import __version__
from haltwire.demo.processes import StackFailed
from haltwire.drill import parts
from haltwire.drill.figures import Rep, RungSummary, summarize, table, to_json
from haltwire.drill.html import render
from haltwire.drill.ladder import KINDS, KindCycle, Ladder
from haltwire.drill.remote import KINDS as REMOTE_KINDS
from haltwire.drill.remote import (
    NO_FAIL_CLOSED,
    NO_PARTS,
    RemoteStack,
    TargetMissing,
    check,
    read_tokens,
    running_remote,
    unmarked,
)
from haltwire.drill.rungs import RUNGS, Drill, RungBroken, operator_client
from haltwire.drill.stack import AGENT_CLASS, CLASS_TIMING, Target, running_stack
from haltwire.errors import unwrapped
from haltwire.runtime import ControlRefused, ControlUnreachable, StopRequested

#: A hard bound on one rep (its own waits are shorter): a hang is a failure, not a wait.
REP_TIMEOUT_S: Final = 60.0
#: Every rung, in the order ``--rungs`` lists them by default: the ladder's rungs between the
#: gateway's and fail_closed (which pauses the control plane every part follows).
ALL_RUNGS: Final = (*RUNGS[:2], *KINDS, *RUNGS[2:])


#: What breaks a rep (its rung): anything else is a bug, and raised.
REP_FAILURES: Final = (
    RungBroken,
    StopRequested,
    ControlRefused,
    ControlUnreachable,
    httpx2.HTTPError,
    TimeoutError,
)


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


@contextmanager
def one_failure() -> Iterator[None]:
    """A rep's failure as itself: a task group's lone exception, or the first of several that are
    all rep failures (both canaries of a fail_closed rep failing to register, say)."""
    try:
        with unwrapped():
            yield
    except BaseExceptionGroup as group:
        leaves = list(_leaves(group))
        if not leaves or not all(isinstance(e, REP_FAILURES) for e in leaves):
            raise
        raise leaves[0] from None


def _usage(message: str) -> int:
    print(f"haltwire drill: {message}", file=sys.stderr)
    return 2


@dataclass
class Plan:
    """What is drilled: the stack (its own, or a running one), the scope kinds taken round-robin,
    the rungs that cannot run on it (and why), and the agent class judged."""

    opened: Callable[[], AbstractContextManager[Target]]
    kinds: tuple[str, ...] = KindCycle.ORDER
    skipped: dict[str, str] = field(default_factory=dict)
    agent_class: dict[str, Any] = field(default_factory=lambda: {"name": AGENT_CLASS, **CLASS_TIMING})
    label: str = "embedded"
    #: A running stack's start-up check (``drill.remote.check``); None for the drill's own.
    remote: bool = False
    #: The target when given (``--target-s``); None: the class's.
    target: float | None = None

    def drilled(self, rungs: list[str]) -> list[str]:
        return [r for r in rungs if r not in self.skipped]

    @property
    def target_s(self) -> float:
        return float(self.agent_class["time_to_stop_s"])


def _plan(args: argparse.Namespace) -> Plan | str:
    """The plan, or a sentence saying what is wrong with the arguments."""
    running = [args.control, args.agents, args.gateway, args.token_file]
    if args.embedded:
        if any(v is not None for v in running):
            return "--embedded drills a stack of its own: drop --control, --agents, --gateway and --token-file"
        plan = Plan(lambda: running_stack(broken=args.broken, parts=parts.needed(plan.drilled(_rungs(args)))))
        return plan
    if all(v is None for v in running):
        return "give --embedded, or a running stack's --control, --agents, --gateway and --token-file"
    if any(v is None for v in running):
        return "drilling a running stack needs --control, --agents, --gateway and --token-file"
    if args.broken is not None:
        return "--break is for --embedded"
    if args.target_s is not None and args.target_s <= 0:
        return f"--target-s must be more than 0, not {args.target_s:g}"
    try:
        tokens = read_tokens(args.token_file)
    except ValueError as exc:
        return str(exc)
    canary = args.canary_url if args.canary_url is not None else (args.canary_host, args.canary_port)
    return Plan(
        lambda: running_remote(args.control, args.agents, args.gateway, tokens, canary),
        kinds=REMOTE_KINDS, skipped={r: f"the {r} rung is skipped: {NO_FAIL_CLOSED if r == 'fail_closed' else NO_PARTS}"
                                     for r in (*KINDS, "fail_closed")},
        agent_class={"name": AGENT_CLASS},
        label=f"running: control {args.control}, gateway {args.gateway}", remote=True, target=args.target_s,
    )  # fmt: skip


def _rungs(args: argparse.Namespace) -> list[str]:
    return [r.strip() for r in str(args.rungs).split(",") if r.strip()]


def run(args: argparse.Namespace) -> int:
    rungs = _rungs(args)
    plan = _plan(args)
    if isinstance(plan, str):
        return _usage(plan)
    if args.reps < 1:
        return _usage(f"--reps must be at least 1, not {args.reps}")
    unknown = [r for r in rungs if r not in ALL_RUNGS]
    if unknown or not rungs:
        return _usage(f"unknown rung {', '.join(unknown) or '(none)'}; the rungs are {', '.join(ALL_RUNGS)}")
    skipped = {r: why for r in rungs if (why := plan.skipped.get(r) or parts.unavailable(r)) is not None}
    plan.skipped = skipped
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
        reps, broken, totals, left = anyio.run(_drill, plan, rungs, args.reps, seed, err)
    except StackFailed as exc:
        print(f"haltwire drill: the stack did not start: {exc}", file=sys.stderr)
        return 1
    except TargetMissing as exc:
        print(f"haltwire drill: the stack is not ready for a drill: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("haltwire drill: interrupted; its stack is down", file=sys.stderr)
        return 130
    summaries = summarize(reps, plan.target_s)
    for rung in rungs:  # a rung skipped, or broken before its first rep was measured
        if not any(s.rung == rung for s in summaries):
            summaries.append(RungSummary(rung, [], plan.target_s, skipped=plan.skipped.get(rung)))
    summaries.sort(key=lambda s: rungs.index(s.rung))
    data = to_json(summaries, sum(totals.values()), seed)
    data["canary_records"] = totals
    data["skipped"] = skipped
    data["broken"] = broken
    data["left_behind"] = left
    data["agent_class"] = plan.agent_class
    data["ok"] = data["ok"] and not broken and not any(left.values())
    data.update(reps=args.reps, started_at=started_at, haltwire_version=__version__, stack=plan.label)
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
    return _verdict(summaries, broken, left, plan, err)


def _verdict(
    summaries: list[RungSummary], broken: dict[str, str], left: dict[str, int | None], plan: Plan, err: Console
) -> int:
    ok = not any(left.values())
    if not ok:
        err.print(
            f"[red]the drill left behind {left['active_stops']} stops and {left['runs_not_ended']} runs, "
            f"and {left.get('unmarked_records')} audit records not marked as drill data[/red]"
        )
    for sentence in plan.skipped.values():
        err.print(f"[yellow]{sentence}[/yellow]")
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
        for rep in s.decided_late:
            err.print(
                f"[red]the {s.rung} rung failed: {len(rep.decided_after_stop)} intents of run {rep.run_id} were "
                f"performed on a decision taken after the stop ({rep.scope})[/red]"
            )
            ok = False
    if ok:
        err.print(
            f"every rung met time_to_stop_s {plan.target_s:g} s (agent class {AGENT_CLASS})"
        )
    return 0 if ok else 1


async def _drill(
    plan: Plan, rungs: list[str], reps: int, seed: int, err: Console
) -> tuple[list[Rep], dict[str, str], dict[str, int], dict[str, int | None]]:
    """Steps 2 to 4 of the module's docstring: the reps, the broken rungs' sentences, the size of
    each canary record (the upstream's, the targets'), and what the drill left behind (its active stops, its runs not ended,
    the audit records of its runs and stops not marked as drill data)."""
    out: list[Rep] = []
    broken: dict[str, str] = {}
    cycle = KindCycle()

    def kind(rung: str) -> str:
        """The next kind the rung accepts that the plan drills (never ``global`` on a running stack)."""
        while (taken := cycle.take(rung)) not in plan.kinds:
            pass
        return taken

    with plan.opened() as stack:
        async with (
            operator_client(stack) as operator,
            httpx2.AsyncClient(base_url=stack.canary_url, timeout=5.0) as canary,
            httpx2.AsyncClient(base_url=stack.targets_url, timeout=5.0) as targets,
        ):
            checked: list[str] = []
            if isinstance(stack, RemoteStack):
                ttl_s, check_run = await check(stack)
                checked.append(check_run)
                target = plan.target if plan.target is not None else ttl_s
                plan.agent_class.update(ttl_s=ttl_s, time_to_stop_s=target)
            drill = Drill(stack, operator, canary, random.Random(seed), target=plan.target_s)
            ladder = Ladder(drill, targets)
            before = await drill.total_recorded()  # a canary kept running has drilled before
            columns = (
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
            )
            with Progress(*columns, console=err, transient=True) as progress:
                for rung in plan.drilled(rungs):
                    task = progress.add_task(f"drill: {rung}", total=reps)
                    for n in range(reps):
                        try:
                            with anyio.fail_after(REP_TIMEOUT_S), one_failure():
                                if rung == "fail_closed":
                                    measured = await drill.fail_closed_rep(n)
                                elif rung in KINDS:
                                    measured = [await ladder.rep(rung, n, kind(rung))]
                                else:
                                    measured = [await drill.stop_rep(rung, n, kind(rung))]
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
            totals = {"upstream": await drill.total_recorded() - before}
            if "targets" in getattr(stack, "parts", frozenset()):
                totals["targets"] = await ladder.total_recorded()
            left: dict[str, int | None] = dict(await drill.left_behind([r.run_id for r in out] + checked))
            stops = [(r.stop_id, r.scope) for r in out if r.stop_id is not None]
            left["unmarked_records"] = await unmarked(operator, [r.run_id for r in out] + checked, stops)
    return out, broken, totals, left
