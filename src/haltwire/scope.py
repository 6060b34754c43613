"""Scopes: what a stop covers, and the set of scopes one tool call belongs to.

A scope is written ``KIND:VALUE``: ``run:ID``, ``tenant:ID``, ``tool:NAME``, ``model:NAME``,
``agent:ID``, ``version:AGENT@VERSION``, or plain ``global``. A call belongs to one scope of each kind
it has (its run only when the run is known), and a stop matches the call when the stop's
scope is in that set. Matching is a set lookup per call, however many stops are active.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Generic, Literal, TypeVar, get_args

from haltwire.identity import Identity
from haltwire.limits import MAX_SCOPE_CHARS, has_control_characters

ScopeKind = Literal["run", "tenant", "tool", "model", "agent", "version", "global"]
KINDS: Final[tuple[str, ...]] = get_args(ScopeKind)


class ScopeError(ValueError):
    """A scope string that does not parse; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class Scope:
    kind: ScopeKind
    value: str = ""

    @classmethod
    def parse(cls, text: str) -> Scope:
        if text == "global":
            return GLOBAL
        # Before anything echoes it: a refusal must not carry a megabyte of someone's input.
        if len(text) > MAX_SCOPE_CHARS:
            raise ScopeError(f"a scope is at most {MAX_SCOPE_CHARS} characters, not {len(text)}")
        if has_control_characters(text):
            raise ScopeError("a scope may not hold control characters")
        kind, sep, value = text.partition(":")
        if not sep or kind not in KINDS or kind == "global":
            raise ScopeError(
                f"{text!r} is not a scope: use run:ID, tenant:ID, tool:NAME, model:NAME, agent:ID, "
                "version:AGENT@VERSION or global"
            )
        if not value.strip() or value != value.strip():
            raise ScopeError(f"{text!r} has an empty or padded value")
        if kind == "version":
            agent, at, version = value.partition("@")
            if not at or not agent or not version:
                raise ScopeError(f"{text!r}: a version scope is version:AGENT@VERSION")
        return cls(kind, value)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return "global" if self.kind == "global" else f"{self.kind}:{self.value}"


GLOBAL: Final = Scope("global")


def call_scopes(
    identity: Identity, tool: str | None, run: str | None = None, model: str | None = None
) -> frozenset[Scope]:
    """Every scope a call by ``identity`` to ``tool`` (in ``run``, when known) belongs to.

    A model call through the gateway calls no tool (``tool`` None: no ``tool:`` stop reaches
    it) but ``model``, the model it asks for (``model:NAME``)."""
    scopes = {
        GLOBAL,
        Scope("agent", identity.agent),
        Scope("tenant", identity.tenant),
        Scope("version", f"{identity.agent}@{identity.version}"),
    }
    if tool is not None:
        scopes.add(Scope("tool", tool))
    if model is not None:
        scopes.add(Scope("model", model))
    if run is not None:
        scopes.add(Scope("run", run))
    return frozenset(scopes)


def run_scopes(run: str, agent: str, tenant: str, version: str) -> frozenset[Scope]:
    """The scopes a stop must name to end a run (never tool or model scopes: such a stop
    refuses calls to the tool or model, it ends no run)."""
    return frozenset(
        {
            GLOBAL,
            Scope("run", run),
            Scope("agent", agent),
            Scope("tenant", tenant),
            Scope("version", f"{agent}@{version}"),
        }
    )


StopT = TypeVar("StopT")


class ScopeIndex(Generic[StopT]):
    """Active stops by scope. ``match`` answers the first stop covering a call's scopes.

    When several stops cover one call, the broadest wins (global, then tenant, version,
    agent, tool or model, run), so the refusal names the stop an operator is most likely to
    clear last.
    """

    _ORDER: Final = ("global", "tenant", "version", "agent", "tool", "model", "run")

    def __init__(self, stops: Mapping[Scope, StopT] | Iterable[tuple[Scope, StopT]] = ()) -> None:
        self._by_scope: dict[Scope, StopT] = dict(stops)

    def add(self, scope: Scope, stop: StopT) -> None:
        self._by_scope[scope] = stop

    def remove(self, scope: Scope) -> None:
        self._by_scope.pop(scope, None)

    def values(self) -> list[StopT]:
        return list(self._by_scope.values())

    def match(self, scopes: frozenset[Scope]) -> tuple[Scope, StopT] | None:
        if not self._by_scope:
            return None
        hits = [s for s in scopes if s in self._by_scope]
        if not hits:
            return None
        best = min(hits, key=lambda s: self._ORDER.index(s.kind))
        return best, self._by_scope[best]

    def __len__(self) -> int:
        return len(self._by_scope)
