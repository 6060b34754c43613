"""Egress profiles and the egress config (rules only, no network): what an allow entry means,
which addresses a name may reach, and the config errors that name the key."""

from __future__ import annotations

import ipaddress
import tomllib
from pathlib import Path

import pytest

from haltwire.config import ConfigError
from haltwire.egress import load_config, parse_config
from haltwire.egress.auth import presented_token
from haltwire.egress.config import Profiles
from haltwire.egress.profiles import NOTHING, Entry, Profile
from haltwire.refusal import Refusal
from haltwire.tokens import LeaseClaims, LeaseKeys

WEB = Profile.parse(
    "web", ["api.example.com:443", "*.github.com:*", "10.1.0.0/16:5432", "[fd00::1]:80", "127.0.0.1:8080"]
)


def code(r: Refusal | None) -> str | None:
    return None if r is None else r.code


@pytest.mark.parametrize(
    ("host", "port", "allowed"),
    [
        ("api.example.com", 443, True),
        ("API.Example.com.", 443, True),
        ("api.example.com", 80, False),
        ("example.com", 443, False),
        ("evil-api.example.com", 443, False),
        ("raw.github.com", 22, True),
        ("github.com", 443, False),  # *.NAME is the subdomains, not the apex
        ("10.1.2.3", 5432, True),
        ("10.2.0.1", 5432, False),
        ("fd00::1", 80, True),
        ("127.0.0.1", 8080, True),
        ("127.0.0.1", 8081, False),
        ("8.8.8.8", 53, False),  # an address, public or not, needs an address entry
    ],
)
def test_a_name_or_address_is_allowed_only_by_an_entry_with_its_port(
    host: str, port: int, allowed: bool
) -> None:
    assert (WEB.name_refusal("run-1", host, port) is None) is allowed


def test_a_name_reaches_public_addresses_and_only_the_non_public_ones_listed() -> None:
    ip = ipaddress.ip_address
    assert WEB.address_refusal("run-1", "api.example.com", 443, ip("93.184.216.34")) is None
    for private in (
        "127.0.0.1",
        "10.9.9.9",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "::1",
        "fe80::1",
        "0.0.0.0",
    ):
        refused = WEB.address_refusal("run-1", "api.example.com", 443, ip(private))
        assert code(refused) == "egress_denied", private
        assert refused is not None and dict(refused.extra)["address"] == private
    # Listed by address (and port): a name resolving to it may reach it.
    assert WEB.address_refusal("run-1", "db.internal", 5432, ip("10.1.4.4")) is None
    assert code(WEB.address_refusal("run-1", "db.internal", 5433, ip("10.1.4.4"))) == "egress_denied"
    # IPv4-mapped IPv6 is judged as the IPv4 address it maps.
    assert code(WEB.address_refusal("run-1", "x.example", 443, ip("::ffff:127.0.0.2"))) == "egress_denied"


def test_none_allows_nothing() -> None:
    refused = NOTHING.name_refusal("run-1", "api.example.com", 443)
    assert refused is not None and refused.code == "egress_denied" and "profile is none" in refused.message
    with pytest.raises(ValueError, match="allows nothing"):
        Profile.parse("none", ["a.example:1"])


@pytest.mark.parametrize(
    "entry",
    [
        "api.example.com",
        "api.example.com:0",
        "api.example.com:http",
        "::1:80",
        "[::1:80",
        "10.0.0.1/8:1",
        "a*b.com:1",
        "*:443",
    ],
)
def test_a_bad_entry_is_refused_with_its_text(entry: str) -> None:
    with pytest.raises(ValueError, match=r"^'"):
        Entry.parse(entry)


def _config(egress: dict[str, object], **rest: object) -> dict[str, object]:
    return {
        "egress": {"development": True, **egress},
        "control": {"url": "http://127.0.0.1:1", "token": "t"},
        "leases": {"keys": [{"kid": "k1", "secret": "s" * 40}]},
        **rest,
    }


def test_the_config_names_the_key_of_each_problem() -> None:
    cases: dict[str, dict[str, object]] = {
        "egress: profiles.web: 'nope': an allow entry is HOST:PORT": {"profiles": {"web": ["nope"]}},
        "egress: agents.ops-bot: no profile is named 'missing'": {"agents": {"ops-bot": "missing"}},
        "egress: default_profile: no profile is named 'missing'": {"default_profile": "missing"},
    }
    for expected, egress in cases.items():
        with pytest.raises(ConfigError) as info:
            parse_config(_config(egress))
        assert expected in str(info.value)
    with pytest.raises(ConfigError, match="use token_env"):
        parse_config(_config({"development": False}))
    with pytest.raises(ConfigError, match="control"):
        parse_config({"egress": {}, "leases": {"keys": [{"kid": "k1", "secret": "s" * 40}]}})


def test_an_agent_gets_its_profile_and_others_the_default() -> None:
    config = parse_config(_config({"profiles": {"web": ["a.example:443"]}, "agents": {"ops-bot": "web"}}))
    profiles = Profiles(config.egress)
    assert profiles.for_agent("ops-bot").name == "web"
    assert profiles.for_agent("anyone-else") is NOTHING
    config = parse_config(_config({"profiles": {"web": []}, "default_profile": "web"}))
    assert Profiles(config.egress).for_agent("anyone").name == "web"


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Basic cnVuLTE6dG9r", "tok"),  # run-1:tok
        ("basic   cnVuLTE6dG9r ", "tok"),
        ("Basic OnRvaw==", "tok"),  # no user
        ("Bearer tok", "tok"),
        (None, None),
        ("Basic cnVuLTE6", None),  # no password
        ("Basic cnVuLTE=", None),  # no colon
        ("Basic ***", None),
        ("Token tok", None),
        ("Basic " + "A" * 9000, None),
    ],
)
def test_the_token_comes_from_basic_or_bearer(header: str | None, token: str | None) -> None:
    got = presented_token(header)
    if token is None:
        assert isinstance(got, Refusal) and got.code == "proxy_auth_required"
    else:
        assert got == token


def test_the_example_config_is_valid_and_verifies_the_example_control_planes_leases() -> None:
    root = Path(__file__).resolve().parent.parent
    config = load_config(root / "examples/egress.toml")
    assert Profiles(config.egress).for_agent("ops-bot").name == "web"
    control = tomllib.loads((root / "examples/control.toml").read_text())
    signing = LeaseKeys({k["kid"]: k["secret"].encode() for k in control["leases"]["keys"]}, signing="k1")
    token = signing.sign(LeaseClaims("run-1", "ops-bot", "acme", "1.0", 0, 0.0, 2e9))
    assert config.leases.lease_keys().verify(token, now=1.0).run == "run-1"
    assert config.broker is not None and config.broker.audience in control["broker"]["audiences"]
