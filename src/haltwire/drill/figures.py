"""A drill's figures: one ``Rep`` for each canary run measured, summed up by rung and judged.

In this order, ``summarize(reps, target_s)``:

1. groups the reps by rung, in the order the rungs ran;
2. for each rung, the seconds from the stop's acknowledgement (the answer to ``POST /v1/stops``;
   for ``fail_closed``, the moment the control plane was paused) to the last side effect the
   canary upstream recorded for the run (0 when there was none after it), to the first refusal
   the runtime saw, and to the lease's end (the SDK's runtime): p50, p99 and max;
3. the side effects recorded after the stop: how many, and what they were;
4. the verdict: a rung is ``skipped`` when it cannot run on the stack drilled (the sentence
   says why), ``broken`` when one of its reps could not be measured (the run was never
   refused, say: the sentence says which), ``fail`` when a last side effect came later than the
   class's ``time_to_stop_s``, ``pass`` otherwise.

``to_json`` and ``table`` render the summary.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.table import Table


@dataclass
class Rep:
    """One canary run, stopped once."""

    rung: str
    rep: int
    #: The stop's scope, or ``control plane paused`` (fail_closed).
    scope: str
    #: Its kind (run, tenant, agent, version, global, tool), or ``unreachable`` (fail_closed).
    scope_kind: str
    #: ``sdk`` (the well-behaved runtime) or ``ignoring`` (the runtime that ignores stops).
    runtime: str
    run_id: str
    ack_at: float
    last_effect_s: float | None = None
    first_refusal_s: float | None = None
    lease_end_s: float | None = None
    refusal: str | None = None
    #: The side effects of the run the canary upstream recorded, in all and after the stop.
    effects_total: int = 0
    effects_after: list[str] = field(default_factory=list)
    #: The calls the runtime saw served (at most one fewer than recorded: a call cut in flight).
    served_seen: int = 0
    #: Refusals the runtime saw before the stop (the gateway had not yet heard the last clear).
    refused_before_stop: int = 0
    #: Why this rep could not be measured, as a sentence naming the rung; None when it was.
    broken: str | None = None
    #: The stop the drill issued for this rep (None: fail_closed, whose stop is a pause).
    stop_id: str | None = None
    #: Every side effect of the run the canary upstream recorded, in seconds from the stop's
    #: acknowledgement (negative before it): what the report's timeline plots.
    effects_at_s: list[float] = field(default_factory=list)
    #: To the stream's or tunnel's cut (``model``, ``egress``): open at the stop, closed under it.
    cut_s: float | None = None
    #: The executor rung: the run's intents by state, and what was performed on a decision (its
    #: final check) at or after the stop's revision (must be none).
    intents: dict[str, int] = field(default_factory=dict)
    decided_after_stop: list[str] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (``q`` in 0..1) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _spread(values: list[float | None]) -> dict[str, float] | None:
    known = [v for v in values if v is not None]
    if not known:
        return None
    return {"p50": percentile(known, 0.5), "p99": percentile(known, 0.99), "max": max(known)}


@dataclass
class RungSummary:
    rung: str
    reps: list[Rep]
    target_s: float
    #: Why the rung was not run (it cannot be on this stack); None when it was.
    skipped: str | None = None

    @property
    def broken(self) -> list[str]:
        return [r.broken for r in self.reps if r.broken is not None]

    @property
    def missed(self) -> list[Rep]:
        return [r for r in self.reps if r.last_effect_s is not None and r.last_effect_s > self.target_s]

    @property
    def decided_late(self) -> list[Rep]:
        """Reps with an intent performed on a decision taken after the stop (the executor's)."""
        return [r for r in self.reps if r.decided_after_stop]

    @property
    def verdict(self) -> str:
        if self.skipped is not None:
            return "skipped"
        return "broken" if self.broken else "fail" if self.missed or self.decided_late else "pass"

    def as_json(self) -> dict[str, Any]:
        after = [what for r in self.reps for what in r.effects_after]
        return {
            "rung": self.rung,
            "target_s": self.target_s,
            "verdict": self.verdict,
            "broken": self.broken,
            "skipped": self.skipped,
            "samples": len(self.reps),
            "scope_kinds": sorted({r.scope_kind for r in self.reps}),
            "to_last_side_effect_s": _spread([r.last_effect_s for r in self.reps]),
            "to_first_refusal_s": _spread([r.first_refusal_s for r in self.reps]),
            "to_lease_end_s": _spread([r.lease_end_s for r in self.reps]),
            "side_effects_after_stop": {"count": len(after), "what": after},
            "side_effects_total": sum(r.effects_total for r in self.reps),
            "to_cut_s": _spread([r.cut_s for r in self.reps]),
            "decided_after_stop": {
                "count": sum(len(r.decided_after_stop) for r in self.reps),
                "what": [w for r in self.reps for w in r.decided_after_stop],
            },
            "reps": [asdict(r) for r in self.reps],
        }


def summarize(reps: list[Rep], target_s: float) -> list[RungSummary]:
    rungs: dict[str, list[Rep]] = {}
    for rep in reps:
        rungs.setdefault(rep.rung, []).append(rep)
    return [RungSummary(name, its, target_s) for name, its in rungs.items()]


def to_json(summaries: list[RungSummary], canary_total: int, seed: int) -> dict[str, Any]:
    return {
        "ok": all(s.verdict in ("pass", "skipped") for s in summaries),
        "seed": seed,
        "canary_record_total": canary_total,
        "rungs": [s.as_json() for s in summaries],
    }


def _ms(spread: dict[str, float] | None) -> str:
    if spread is None:
        return "-"
    return " / ".join(f"{spread[k] * 1000:.0f}" for k in ("p50", "p99", "max"))


def table(summaries: list[RungSummary]) -> Table:
    """The figures, one row a rung, in milliseconds (p50 / p99 / max)."""
    out = Table(title="ms from the stop's acknowledgement (p50 / p99 / max)")
    columns = (
        "rung",
        "runs",
        "last side effect",
        "first refusal",
        "lease end",
        "after stop",
        "target",
        "verdict",
    )
    for column in columns:
        out.add_column(column, justify="left" if column == "rung" else "right", no_wrap=True)
    for s in summaries:
        data = s.as_json()
        colour = {"pass": "green", "fail": "red", "broken": "red", "skipped": "yellow"}[s.verdict]
        out.add_row(
            s.rung,
            str(data["samples"]),
            _ms(data["to_last_side_effect_s"]),
            _ms(data["to_first_refusal_s"]),
            _ms(data["to_lease_end_s"]),
            str(data["side_effects_after_stop"]["count"]),
            f"{s.target_s:g} s",
            f"[{colour}]{s.verdict}[/{colour}]",
        )
    return out
