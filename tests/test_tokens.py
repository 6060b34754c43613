"""Lease tokens: signature, key ids and rotation, expiry by the verifier's clock, bad input."""

from __future__ import annotations

import base64
import json
from typing import Any, cast

import jwt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from haltwire.tokens import LeaseClaims, LeaseExpired, LeaseInvalid, LeaseKeys

K1, K2 = b"1" * 32, b"2" * 32
NOW = 1_800_000_000.0


def claims(**changes: object) -> LeaseClaims:
    fields: dict[str, object] = {
        "run": "run-1",
        "agent": "ops-bot",
        "tenant": "acme",
        "version": "1.0",
        "generation": 7,
        "issued_at": NOW,
        "expires_at": NOW + 15,
        **changes,
    }
    return LeaseClaims(**fields)  # type: ignore[arg-type]


def test_round_trip_and_expiry_by_the_verifiers_clock() -> None:
    keys = LeaseKeys({"k1": K1}, signing="k1")
    token = keys.sign(claims())
    assert keys.verify(token, now=NOW + 14.9) == claims()
    with pytest.raises(LeaseExpired):
        keys.verify(token, now=NOW + 15)  # no leeway: at exp it is out
    with pytest.raises(LeaseExpired):
        keys.verify(token, now=NOW + 3600)
    # A verifier whose clock is behind accepts it, one whose clock is ahead does not: the
    # token carries no clock of the runtime's that could stretch it.
    assert LeaseKeys({"k1": K1}).verify(token, now=NOW - 100).run == "run-1"


def test_rotation_keeps_old_tokens_valid_until_their_key_is_dropped() -> None:
    old = LeaseKeys({"k1": K1}, signing="k1").sign(claims())
    rotated = LeaseKeys({"k1": K1, "k2": K2}, signing="k2")
    new = rotated.sign(claims(run="run-2"))
    assert jwt.get_unverified_header(new)["kid"] == "k2"
    assert rotated.verify(old, now=NOW).run == "run-1"
    assert rotated.verify(new, now=NOW).run == "run-2"
    retired = LeaseKeys({"k2": K2})
    assert retired.verify(new, now=NOW).run == "run-2"
    with pytest.raises(LeaseInvalid, match="unknown key id 'k1'"):
        retired.verify(old, now=NOW)


def test_a_token_signed_with_another_secret_under_a_known_kid_is_forged() -> None:
    forged = LeaseKeys({"k1": b"x" * 32}, signing="k1").sign(claims())
    with pytest.raises(LeaseInvalid):
        LeaseKeys({"k1": K1}).verify(forged, now=NOW)


def _with_payload(token: str, **changes: object) -> str:
    header, payload, signature = token.split(".")
    raw = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    raw.update(changes)
    edited = base64.urlsafe_b64encode(json.dumps(raw).encode()).rstrip(b"=").decode()
    return f"{header}.{edited}.{signature}"


@pytest.mark.parametrize(
    "change",
    [{"exp": NOW + 10_000}, {"run": "run-9"}, {"agent": "billing-bot"}, {"gen": 8}, {"tenant": "other"}],
)
def test_tampered_claims_are_invalid(change: dict[str, object]) -> None:
    keys = LeaseKeys({"k1": K1}, signing="k1")
    token = keys.sign(claims())
    assert keys.verify(token, now=NOW)  # the good token is cached; the edit must not ride on it
    with pytest.raises(LeaseInvalid):
        keys.verify(_with_payload(token, **change), now=NOW)


def test_unsigned_and_wrong_algorithm_tokens_are_invalid() -> None:
    keys = LeaseKeys({"k1": K1}, signing="k1")
    payload = claims().payload()
    unsigned = jwt.encode(payload, cast(Any, None), algorithm="none", headers={"kid": "k1"})
    with pytest.raises(LeaseInvalid):
        keys.verify(unsigned, now=NOW)
    hs512 = jwt.encode(payload, K1 * 2, algorithm="HS512", headers={"kid": "k1"})
    with pytest.raises(LeaseInvalid):
        keys.verify(hs512, now=NOW)


@pytest.mark.parametrize("missing", ["run", "agent", "tenant", "ver", "gen", "iat", "exp", "aud"])
def test_a_missing_claim_is_invalid(missing: str) -> None:
    payload = claims().payload()
    del payload[missing]
    token = jwt.encode(payload, K1, algorithm="HS256", headers={"kid": "k1"})
    with pytest.raises(LeaseInvalid):
        LeaseKeys({"k1": K1}).verify(token, now=NOW)


@pytest.mark.parametrize(
    "bad", [{"gen": -1}, {"gen": "7"}, {"gen": True}, {"run": ""}, {"exp": "soon"}, {"aud": "other"}]
)
def test_ill_typed_claims_are_invalid(bad: dict[str, object]) -> None:
    payload = {**claims().payload(), **bad}
    token = jwt.encode(payload, K1, algorithm="HS256", headers={"kid": "k1"})
    with pytest.raises(LeaseInvalid):
        LeaseKeys({"k1": K1}).verify(token, now=NOW)


@given(st.text(max_size=300))
def test_arbitrary_text_is_refused_never_a_crash(text: str) -> None:
    with pytest.raises(LeaseInvalid):
        LeaseKeys({"k1": K1}).verify(text, now=NOW)


def test_keys_are_checked_up_front() -> None:
    with pytest.raises(ValueError, match="needs 32 or more"):
        LeaseKeys({"k1": b"short"})
    with pytest.raises(ValueError, match="not among"):
        LeaseKeys({"k1": K1}, signing="k2")
    with pytest.raises(ValueError, match="at least one key"):
        LeaseKeys({})
    with pytest.raises(ValueError, match="only verify"):
        LeaseKeys({"k1": K1}).sign(claims())
