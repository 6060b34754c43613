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
unknown result. A model call's usage (``usage`` in its record) is added to the usage rules at its
end, before its outcome's judgement, as the gateway does. Replaying a log with the config that
wrote it gives the firings it recorded.
"""

from __future__ import annotations

import argparse
import heapq
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
from haltwire.tripwires.usage import Spent

#: A call's events wait this long (past a later call's end) for calls that started before them.
LAG_S = 300.0
#: Progress on stderr every so many calls.
PROGRESS_EVERY = 100_000


class MalformedLog(ValueError):
    """A line of a call log that is not a record (its file and line in the message)."""


@dataclass
class Call:
    """One call of the log: where it is, what the log says fired on it, what fired in the replay."""

    index: int
    where: str
    at: float
    tool: str
    run: str | None
    recorded: list[dict[str, Any]]
    fired: list[dict[str, Any]] = field(default_factory=list)

    @property
    def same(self) -> bool:
        def key(f: dict[str, Any]) -> tuple[str, str]:
            return f["rule"], f.get("scope", "")

        return sorted(map(key, self.fired)) == sorted(map(key, self.recorded))


@dataclass
class _Pending:
    """A call between its two moments in the replay: its admission, then its outcome's judgement."""

    call: Call
    record: dict[str, Any]
    identity: Identity
    entry: Entry
    reads: list[float]
    result: dict[str, Any] | Refusal | None = None


@dataclass
class Replayed:
    calls: int = 0
    #: The calls on which something fired, live or in the replay, in log order.
    fired: list[Call] = field(default_factory=list)


