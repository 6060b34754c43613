"""Per-call tripwire rules (``[[tripwires]]`` in the gateway's config): what each kind measures,
and when it trips. Policy only: counting is a ``CounterStore``'s ``tally`` (``haltwire.store.counters``).

Every kind is measured outside the model, from what the gateway sees of a call:

- ``steps``: tool calls of a run (of the rule's tools, else of every tool), at most ``limit``;
- ``money``: the sum of an amount read from the calls' arguments at ``amount`` (a dotted path,
  e.g. ``amount_cents``), at most ``limit``;
- ``rate``: calls per fixed window of ``window_s``, per run, tenant or agent (``per``), at most ``limit``;
- ``policy_hits``: ``in_a_row`` refusals or errors in a row of a run;
- ``repeated_calls``: the same tool with the same arguments (normalised: key order and
  whitespace do not matter) ``in_a_row`` times in a row in a run;
- ``repeated_results``: the same result ``in_a_row`` times in a row in a run (no progress);
- ``content``: a ``Detector`` (``haltwire.tripwires.content``) finds a signal in a tool result;
- ``tokens``: the tokens of a run's model calls (``count``: input, output or total), at most ``limit``;
- ``model_cost``: what a run's model calls cost by ``[[models]] prices``, in millionths of the
  price's unit, at most ``limit``.

The first three are budgets, judged at admission: the call that would go past ``limit`` is
refused and trips the rule, so none is ever served past it. ``repeated_calls`` is judged at
admission too (the ``in_a_row``-th identical call is not made). The last three are judged once
the call's result (or refusal) is known; a ``content`` signal in enforce mode replaces the
result, so the model never reads the text that tripped it.

The usage kinds (``tokens``, ``model_cost``; ``haltwire.tripwires.usage``) measure model calls
only, whose usage is known only once they end: judged at admission (a run whose count has reached
``limit`` is refused), counted at the end of each call, and the call whose usage brings the count
to ``limit`` or past it trips the rule. So a run can end past its limit by what that call, and
the calls already in flight with it, used: never by a call admitted after.

Model calls are named ``model:NAME`` (as in ``[limits.tools]``: ``NAME`` is the model, or
``PREFIX*`` for one routed by a prefix). A rule without ``tools`` counts tool calls only (the
usage kinds: every model call); one whose ``tools`` name model calls (``model:*``: every one)
counts them too. ``steps``, ``rate`` and ``policy_hits`` take model calls; the other kinds read
a tool's arguments or result, and refuse a ``model:`` entry.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any, ClassVar, Final, Literal
from urllib.parse import quote

from pydantic import Field, model_validator

from haltwire import jsonwire
from haltwire.config import BearerToken, ConfigModel, ControlLink, Label
from haltwire.identity import Identity, agent_counted_as, tenant_counted_as
from haltwire.refusal import iso_utc

Mode = Literal["off", "shadow", "enforce"]
Kind = Literal[
    "steps", "money", "rate", "policy_hits", "repeated_calls", "repeated_results", "content", "tokens", "model_cost"
]
#: What a tripped rule stops.
StopScope = Literal["run", "tenant", "agent", "version"]
Per = Literal["run", "tenant", "agent"]

#: Judged at admission (a store's ``tally`` before the upstream), and after the result.
ADMISSION_KINDS = frozenset({"steps", "money", "rate", "repeated_calls"})
RESULT_KINDS = frozenset({"policy_hits", "repeated_results", "content"})
#: Judged at admission on the count so far, counted once a model call has ended (its usage).
USAGE_KINDS = frozenset({"tokens", "model_cost"})
#: The kinds that take model calls (``model:NAME`` in ``tools``).
MODEL_KINDS = frozenset({"steps", "rate", "policy_hits"}) | USAGE_KINDS
#: How a call to a model is named, in rules as in ``[limits.tools]``; ``model:*``: any model.
MODEL_PREFIX: Final = "model:"
ANY_MODEL: Final = "model:*"
#: Refusal codes that are not a policy hit: the run is already stopped, or the refusal clears by
#: itself (the gateway's own transient trouble is not the agent's doing).
NOT_HITS = frozenset(
    {
        "stopped",
        "tripwire_tripped",
        "lease_invalid",
        "lease_expired",
        "too_many_in_flight",
        "counters_unavailable",
        "upstream_unavailable",
        "registry_unreachable",
    }
)


class TripwireRule(ConfigModel):
    """One ``[[tripwires]]`` entry."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    kind: Kind
    mode: Mode = "enforce"
    #: What a trip stops; unset: the run, or for a ``rate`` what it counts per.
    scope: StopScope | None = None
    #: Which calls count: these tools (empty: every tool), and only tools with this label.
    tools: list[str] = Field(default_factory=list)
    label: Label | None = None
    #: ``steps``, ``money``, ``rate``: at most this many calls (this amount) pass.
    limit: int | None = Field(default=None, ge=0)
    #: ``policy_hits``, ``repeated_calls``, ``repeated_results``: this many in a row trip it.
    in_a_row: int | None = Field(default=None, ge=2)
    #: ``money``: where the amount is in the call's arguments (``a.b`` for nested objects).
    amount: str | None = Field(default=None, min_length=1)
    #: ``rate``: what is counted apart, and the window.
    per: Per = "run"
    window_s: float | None = Field(default=None, gt=0)
    #: ``content``: the detector's name (``haltwire.tripwires.content.detector``).
    detector: str = "builtin"
    #: ``tokens``: which tokens count (``total``: input and output).
    count: Literal["input", "output", "total"] | None = None

    @model_validator(mode="after")
    def _fields_of_its_kind(self) -> TripwireRule:
        k = self.kind
        budget = k in ("steps", "money", "rate", "tokens", "model_cost")
        if budget and self.limit is None:
            raise ValueError(f"{self.name}: a {k} rule needs limit")
        if not budget and self.limit is not None:
            raise ValueError(f"{self.name}: limit is for steps, money, rate, tokens and model_cost rules")
        streak = k in ("policy_hits", "repeated_calls", "repeated_results")
        if streak and self.in_a_row is None:
            raise ValueError(f"{self.name}: a {k} rule needs in_a_row")
        if not streak and self.in_a_row is not None:
            raise ValueError(f"{self.name}: in_a_row is for policy_hits and repeated_* rules")
        if (k == "money") != (self.amount is not None):
            raise ValueError(
                f"{self.name}: amount (the argument's path) is for money rules, and they need it"
            )
        if (k == "rate") != (self.window_s is not None):
            raise ValueError(f"{self.name}: window_s is for rate rules, and they need it")
        if k != "rate" and self.per != "run":
            raise ValueError(f"{self.name}: per is for rate rules")
        if self.count is not None and k != "tokens":
            raise ValueError(f"{self.name}: count (input, output or total) is for tokens rules")
        self._model_calls()
        return self

    def _model_calls(self) -> None:
        k, models = self.kind, [t for t in self.tools if t.startswith(MODEL_PREFIX)]
        if k in USAGE_KINDS:
            others = [t for t in self.tools if not t.startswith(MODEL_PREFIX)]
            if others:
                raise ValueError(
                    f"{self.name}: a {k} rule counts model calls: tools names them as model:NAME "
                    f"(or model:*), not {others[0]!r}"
                )
            if self.limit == 0:
                raise ValueError(f"{self.name}: a {k} rule needs limit >= 1 (to refuse every model call, stop it)")
        if k in USAGE_KINDS or models:
            if k not in MODEL_KINDS:
                raise ValueError(
                    f"{self.name}: a {k} rule reads tool calls only; model calls ({models[0]}) take steps, "
                    "rate, policy_hits, tokens and model_cost rules"
                )
            if self.label is not None:
                raise ValueError(f"{self.name}: model calls have no label; a rule on them takes none")

    @property
    def stops(self) -> StopScope:
        """The scope a trip stops."""
        if self.scope is not None:
            return self.scope
        return self.per if self.kind == "rate" else "run"

    @property
    def per_run(self) -> bool:
        """Whether it counts within a run (so calls without a run do not count)."""
        return self.kind != "content" and self.per == "run"

    def counts(self, tool: str, label: Label | None) -> bool:
        """Whether a call to ``tool`` (with ``label``; ``model:NAME``: a model call) counts."""
        if self.tools:
            if tool not in self.tools and not (ANY_MODEL in self.tools and tool.startswith(MODEL_PREFIX)):
                return False
        elif tool.startswith(MODEL_PREFIX) != (self.kind in USAGE_KINDS):
            return False  # no tools: every tool call, or (the usage kinds) every model call
        return self.label is None or label == self.label

    def threshold(self) -> int:
        value = self.limit if self.limit is not None else self.in_a_row
        assert value is not None
        return value


