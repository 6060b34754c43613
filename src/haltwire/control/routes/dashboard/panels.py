"""The overview's live panels: active stops, live runs, intents awaiting approval, recent
refusals and tripwire firings, each read through the rule the API's route calls, rendered as
an HTML fragment (the page includes them; the live stream pushes them again as they change).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Final

import anyio

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
    #: Its latest lease grant's (granted_at, expires_at), as the run store has it (written about
    #: once a second by the process that granted it), or None.
    lease: tuple[float, float] | None = None


def _stopped_by(run: RunRecord, active: dict[str, StopRecord]) -> StopRecord | None:
    for kind in ("global", "tenant", "version", "agent", "run"):
        for scope in run.scopes:
            if scope.kind == kind and str(scope) in active:
                return active[str(scope)]
    return None


async def allowed(plane: Plane, caller: Caller) -> None:
    """``Refused`` unless ``caller``'s role may read every panel (operators and viewers may)."""
    for action in ("stops.read", "runs.list", "intents.list", "audit.read"):
        await authorize(plane, caller, action)


async def read(plane: Plane, caller: Caller) -> dict[str, object]:
    """What the panels show, read as ``caller`` (every read authorized by role)."""
    await allowed(plane, caller)
    active = await stops.listed(plane, caller, every=False)
    by_scope = {s.scope: s for s in active}
    live, cut = await blast.live_runs(plane)
    shown = live[:ROWS]
    leases = await plane.open.runs.grants([r.run_id for r in shown])
    waiting: list[Intent] = await plane.open.intents.list(states=["awaiting_approval"], limit=ROWS)
    newest = await recent.recent(plane, caller, ROWS)
    return {
        "stops": active,
        "runs": [LiveRun(r, _stopped_by(r, by_scope), leases.get(r.run_id)) for r in shown],
        "runs_live": len(live),
        "runs_cut": cut,
        "intents": waiting,
        "refusals": newest.refusals,
        "firings": newest.firings,
    }


def render(data: dict[str, object], caller: Caller, csrf: str) -> dict[str, str]:
    """Each panel's HTML, its forms carrying ``csrf``."""
    buttons = may(caller)
    return {name: fragment(f"_{name}.html", **data, caller=caller, csrf=csrf, may=buttons) for name in NAMES}


class Board:
    """The panels, read once for every open tab (``Board`` per app).

    Each open tab looks again after every registry change and every few seconds; read per tab,
    ten tabs made a stop five times slower (``benchmarks/dashboard.py``). So a look asks for a
    read started after a moment (``since``, when the tab woke): the first tab to ask reads, the
    others, waiting on the lock, take its read. The HTML is rendered once per role, with a
    placeholder where each session's CSRF token goes. Operators and viewers see the same rows
    (neither is narrowed, ``access.NARROWED``); each tab's role is still authorized."""

    _CSRF: Final = "@@csrf@@"

    def __init__(self) -> None:
        self._lock = anyio.Lock()
        self._read_at = -math.inf
        self._data: dict[str, object] | None = None
        self._html: dict[str, dict[str, str]] = {}

    async def look(self, plane: Plane, caller: Caller, session: Session, since: float) -> dict[str, str]:
        """Each panel's HTML for ``session``, from a read started at ``since`` (monotonic) or later."""
        await allowed(plane, caller)
        async with self._lock:
            if self._data is None or self._read_at < since:
                started = time.monotonic()
                self._data, self._html = await read(plane, caller), {}
                self._read_at = started
            html = self._html.get(caller.role)
            if html is None:
                html = self._html[caller.role] = render(self._data, caller, self._CSRF)
        return {name: text.replace(self._CSRF, session.csrf) for name, text in html.items()}
