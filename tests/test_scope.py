"""Scopes: parsing, the scopes a call belongs to, and which stop matches it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from haltwire.identity import Identity
from haltwire.scope import GLOBAL, Scope, ScopeError, ScopeIndex, call_scopes

OPS = Identity("ops-bot", tenant="acme", version="1.4")
BILLING = Identity("billing-bot", tenant="globex", version="2.0")


@pytest.mark.parametrize(
    "text", ["run:r-1", "tenant:acme", "tool:refund", "agent:ops-bot", "version:ops-bot@1.4", "global"]
)
def test_every_kind_round_trips(text: str) -> None:
    assert str(Scope.parse(text)) == text


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "not a scope"),
        ("refund", "not a scope"),
        ("team:x", "not a scope"),
        ("global:x", "not a scope"),
        ("run:", "empty"),
        ("tool: refund", "padded"),
        ("version:ops-bot", "AGENT@VERSION"),
        ("version:@1.4", "AGENT@VERSION"),
        ("version:ops-bot@", "AGENT@VERSION"),
    ],
)
def test_bad_scopes_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ScopeError, match=says):
        Scope.parse(text)


def test_a_call_belongs_to_one_scope_of_each_kind() -> None:
    assert {str(s) for s in call_scopes(OPS, "refund", "r-1")} == {
        "global",
        "agent:ops-bot",
        "tenant:acme",
        "version:ops-bot@1.4",
        "tool:refund",
        "run:r-1",
    }
    assert Scope("run", "r-1") not in call_scopes(OPS, "refund")


@pytest.mark.parametrize(
    ("stop", "stopped"),
    [
        ("tool:refund", {("ops-bot", "refund"), ("billing-bot", "refund")}),
        ("agent:ops-bot", {("ops-bot", "refund"), ("ops-bot", "lookup")}),
        ("tenant:globex", {("billing-bot", "refund"), ("billing-bot", "lookup")}),
        ("version:ops-bot@1.4", {("ops-bot", "refund"), ("ops-bot", "lookup")}),
        ("version:ops-bot@1.5", set()),
        (
            "global",
            {
                ("ops-bot", "refund"),
                ("ops-bot", "lookup"),
                ("billing-bot", "refund"),
                ("billing-bot", "lookup"),
            },
        ),
    ],
)
def test_a_stop_matches_exactly_the_calls_in_its_scope(stop: str, stopped: set[tuple[str, str]]) -> None:
    index: ScopeIndex[str] = ScopeIndex([(Scope.parse(stop), "stp_1")])
    seen = set()
    for who in (OPS, BILLING):
        for tool in ("refund", "lookup"):
            if index.match(call_scopes(who, tool)) is not None:
                seen.add((who.agent, tool))
    assert seen == stopped


def test_the_broadest_stop_is_named_and_removing_one_leaves_the_others() -> None:
    index: ScopeIndex[str] = ScopeIndex()
    index.add(Scope.parse("tool:refund"), "stp_tool")
    index.add(Scope.parse("tenant:acme"), "stp_tenant")
    assert index.match(call_scopes(OPS, "refund")) == (Scope("tenant", "acme"), "stp_tenant")
    index.remove(Scope.parse("tenant:acme"))
    assert index.match(call_scopes(OPS, "refund")) == (Scope("tool", "refund"), "stp_tool")
    assert index.match(call_scopes(OPS, "lookup")) is None
    index.add(GLOBAL, "stp_all")
    assert index.match(call_scopes(BILLING, "lookup")) == (GLOBAL, "stp_all")
    assert len(index) == 2


#: Any text a scope's value may be: printable (no control characters), bounded, not padded.
VALUES = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=200).filter(
    lambda v: v == v.strip()
)


@given(st.sampled_from(["run", "tenant", "tool", "agent"]), VALUES)
def test_parse_inverts_str_for_any_value(kind: str, value: str) -> None:
    scope = Scope(kind, value)  # type: ignore[arg-type]
    assert Scope.parse(str(scope)) == scope


CONTROLS = st.sampled_from([chr(c) for c in (*range(32), *range(127, 160))])


@given(st.sampled_from(["run", "tenant", "tool", "agent"]), VALUES, CONTROLS)
def test_a_value_with_a_control_character_is_no_scope(kind: str, value: str, control: str) -> None:
    with pytest.raises(ScopeError, match="control characters"):
        Scope.parse(f"{kind}:{value[:1]}{control}{value}")
