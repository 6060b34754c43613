"""The refund incident replayed from the gateway's call log, as ``haltwire tripwires test`` does.

The demo's gateway writes a call log (``[call_log]``). Once the runs are over the gateway is
stopped (SIGTERM: its last records are written at shutdown) and the log is replayed through the
``[[tripwires]]`` of the same config, with the backtest's own code
(``haltwire.tripwires.backtest``, a memory store, no control plane). The seed's incident must
come out as it happened live, per run: the per-run rule at the run's sixth ``issue_refund``, the
content rule (shadow) at the ``read_order`` of the injected review (the last before its first
refund, which is of that order), nothing else; and every
firing the replay finds is one the gateway recorded on that same call.
"""

from __future__ import annotations

import shutil
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from haltwire.demo.refunds_stack import CONTENT_RULE, PER_RUN, RUN_RULE
from haltwire.gateway.config import load_config
from haltwire.tripwires.backtest import records, replay, report

REFUND: str = "issue_refund"
READ: str = "read_order"


@dataclass
class Backtest:
    """What the replay of the call log found, and where it differs from the runs' live firings."""

    calls: int = 0
    rules: int = 0
    same: bool = False
    firings: list[dict[str, Any]] = field(default_factory=list)
    #: A run's deviations, by run id; ``""`` for what is about no one run.
    deviations: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def json(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "rules": self.rules,
            "same": self.same,
            "firings": self.firings,
            "deviations": {k: v for k, v in self.deviations.items() if v},
        }


async def backtest(config: Path, log: Path, run_ids: list[str]) -> Backtest:
    """Replay ``log`` through ``config``'s rules and check each of ``run_ids`` against the seed."""
    rules = load_config(config).tripwires
    out = report(await replay(rules, [str(log)]))
    bt = Backtest(calls=out["calls"], rules=len(rules), same=out["same"], firings=out["firings"])
    if not bt.same:
        bt.deviations[""].append(f"the replay's firings differ from the log's at calls {out['differs_at']}")
    calls: dict[str, list[tuple[int, str]]] = defaultdict(list)  # run -> (index, tool), in log order
    for index, (_, record) in enumerate(records([str(log)])):
        calls[str(record.get("run"))].append((index, str(record["tool"])))
    for run_id in run_ids:
        bt.deviations[run_id].extend(_run_deviations(run_id, calls[run_id], bt.firings))
    return bt


def _run_deviations(run_id: str, calls: list[tuple[int, str]], firings: list[dict[str, Any]]) -> list[str]:
    mine = [f for f in firings if f["run"] == run_id]
    refunds = [i for i, tool in calls if tool == REFUND]
    if len(refunds) <= PER_RUN:
        return [f"the call log holds {len(refunds)} issue_refund calls of the run, not {PER_RUN + 1}"]
    out = []
    expected = [
        (RUN_RULE, refunds[PER_RUN]),
        # The injected review is the order the agent refunds first: its read, the last before.
        (CONTENT_RULE, max((i for i, tool in calls if tool == READ and i < refunds[0]), default=None)),
    ]
    for rule, at in expected:
        found = [f for f in mine if f["rule"] == rule]
        if [f["index"] for f in found] != [at]:
            where = "the sixth issue_refund" if rule == RUN_RULE else "the read_order before the first refund"
            out.append(f"the replay fired {rule} at calls {[f['index'] for f in found]}, not at {where} ({at})")
        elif not found[0].get("in_log"):
            out.append(f"the replay fired {rule} at call {at}, where the live gateway did not")
    others = sorted({f["rule"] for f in mine} - {RUN_RULE, CONTENT_RULE})
    if others:
        out.append(f"the replay fired {', '.join(others)} on the run too")
    return out


def keep(config: Path, log: Path, directory: Path) -> tuple[Path, Path]:
    """Copy the gateway's config and its call log into ``directory`` (created), for a user to
    replay them with ``haltwire tripwires test``."""
    directory.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(config, directory)), Path(shutil.copy(log, directory))