def _lines(path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise MalformedLog(f"{where}: not JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise MalformedLog(f"{where}: not a call record (not an object)")
            missing = [k for k in ("ts", "identity", "tool", "stage", "outcome") if k not in record]
            if missing:
                raise MalformedLog(f"{where}: not a call record (missing {', '.join(missing)})")
            if not all(isinstance(record.get(k, 0), int | float) for k in ("ts", "ended")):
                raise MalformedLog(f"{where}: not a call record (ts and ended are times)")
            yield where, record


def records(paths: Sequence[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The records of the logs, with their ``file:line``, merged in the order their calls ended:
    a gateway's rotated files, or the logs of several gateways on the same counters."""
    return heapq.merge(*map(_lines, paths), key=lambda wr: float(wr[1].get("ended") or wr[1]["ts"]))


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
    """The engine, and what it reads of the call it is at (its label, clock and signal kinds)."""

    def __init__(self, rules: Sequence[TripwireRule]) -> None:
        self._detectors = {r.name: _Recorded(r.name) for r in rules if r.kind == "content"}
        self.store = MemoryCounters()
        self._at: _Pending | None = None
        self._fallback = 0.0
        self.engine = Tripwires(rules, self.store, clock=self._clock, labels=self._label, detectors=self._detectors)

    def _clock(self) -> float:
        at = self._at
        return at.reads.pop(0) if at is not None and at.reads else self._fallback

    def _label(self, tool: str) -> Any:
        return self._at.record.get("label") if self._at is not None else None

    def pending(self, index: int, where: str, r: dict[str, Any]) -> _Pending:
        i = r["identity"]
        identity = Identity(str(i["agent"]), str(i.get("tenant", "default")), str(i.get("version", "0")))
        call = Call(index, where, float(r["ts"]), str(r["tool"]), r.get("run"), list(r.get("tripwires") or []))
        entry = Entry(call.at, identity, call.tool, None, None)
        return _Pending(call, r, identity, entry, [float(t) for t in r.get("reads") or []])

    async def step(self, p: _Pending, admit: bool) -> None:
        """The call's admission (at its start), or the judgement of its outcome (at its end)."""
        self._at, self._fallback = p, float(p.record["ts"] if admit else p.record.get("ended") or p.record["ts"])
        kinds = {f["rule"]: list(f.get("kinds") or []) for f in p.call.recorded if "kinds" in f}
        for d in self._detectors.values():
            d.kinds = kinds
        token = CURRENT.set(p.entry)  # the engine's firings are noted in it, as in the gateway
        try:
            if admit:
                await self._admit(p)
            else:
                if (used := p.record.get("usage")) is not None:  # a model call's, counted as it ended
                    spent = Spent(int(used["input"]), int(used["output"]), int(used.get("money_micros", 0)))
                    await self.engine.spent(p.identity, p.call.tool, p.call.run, spent)
                if p.result is not None:
                    await self.engine.settle(p.identity, p.call.tool, p.call.run, p.result)
        finally:
            CURRENT.reset(token)
            self._at = None

    async def _admit(self, p: _Pending) -> None:
        """As far as the live call went (``p.result``: the outcome to judge, None: none)."""
        engine, r, identity, tool, run = self.engine, p.record, p.identity, p.call.tool, p.call.run
        stage, outcome = str(r["stage"]), str(r["outcome"])
        if stage == "gate" or engine.latched(identity, tool, run) is not None:
            return
        if stage == "latch" and outcome == "tripwire_tripped":
            return  # latched live, not here: how far it would have gone is not known
        wire = {"isError": outcome == "error", "content": [{"type": "text", "text": r.get("result_sha256", "")}]}
        result: dict[str, Any] | Refusal | None = wire if "result_sha256" in r else None
        if outcome not in ("ok", "error", "cancelled") and result is None:
            # The log keeps a refusal's code, not its words: replayed as a recorded refusal.
            result = Refusal.from_error({"code": outcome, "message": "(replayed)", "retryable": False})
        if stage == "latch":
            # An unknown tool: an error; an unknown model: its refusal.
            p.result = result if isinstance(result, Refusal) else wire
            return
        arguments: dict[str, Any] = {"args_sha256": r.get("args_sha256")}
        for path, value in (r.get("amounts") or {}).items():
            _nested(path, value, arguments)
        plan = engine.plan(identity, tool, run, arguments)
        if isinstance(plan, Refusal):
            result = plan
        elif stage == "admitted" or outcome == "tripwire_tripped":  # else a ceiling refused it
            refused = None
            if plan is not None:
                refused = engine.judge(plan, await self.store.tally(plan.ops, plan.now))
            if refused is not None:
                result = refused
            elif outcome == "tripwire_tripped":
                result = {"isError": False, "content": []}  # refused live, admitted here
        p.result = result


async def replay(rules: Sequence[TripwireRule], paths: Sequence[str], progress: bool = False) -> Replayed:
    """Every call of the logs through the rules. Each call is admitted at its start and judged at
    its end, in the order of those times across calls (a log is written in the order calls end;
    calls still open ``LAG_S`` before a call's end are taken in that order)."""
    rp = Replay(rules)
    out = Replayed()
    events: list[tuple[float, int, bool, _Pending]] = []  # (when, order, admission, call)
    seq = 0

    async def until(t: float) -> None:
        while events and events[0][0] <= t:
            _, _, admit, p = heapq.heappop(events)
            try:
                await rp.step(p, admit)
            except (KeyError, TypeError, ValueError) as exc:
                raise MalformedLog(f"{p.call.where}: not a call record ({type(exc).__name__}: {exc})") from None
            if not admit:
                p.call.fired = [firing(t) for t in p.entry.fired]
                if p.call.fired or p.call.recorded:
                    out.fired.append(p.call)

    for index, (where, record) in enumerate(records(paths)):
        try:
            p = rp.pending(index, where, record)
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedLog(f"{where}: not a call record ({type(exc).__name__}: {exc})") from None
        heapq.heappush(events, (p.call.at, seq, True, p))
        heapq.heappush(events, (float(record.get("ended") or p.call.at), seq + 1, False, p))
        seq += 2
        await until(float(record.get("ended") or p.call.at) - LAG_S)
        out.calls += 1
        if progress and index and index % PROGRESS_EVERY == 0:
            print(f"{index} calls replayed", file=sys.stderr)
    await until(float("inf"))
    out.fired.sort(key=lambda c: c.index)
    return out


def report(replayed: Replayed) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    calls = replayed.fired
    for c in calls:
        base = {"index": c.index, "line": c.where, "ts": c.at, "tool": c.tool, "run": c.run}
        rows.extend({**base, **f, "in_log": any(g["rule"] == f["rule"] for g in c.recorded)} for f in c.fired)
        rows.extend({**base, **g, "replayed": False} for g in c.recorded if all(f["rule"] != g["rule"] for f in c.fired))
    differs = [c.index for c in calls if not c.same]
    return {"calls": replayed.calls, "firings": rows, "same": not differs, "differs_at": differs}


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

