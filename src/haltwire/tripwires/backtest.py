"""``haltwire tripwires test``: replay call logs (``haltwire.tripwires.calllog``) through a config's
``[[tripwires]]``, and tell what would have fired, when, and on which calls.

The replay is the gateway's own engine (``engine.Tripwires``), not a second implementation: its
counts in a memory store, its clock set to the times the live call's tripwires read (else the
record's ``ts``, then ``ended``), no control plane (a trip latches its scope for the rest of the
log, as a gateway without ``[control]`` does; an operator's clear is not replayed). Each record is
taken as far as the live call went: refused before the tripwires, nothing; before routing, its
error judged; refused by a ceiling at admission, nothing counted, its refusal judged; admitted,
the admission rules' counts, then its outcome judged. The engine reads what the record kept in
place of the call: the digest of its arguments (the repeated-calls rule compares digests), the
amounts at the money rules' paths, the digest of its result, the signal kinds a content rule
found. A call the live rules refused but the replayed ones admit is judged as served with an
unknown result. Replaying a log with the config that wrote it gives the firings it recorded.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from haltwire.identity import Identity
from haltwire.refusal import Refusal, iso_utc
from haltwire.store.counters.memory import MemoryCounters
from haltwire.tripwires.calllog import CURRENT, Entry, firing
from haltwire.tripwires.engine import Tripwires
from haltwire.tripwires.rules import TripwireRule
from haltwire.tripwires.signal import Signal

#: Progress on stderr every so many calls.
PROGRESS_EVERY = 100_000


class MalformedLog(ValueError):
    """A line of a call log that is not a record (its file and line in the message)."""


@dataclass
class Call:
    index: int
    where: str
    record: dict[str, Any]
    recorded: list[dict[str, Any]]
    fired: list[dict[str, Any]] = field(default_factory=list)
    at: float = 0.0

    @property
    def same(self) -> bool:
        def key(f: dict[str, Any]) -> tuple[str, str]:
            return f["rule"], f.get("scope", "")

        return sorted(map(key, self.fired)) == sorted(map(key, self.recorded))


def records(paths: Sequence[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each record of the logs in order, with its ``file:line``."""
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path}:{n}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise MalformedLog(f"{where}: not JSON ({exc.msg})") from None
                missing = [k for k in ("ts", "identity", "tool", "stage", "outcome") if k not in record]
                if not isinstance(record, dict) or missing:
                    raise MalformedLog(f"{where}: not a call record (missing {', '.join(missing) or 'fields'})")
                yield where, record


class _Recorded:
    """A content rule's detector in a replay: the signal kinds its rule found in the live call."""

    def __init__(self, rule: str) -> None:
        self.rule = rule
        self.kinds: dict[str, list[str]] = {}

    @property
    def name(self) -> str:
        return "recorded"

    def scan(self, text: str) -> list[Signal]:
        return [Signal("recorded", kind, "") for kind in self.kinds.get(self.rule, [])]


def _nested(path: str, value: Any, into: dict[str, Any]) -> None:
    *parents, last = path.split(".")
    for part in parents:
        into = into.setdefault(part, {})
    into[last] = value


