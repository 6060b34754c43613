"""The overview's live panels: active stops, live runs, intents awaiting approval, recent
refusals and tripwire firings, each read through the rule the API's route calls, rendered as
an HTML fragment (the page includes them; the live stream pushes them again as they change).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from haltwire.control import blast, recent, stops
from haltwire.control.access import authorize
from haltwire.control.config import Caller
from haltwire.control.plane import Plane
from haltwire.control.routes.dashboard.render import fragment
from haltwire.control.routes.dashboard.sessions import Session
from haltwire.control.routes.dashboard.web import may
from haltwire.intents import Intent
from haltwire.stops import StopRecord
from haltwire.store.runs import RunRecord

#: The panels, in the page's order; each is ``templates/_NAME.html``.
NAMES: Final = ("stops", "runs", "intents", "refusals", "firings")
#: Rows a panel shows.
ROWS: Final = 50


@dataclass(frozen=True, slots=True)
class LiveRun:
    run: RunRecord
    #: The active stop that covers the run, if one does (the broadest, as the gateways name it).
    stopped_by: StopRecord | None


def _stopped_by(run: RunRecord, active: dict[str, StopRecord]) -> StopRecord | None:
    for kind in ("global", "tenant", "version", "agent", "run"):
        for scope in run.scopes:
            if scope.kind == kind and str(scope) in active:
                return active[str(scope)]
    return None


async def read(plane: Plane, caller: Caller) -> dict[str, object]:
    """What the panels show, read as ``caller`` (every read authorized by role)."""
    await authorize(plane, caller, "stops.read")
    active = await stops.listed(plane, caller, every=False)
    by_scope = {s.scope: s for s in active}
    live, cut = await blast.live_runs(plane)
    await authorize(plane, caller, "intents.list")
    waiting: list[Intent] = await plane.open.intents.list(states=["awaiting_approval"], limit=ROWS)
    newest = await recent.recent(plane, caller, ROWS)
    return {
        "stops": active,
        "runs": [LiveRun(r, _stopped_by(r, by_scope)) for r in live[:ROWS]],
        "runs_live": len(live),
        "runs_cut": cut,
        "intents": waiting,
        "refusals": newest.refusals,
        "firings": newest.firings,
    }


def render(data: dict[str, object], caller: Caller, session: Session) -> dict[str, str]:
    """Each panel's HTML."""
    buttons = may(caller)
    return {name: fragment(f"_{name}.html", **data, caller=caller, csrf=session.csrf, may=buttons) for name in NAMES}
