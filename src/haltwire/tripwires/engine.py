"""The gateway's per-call tripwires: per call, which counts to touch, and what the counts mean.

Three points in the pipeline (``haltwire.gateway.proxy``):

1. ``latched``, right after the stop check: a scope this gateway has tripped is refused
   ``tripwire_tripped`` until the control plane's stop for it has arrived through the watch
   (from then on the stop itself refuses it, and an operator's clear restores it). Without
   ``[control]`` the latch holds for the life of the process.
2. ``plan`` and ``judge``, around the ceilings' admission: the admission kinds (steps, money,
   rate, repeated calls) are counts the ceilings take in the same atomic admission as their own
   (one round trip for every counter of the call); a rule in enforce mode refuses the call that
   would go past its limit, and nothing of that call is counted anywhere, in the ceilings either.
3. ``settle``, once the call's result or refusal is known: the result kinds (policy hits,
   repeated results, content) in one more ``tally`` (only when such rules exist). The call has
   been served: a trip here stops the scope's next calls; a content signal in enforce mode
   also replaces the result, so the model never reads the text that tripped it. With counters
   shared by several gateways (``hold_s``), such a trip is also held in the store, and every
   gateway's ``plan`` checks the holds in its admission: the scope is refused everywhere at once.
4. ``spent``, once a model call has ended: its tokens and cost in the usage rules' counts
   (``haltwire.tripwires.usage``; ``plan`` checks those counts at admission).

A trip in enforce mode latches its scope, queues its stop for ``StopWriter`` (as the
``tripwire`` identity, with the rule, its figures and the calls that counted), and logs. In
shadow mode nothing is refused: the would-be firing is logged, counted (``shadow_firings``), kept
with its time (``fired``) and recorded at the control plane by the writer (a ``stop.shadow`` audit
record, in the run report). Counter store down: ``admit`` fails closed
(``counters_unavailable``); ``settle`` logs and leaves the served result as it is.
No rule (or every rule off): the gateway builds no ``Tripwires`` and a call does no work here.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from haltwire import refusal
from haltwire.config import Label
from haltwire.identity import Identity
from haltwire.refusal import Refusal, iso_utc
from haltwire.store.counters import CounterStore, CountersUnavailable, Repeat, Streak, Tallies, Tally, TallyOp
from haltwire.tripwires.calllog import noted
from haltwire.tripwires.detectors import Detector, load_detector, result_text, scan
from haltwire.tripwires.plan import EVIDENCE_CALLS, EVIDENCE_KEYS, KEPT, MAX_LATCHED, RUN_TTL_S, Latch, Plan
from haltwire.tripwires.rules import (
    ADMISSION_KINDS,
    HELD,
    MODEL_PREFIX,
    RESULT_KINDS,
    USAGE_KINDS,
    Note,
    TripwireRule,
    UnreadableAmount,
    count_key,
    digest,
    hold_key,
    is_hit,
    latch_scopes,
    normalized_text,
    over_limit,
    read_amount,
    shown_note,
    stop_scope,
)
from haltwire.tripwires.usage import Spent, amount_of, check_limit, crossed
from haltwire.tripwires.writer import Landed, StopWriter, Trip

log = logging.getLogger("haltwire.tripwires")

#: The tag of a plan's op that checks a usage rule's count (``usage.check_limit``).
USAGE = "usage"

Clock = Callable[[], float]
LabelOf = Callable[[str], Label | None]


class Tripwires:
    def __init__(
        self,
        rules: Sequence[TripwireRule],
        store: CounterStore,
        *,
        writer: StopWriter | None = None,
        watch_revision: Callable[[], int] | None = None,
        clock: Clock = time.time,
        labels: LabelOf | None = None,
        hold_s: float | None = None,
        detectors: Mapping[str, Detector] | None = None,
    ) -> None:
        """``hold_s``: with counters shared by several gateways, how long a trip judged on an
        outcome is held in the store too, so that every gateway refuses the scope (the budget
        kinds need none: their counts refuse). None: this gateway's latch only. ``detectors``:
        the content rules' detectors by rule name (a backtest's recorded signals), else loaded."""
        active = [r for r in rules if r.mode != "off"]
        self._admission = [r for r in active if r.kind in ADMISSION_KINDS]
        self._results = [r for r in active if r.kind in RESULT_KINDS]
        #: Model calls' tokens and cost (``haltwire.tripwires.usage``), judged by ``plan`` and ``spent``.
        self._usage = [r for r in active if r.kind in USAGE_KINDS]
        self._hold_s = hold_s
        #: The outcome rules whose trips are held in the store (enforced, with shared counters).
        self._held = [r for r in self._results if r.mode == "enforce"] if hold_s is not None else []
        self._detectors = dict(detectors) if detectors is not None else {
            r.name: load_detector(r.detector) for r in active if r.kind == "content"
        }
        self._store = store
        self._writer = writer
        self._watch_revision = watch_revision
        self._clock = clock
        self._labels = labels
        self._latched: OrderedDict[str, Latch] = OrderedDict()
        self._evidence: OrderedDict[str, deque[Note]] = OrderedDict()
        #: Enforced trips and shadow firings, newest last.
        self.trips: deque[Trip] = deque(maxlen=KEPT)
        self.fired: deque[Trip] = deque(maxlen=KEPT)
        self.shadow_firings = 0
        if writer is not None:
            writer.on_landed = self._landed

    @property
    def rules(self) -> list[TripwireRule]:
        return self._admission + self._results + self._usage

    def counts_usage(self, tool: str) -> bool:
        """Whether a usage rule counts this model call's usage (``spent``)."""
        return any(r.counts(tool, None) for r in self._usage)

    # 1. the latch

    def latched(self, identity: Identity, tool: str | None, run: str | None) -> Refusal | None:
        """The refusal of a call (``tool`` None: a model call) in a scope this gateway tripped, or None."""
        if not self._latched:
            return None
        for scope in latch_scopes(identity, run):
            latch = self._latched.get(scope)
            if latch is None:
                continue
            if self._released(latch):
                del self._latched[scope]
                continue
            return latch.trip.refusal(run)
        return None

    def _released(self, latch: Latch) -> bool:
        if latch.landed_at is None or self._watch_revision is None:
            return False
        return self._watch_revision() >= latch.landed_at

    def _landed(self, trip: Trip, landed: Landed) -> None:
        latch = self._latched.get(trip.scope)
        if latch is not None and latch.trip.key == trip.key:
            latch.landed_at = landed.revision

    # 2. admission

    async def admit(
        self, identity: Identity, tool: str, run: str | None, arguments: dict[str, Any] | None
    ) -> Refusal | None:
        """``plan``, the counts taken on their own (``CounterStore.tally``), then ``judge``. The
        gateway takes the plan's counts with its ceilings instead (one round trip)."""
        plan = self.plan(identity, tool, run, arguments)
        if plan is None or isinstance(plan, Refusal):
            return plan
        try:
            tallies = await self._store.tally(plan.ops, plan.now)
        except CountersUnavailable:
            return refusal.counters_unavailable()
        return self.judge(plan, tallies)

    def plan(
        self, identity: Identity, tool: str, run: str | None, arguments: dict[str, Any] | None
    ) -> Plan | Refusal | None:
        """The counts this call takes in the admission rules (None: none), or the refusal of a rule
        that trips without counting (a money rule's amount it cannot read)."""
        usage = self._usage if self._usage and tool.startswith(MODEL_PREFIX) else None
        if not self._admission and not self._held and usage is None:
            return None
        now = self._clock()
        label = self._labels(tool) if self._labels is not None else None
        plan = Plan(identity, tool, run, arguments, now)
        for r in self._held:  # whatever the tool: a held trip refuses the whole scope
            scope = stop_scope(r, identity, run)
            if scope is not None:
                plan.add(Tally(hold_key(r, scope, identity), 0, 0, 1.0), r, HELD, 0)
        for r in self._admission:
            if not r.counts(tool, label) or (r.per_run and run is None):
                continue
            limit = r.limit if r.mode == "enforce" else None
            if r.kind == "repeated_calls":
                plan.add(Repeat(count_key(r, identity, run), plan.args_digest, RUN_TTL_S), r, "", 0)
                continue
            amount = 1
            if r.kind == "money":
                assert r.amount is not None
                try:
                    amount = read_amount(arguments, r.amount)
                except UnreadableAmount as exc:
                    trip = self._fire(r, identity, run, now, str(exc), {"limit": r.limit}, [])  # nothing counted
                    if trip is not None:
                        return trip
                    continue
            if r.kind == "rate":
                assert r.window_s is not None
                window = int(now // r.window_s)
                ends = (window + 1) * r.window_s
                plan.add(
                    Tally(count_key(r, identity, run, window), amount, limit, ends - now + 60),
                    r,
                    str(window),
                    amount,
                )
            else:
                plan.add(Tally(count_key(r, identity, run), amount, limit, RUN_TTL_S), r, "", amount)
        for r in usage or ():  # a model call: refused once its run has spent a usage budget
            if r.mode == "enforce" and run is not None and r.counts(tool, None):
                plan.add(Tally(count_key(r, identity, run), 0, check_limit(r), RUN_TTL_S), r, USAGE, 0)
        return plan if plan.ops else None

    def judge(self, plan: Plan, tallies: Tallies | None) -> Refusal | None:
        """What the plan's counts mean: the refusal of a tripped enforce rule, or None. With
        ``tallies.refused``, a limit refused the call and nothing was counted."""
        if tallies is None:
            return None
        identity, tool, run, now = plan.identity, plan.tool, plan.run, plan.now
        note: Note = (now, tool, plan.args_digest, "")
        ops = plan.ops
        if tallies.refused is not None and plan.owners[tallies.refused][1] == HELD:
            r = plan.owners[tallies.refused][0]
            scope = stop_scope(r, identity, run)
            assert scope is not None
            detail = "tripped at another gateway, which writes its stop"
            if scope == f"run:{run}":
                return refusal.tripwire_tripped(r.name, scope[4:], detail=detail)
            return refusal.tripwire_tripped(r.name, run or "", scope=scope, detail=detail)
        if tallies.refused is not None:
            r, tag, amount = plan.owners[tallies.refused]
            was = tallies.values[tallies.refused]
            detail, over = over_limit(r, was, amount, tool, run)
            evidence = self._evidence_of(ops[tallies.refused].key, None)
            refused = self._fire(r, identity, run, now, detail, over, [*evidence, (now, tool, plan.args_digest, "refused")], tag)
            assert refused is not None  # only enforce rules have limits in the store
            return refused
        first: Refusal | None = None
        for op, (r, tag, amount), value in zip(ops, plan.owners, tallies.values, strict=True):
            if tag in (HELD, USAGE):
                continue  # a check only (a usage rule's calls are noted when they end)
            evidence = self._evidence_of(op.key, note)
            if r.kind == "repeated_calls":
                assert r.in_a_row is not None
                if value < r.in_a_row or (r.mode == "shadow" and value > r.in_a_row):
                    continue
                detail = f"{value} calls in a row of {tool} with the same arguments (trips at {r.in_a_row})"
                figures = {"in_a_row": value, "threshold": r.in_a_row, "tool": tool}
            else:
                assert r.limit is not None
                if r.mode != "shadow" or not value - amount <= r.limit < value:
                    continue  # enforce: under its limit (past it, the store refused); shadow: fired already
                detail, figures = over_limit(r, value - amount, amount, tool, run)
            fired = self._fire(r, identity, run, now, detail, figures, list(evidence), tag)
            first = first or fired
        return first

    # 3. the result

    async def settle(
        self, identity: Identity, tool: str, run: str | None, result: dict[str, Any] | Refusal
    ) -> dict[str, Any] | Refusal:
        """Count the call's outcome in the result rules; the result, or what replaces it."""
        if not self._results:
            return result
        code = result.code if isinstance(result, Refusal) else None
        if code == "tripwire_tripped":
            return result
        wire = result if isinstance(result, dict) else None
        now = self._clock()
        label = self._labels(tool) if self._labels is not None else None
        ops: list[TallyOp] = []
        owners: list[TripwireRule] = []
        replaced: Refusal | None = None
        tripped: list[TripwireRule] = []
        for r in self._results:
            if not r.counts(tool, label):
                continue
            if r.kind == "content":
                found = None if wire is None else scan(self._detectors[r.name], r.detector, tool, wire)
                if found is not None:
                    detail, figures, told = found
                    calls: list[Note] = [(now, tool, None, "")]
                    fired = self._fire(r, identity, run, now, detail, figures, calls, told=told)
                    replaced = replaced or fired
                continue
            if run is None:
                continue
            if r.kind == "policy_hits":
                ops.append(Streak(count_key(r, identity, run), is_hit(wire, code), RUN_TTL_S))
            elif wire is not None:  # repeated_results: a refusal is no result
                shown = normalized_text(result_text(wire))
                ops.append(
                    Repeat(
                        count_key(r, identity, run), digest([tool, bool(wire.get("isError")), shown]), RUN_TTL_S
                    )
                )
            else:
                continue
            owners.append(r)
        if ops:
            try:
                tallies = await self._store.tally(ops, now)
            except CountersUnavailable as exc:
                log.warning("tripwires could not count the outcome of %s in run %s (%s)", tool, run, exc)
                return replaced or result
            note: Note = (now, tool, None, f"refused {code}" if code else "")
            for op, r, value in zip(ops, owners, tallies.values, strict=True):
                evidence = self._evidence_of(op.key, note if value else None)
                assert r.in_a_row is not None
                if value < r.in_a_row or (r.mode == "shadow" and value > r.in_a_row):
                    if not value:
                        self._evidence.pop(op.key, None)
                    continue
                what = "refusals or errors" if r.kind == "policy_hits" else f"identical results of {tool}"
                detail = f"{value} {what} in a row in run {run} (trips at {r.in_a_row})"
                counted: dict[str, Any] = {"in_a_row": value, "threshold": r.in_a_row}
                if self._fire(r, identity, run, now, detail, counted, list(evidence)) is not None:
                    tripped.append(r)
        if replaced is not None:
            tripped.extend(r for r in self._results if r.kind == "content" and r.mode == "enforce")
        await self._hold(tripped, identity, run, now)
        return replaced or result

    async def spent(self, identity: Identity, tool: str, run: str | None, spent: Spent) -> None:
        """A model call has ended: add what it used to the usage rules' counts (one ``tally``);
        a count it brings to its limit trips its rule (the call was served: its scope's next
        calls are refused). A store that cannot count it is logged, as ``settle``'s."""
        if not self._usage or run is None:
            return
        ops: list[TallyOp] = []
        owners: list[tuple[TripwireRule, int]] = []
        for r in self._usage:
            if r.counts(tool, None) and (amount := amount_of(r, spent)) > 0:
                ops.append(Tally(count_key(r, identity, run), amount, None, RUN_TTL_S))
                owners.append((r, amount))
        if not ops:
            return
        now = self._clock()
        try:
            tallies = await self._store.tally(ops, now)
        except CountersUnavailable as exc:
            log.warning("tripwires could not count the usage of %s in run %s (%s)", tool, run, exc)
            return
        note: Note = (now, tool, None, f"{spent.input} tokens in, {spent.output} out, cost {spent.money_micros}")
        for op, (r, amount), value in zip(ops, owners, tallies.values, strict=True):
            evidence = self._evidence_of(op.key, note)
            if crossed(r, value, amount):
                detail, figures = over_limit(r, value - amount, amount, tool, run)
                self._fire(r, identity, run, now, detail, figures, list(evidence))

    async def _hold(self, tripped: list[TripwireRule], identity: Identity, run: str | None, now: float) -> None:
        """Hold the scopes of outcome trips in the shared store for ``hold_s`` (see ``__init__``)."""
        if self._hold_s is None or not tripped:
            return
        scopes = {(r.name, s) for r in tripped if r in self._held and (s := stop_scope(r, identity, run))}
        ops = [Tally(hold_key(name, scope, identity), 1, None, self._hold_s) for name, scope in sorted(scopes)]
        if not ops:
            return
        try:
            await self._store.tally(ops, now)
        except CountersUnavailable as exc:
            log.warning("could not hold a trip in the shared counters (%s): this gateway refuses it", exc)

    # trips

    def _fire(
        self,
        rule: TripwireRule,
        identity: Identity,
        run: str | None,
        now: float,
        detail: str,
        figures: dict[str, Any],
        evidence: Sequence[Note],
        window: str = "",
        told: str | None = None,
    ) -> Refusal | None:
        """Record a firing; in enforce mode latch its scope, queue its stop and return the refusal
        (which says ``told``, when given, instead of ``detail``: the model reads it)."""
        scope = stop_scope(rule, identity, run)
        # The same for every gateway that trips this rule for this scope, and this rate's window
        # (else this run: another run tripping it after a clear writes a stop of its own).
        which = window if rule.kind == "rate" else run
        name = hashlib.sha256(f"{rule.name}\n{scope or f'run:{run}'}\n{which}".encode()).hexdigest()[:40]
        trip = Trip(
            rule.name,
            rule.kind,
            rule.mode,
            scope or f"run:{run}",
            f"tripwire-{name}",
            detail,
            now,
            {**figures, "at": iso_utc(now)},
            tuple(shown_note(n) for n in list(evidence)[-EVIDENCE_CALLS:]),
            told,
        )
        noted(trip)  # in the call log's record of this call, if it is kept
        if rule.mode == "shadow":
            self.shadow_firings += 1
            self.fired.append(trip)
            log.warning("tripwire %s (shadow) would have stopped %s: %s", rule.name, trip.scope, detail)
            if self._writer is not None and scope is not None:
                self._writer.write(trip)  # recorded at the control plane, for the audit and the report
            return None
        self.trips.append(trip)
        if scope is None:  # a run rule's call without a run: refused, nothing to stop
            return trip.refusal(run)
        log.warning("tripwire %s stopped %s: %s", rule.name, scope, detail)
        latch = self._latched[scope] = Latch(trip)
        self._latched.move_to_end(scope)
        if self._writer is not None and (landed := self._writer.landed.get(trip.key)) is not None:
            # Tripped again after its stop was written (a count still past its limit once the stop
            # was cleared, say): the stop is not written twice, and the latch lasts as before.
            latch.landed_at = landed.revision
        while len(self._latched) > MAX_LATCHED:
            self._latched.popitem(last=False)
        if self._writer is not None:
            self._writer.write(trip)
        return trip.refusal(run)

    def _evidence_of(self, key: str, note: Note | None) -> deque[Note]:
        """The calls counted under ``key`` at this gateway, with ``note`` added when given."""
        kept = self._evidence.get(key)
        if kept is None:
            kept = self._evidence[key] = deque(maxlen=EVIDENCE_CALLS)
            while len(self._evidence) > EVIDENCE_KEYS:
                self._evidence.popitem(last=False)
        else:
            self._evidence.move_to_end(key)
        if note is not None:
            kept.append(note)
        return kept