class Replay:
    def __init__(self, rules: Sequence[TripwireRule]) -> None:
        self._times: list[float] = []
        self._detectors = {r.name: _Recorded(r.name) for r in rules if r.kind == "content"}
        self.store = MemoryCounters()
        self.engine = Tripwires(
            rules, self.store, clock=self._clock, labels=lambda tool: self._label, detectors=self._detectors
        )
        self._label: Any = None
        self._fallback = 0.0

    def _clock(self) -> float:
        return self._times.pop(0) if self._times else self._fallback

    async def call(self, index: int, where: str, r: dict[str, Any]) -> Call:
        call = Call(index, where, r, list(r.get("tripwires") or []), at=float(r["ts"]))
        i = r["identity"]
        identity = Identity(str(i["agent"]), str(i.get("tenant", "default")), str(i.get("version", "0")))
        tool, run, stage, outcome = str(r["tool"]), r.get("run"), r["stage"], str(r["outcome"])
        self._label, self._times, self._fallback = r.get("label"), list(r.get("reads") or []), float(r["ts"])
        kinds = {f["rule"]: list(f.get("kinds") or []) for f in call.recorded if "kinds" in f}
        for d in self._detectors.values():
            d.kinds = kinds
        entry = Entry(call.at, identity, tool, None, None)
        token = CURRENT.set(entry)  # the engine's firings are noted in it, as in the gateway
        try:
            await self._judge(identity, tool, run, stage, outcome, r)
        finally:
            CURRENT.reset(token)
        call.fired = [firing(t) for t in entry.fired]
        return call

    async def _judge(
        self, identity: Identity, tool: str, run: str | None, stage: str, outcome: str, r: dict[str, Any]
    ) -> None:
        engine = self.engine
        if stage == "gate" or engine.latched(identity, tool, run) is not None:
            return
        if stage == "latch" and outcome == "tripwire_tripped":
            return  # latched live, not here: how far it would have gone is not known
        wire = {"isError": outcome == "error", "content": [{"type": "text", "text": r.get("result_sha256", "")}]}
        result: dict[str, Any] | Refusal | None = wire if "result_sha256" in r else None
        if outcome not in ("ok", "error", "cancelled") and result is None:
            result = Refusal(outcome, "(replayed)", False)
        if stage == "latch":
            result = wire  # an unknown tool: an error
        else:
            arguments: dict[str, Any] = {"args_sha256": r.get("args_sha256")}
            for path, value in (r.get("amounts") or {}).items():
                _nested(path, value, arguments)
            plan = engine.plan(identity, tool, run, arguments)
            if isinstance(plan, Refusal):
                result = plan
            elif stage == "routed" and outcome != "tripwire_tripped":
                pass  # a ceiling refused it: nothing counted
            else:
                refused = None
                if plan is not None:
                    refused = engine.judge(plan, await self.store.tally(plan.ops, plan.now))
                if refused is not None:
                    result = refused
                elif outcome == "tripwire_tripped":
                    result = {"isError": False, "content": []}  # refused live, admitted here
        if result is None:
            return
        self._fallback = float(r.get("ended") or r["ts"])
        await engine.settle(identity, tool, run, result)


async def replay(rules: Sequence[TripwireRule], paths: Sequence[str], progress: bool = False) -> list[Call]:
    """Every call of the logs, with what fired on it in the replay and in the live run."""
    rp = Replay(rules)
    calls: list[Call] = []
    for index, (where, record) in enumerate(records(paths)):
        try:
            calls.append(await rp.call(index, where, record))
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedLog(f"{where}: not a call record ({type(exc).__name__}: {exc})") from None
        if progress and index and index % PROGRESS_EVERY == 0:
            print(f"{index} calls replayed", file=sys.stderr)
    return calls


def report(calls: list[Call]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for c in calls:
        if not c.fired and not c.recorded:
            continue
        base = {"index": c.index, "line": c.where, "ts": c.at, "tool": c.record["tool"], "run": c.record.get("run")}
        rows.extend({**base, **f, "in_log": any(g["rule"] == f["rule"] for g in c.recorded)} for f in c.fired)
        rows.extend({**base, **g, "replayed": False} for g in c.recorded if all(f["rule"] != g["rule"] for f in c.fired))
    differs = [c.index for c in calls if not c.same]
    return {"calls": len(calls), "firings": rows, "same": not differs, "differs_at": differs}


def main(args: argparse.Namespace, rules: Sequence[TripwireRule]) -> int:
    """The command, with the rules of ``args.config`` (the CLI reads the gateway's config)."""
    if not getattr(args, "verbose", False):  # the table says what fired; not a warning per firing
        logging.getLogger("haltwire.tripwires").setLevel(logging.ERROR)
    try:
        calls = anyio.run(replay, rules, args.log, True)
    except (MalformedLog, OSError) as exc:
        print(f"haltwire tripwires test: {exc}", file=sys.stderr)
        return 2
    out = report(calls)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{out['calls']} calls replayed through {len(rules)} rules")
        print(f"{'rule':<20} {'mode':<8} {'scope':<24} {'when':<25} {'call':>6} {'tool':<16} {'run':<16} log")
        for f in out["firings"]:
            seen = "not replayed" if f.get("replayed") is False else ("match" if f["in_log"] else "differs")
            print(
                f"{f['rule']:<20} {f['mode']:<8} {f['scope']:<24} {iso_utc(f['ts']):<25} "
                f"{f['index']:>6} {f['tool']:<16} {f['run']!s:<16} {seen}"
            )
        differs = out["differs_at"]
        more = f" and {len(differs) - 20} more" if len(differs) > 20 else ""
        print("same firings as recorded" if not differs else f"firings differ at calls {differs[:20]}{more}")
    return 1 if args.expect_same and not out["same"] else 0