class TripwireStops(BearerToken):
    """``[tripwire_stops]``: how a tripped rule's stop is written: with this ``tripwire``-role
    token, to the control plane at ``url``. Stops are issued on the control plane's admin
    listener (or its main port), not on the enforcement listener the gateway's ``[control] url``
    usually names, which refuses the ``tripwire`` role."""

    _section: ClassVar[str] = "tripwire_stops"
    #: The control plane (one URL or its replicas'); unset: ``[control] url``.
    url: str | list[str] | None = None

    def urls(self, control: ControlLink | None) -> tuple[str, ...]:
        if self.url is not None:
            return (self.url,) if isinstance(self.url, str) else tuple(self.url)
        assert control is not None
        return control.urls


def check_tripwires(
    rules: list[TripwireRule], stops: TripwireStops | None, control: ControlLink | None, development: bool
) -> None:
    """The gateway config's checks of ``[[tripwires]]`` and ``[tripwire_stops]`` (``ValueError``)."""
    names = [r.name for r in rules]
    if len(set(names)) != len(names):
        raise ValueError("tripwires: names must be unique")
    if stops is not None:
        if stops.url is None and control is None:
            raise ValueError("tripwire_stops: give url, or a [control] section whose url it takes")
        if stops.token is not None and not development:
            raise ValueError(
                "tripwire_stops: plain 'token' is accepted only with gateway.development = true; use token_env"
            )
    enforced = [r.name for r in rules if r.mode == "enforce"]
    if enforced and control is not None and stops is None:
        raise ValueError(
            f"tripwires: {', '.join(enforced)} stop work through the control plane with a "
            "tripwire-role token; add [tripwire_stops]"
        )


