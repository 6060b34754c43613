"""A stop's blast radius before it is issued, and the live runs it is read from.

What an operator sees before pressing stop: how many live runs a scope would stop, and which
tenants, agents and versions they belong to. A live run is one registered and not ended, read
from the run store (newest first, at most ``LIVE_MOST``; past that the count is a floor).

Order of checks in ``radius``: the caller's role may list runs (``runs.list``), then the scope
parses (``Refused`` 422 otherwise), then the runs are matched:

- ``run``, ``agent``, ``tenant``, ``version``, ``global``: the runs whose scopes hold it (the
  same ``RunRecord.scopes`` the lease desk checks, so the radius is what the stop would end);
- ``tool``: the runs that declared the tool (its calls are refused; the runs go on);
- ``model``: runs declare no models, so none is named; the note says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from haltwire.control.access import authorize
from haltwire.control.config import Caller
from haltwire.control.errors import invalid
from haltwire.control.plane import Plane
from haltwire.scope import Scope, ScopeError
from haltwire.store.runs import RunRecord

#: The most runs read to find the live ones.
LIVE_MOST: Final = 5000
#: Run ids a radius names (the count covers them all).
NAMED: Final = 20


@dataclass(frozen=True, slots=True)
class BlastRadius:
    scope: str
    #: Live runs the stop would reach.
    runs: int
    tenants: tuple[str, ...]
    agents: tuple[str, ...]
    versions: tuple[str, ...]
    #: The first ``NAMED`` of them, newest first.
    run_ids: tuple[str, ...]
    #: True when more runs were live than read: ``runs`` is a floor.
    at_least: bool
    #: What the count does not say, in words (or "").
    note: str


async def live_runs(plane: Plane) -> tuple[list[RunRecord], bool]:
    """The runs not ended, newest first, and whether the read was cut at ``LIVE_MOST``."""
    read = await plane.open.runs.list(LIVE_MOST)
    return [r for r in read if not r.ended], len(read) >= LIVE_MOST


def _reaches(scope: Scope, run: RunRecord) -> bool:
    if scope.kind == "tool":
        return scope.value in run.tools
    return scope in run.scopes


async def radius(plane: Plane, caller: Caller, scope_text: str) -> BlastRadius:
    """What a stop on ``scope_text`` would reach now (the module's docstring)."""
    await authorize(plane, caller, "runs.list")
    try:
        scope = Scope.parse(scope_text)
    except ScopeError as exc:
        raise invalid(str(exc)) from None
    live, cut = await live_runs(plane)
    hit = [r for r in live if _reaches(scope, r)]
    note = ""
    if scope.kind == "tool":
        note = f"calls to {scope.value} are refused for every run; the runs named declared it, and go on without it"
    elif scope.kind == "model":
        note = f"calls to model {scope.value} are refused for every run; runs do not declare their models"
    return BlastRadius(
        scope=str(scope),
        runs=len(hit),
        tenants=tuple(sorted({r.tenant for r in hit})),
        agents=tuple(sorted({r.agent for r in hit})),
        versions=tuple(sorted({f"{r.agent}@{r.version}" for r in hit})),
        run_ids=tuple(r.run_id for r in hit[:NAMED]),
        at_least=cut,
        note=note,
    )