class UnreadableAmount(ValueError):
    """A money rule's tool was called without a non-negative number at the rule's path."""


def read_amount(arguments: dict[str, Any] | None, path: str) -> int:
    """The amount at ``path`` in ``arguments``, as an integer (``UnreadableAmount`` if absent or
    not a non-negative number: a tripwire that cannot measure a call fails closed)."""
    value: Any = arguments or {}
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise UnreadableAmount(f"the call has no {path}")
        value = value[part]
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or value != value:
        raise UnreadableAmount(f"{path} is {value!r}, not a non-negative number")
    return round(value)


def digest(value: Any) -> str:
    """A short digest of a JSON value, the same for the same data: keys sorted, no whitespace
    (so key order and the spacing of the request do not make two calls differ)."""
    return hashlib.sha256(jsonwire.sorted_dumps(value)).hexdigest()[:32]


def normalized_text(value: str) -> str:
    """A text with its runs of whitespace as single spaces, for comparing results."""
    return " ".join(value.split())


def is_hit(result: dict[str, Any] | None, code: str | None) -> bool:
    """Whether a call's outcome is a policy hit: a refusal (``code``) other than ``NOT_HITS``, or an
    upstream's error result."""
    if code is not None:
        return code not in NOT_HITS
    return bool(result is not None and result.get("isError"))


# -- what a rule counts under, what it stops, and what its trip says -------------------------


def latch_scopes(identity: Identity, run: str | None) -> list[str]:
    """The scopes a trip can have stopped that a call belongs to (tools are never stopped by one)."""
    out = [
        f"tenant:{identity.tenant}",
        f"agent:{identity.agent}",
        f"version:{identity.agent}@{identity.version}",
    ]
    return [f"run:{run}", *out] if run is not None else out


def stop_scope(rule: TripwireRule, identity: Identity, run: str | None) -> str | None:
    """The scope a trip of ``rule`` by this call stops (None: a run rule, and the call has no run)."""
    stops = rule.stops
    if stops == "run":
        return None if run is None else f"run:{run}"
    if stops == "tenant":
        return f"tenant:{identity.tenant}"
    if stops == "agent":
        return f"agent:{identity.agent}"
    return f"version:{identity.agent}@{identity.version}"


def count_key(rule: TripwireRule, identity: Identity, run: str | None, window: int | None = None) -> str:
    """The count's name: first who it counts (a tenant, an agent, or for a run its identity: a
    lease binds a run to one), then the rule's name, its run and the window of a rate."""
    if rule.per == "tenant":
        base = f"{tenant_counted_as(identity.tenant)}:{rule.name}"
    elif rule.per == "agent":
        base = f"{agent_counted_as(identity.agent)}:{rule.name}"
    else:
        base = f"{identity.counted_as}:{rule.name}:run:{quoted(run or '')}"
    return base if window is None else f"{base}:{window}"


#: The tag of a plan's op that checks a held trip (``Tripwires._hold``).
HELD: Final = "held"


def hold_key(rule: TripwireRule | str, scope: str, identity: Identity) -> str:
    """The name a trip is held under in shared counters (``engine.Tripwires._hold``): first who
    the scope covers (a run's identity, a tenant, or an agent for its agent and version scopes)."""
    name = rule if isinstance(rule, str) else rule.name
    kind, _, what = scope.partition(":")
    if kind == "tenant":
        who = tenant_counted_as(what)
    elif kind in ("agent", "version"):
        who = agent_counted_as(identity.agent)
    else:
        who = identity.counted_as
    return f"{who}:{name}:held:{quoted(scope)}"


def over_limit(
    rule: TripwireRule, was: int, amount: int, tool: str, run: str | None
) -> tuple[str, dict[str, Any]]:
    """What a budget's trip says: where it was, what the call added, its limit."""
    limit = rule.limit
    if rule.kind in USAGE_KINDS:
        what = "cost" if rule.kind == "model_cost" else f"{rule.count or 'total'} tokens"
        detail = f"run {run} has used {was} in {what} of model calls, its limit is {limit}"
        if amount:
            detail = f"{tool} brought the {what} of run {run}'s model calls to {was + amount}, its limit is {limit}"
    elif rule.kind == "steps":
        detail = f"call {was + amount} of run {run} would pass its limit of {limit} tool calls"
    elif rule.kind == "money":
        detail = f"{was} spent through tools in run {run}, plus {amount} by {tool}, would pass its limit of {limit}"
    else:
        per = f"run {run}" if rule.per == "run" else f"this {rule.per}"
        detail = f"call {was + amount} of {per} within {rule.window_s:g} s would pass its limit of {limit}"
    return detail, {"counted": was, "this_call": amount, "limit": limit, "tool": tool}


#: One call as evidence: when, the tool, its arguments' digest (never the arguments), and what
#: became of it; formatted (``shown_note``) only when a rule fires.
Note = tuple[float, str, str | None, str]


def shown_note(note: Note) -> str:
    at, tool, args, outcome = note
    return " ".join(p for p in (iso_utc(at), tool, args and f"arguments {args[:12]}", outcome) if p)


@functools.lru_cache(maxsize=4096)
def quoted(text: str) -> str:
    """A tenant, agent, run id or scope as part of a key (cached: the same few are read on every
    call of a run)."""
    return quote(text, safe="")
