"""Agent identities from an identity provider: JWTs from a local issuer (a real HTTP server publishing
a JWKS, tokens signed with real keys), through a real gateway, with real MCP clients."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp.types import CallToolResult

from control_harness import TOKEN, control, issue
from haltwire.config import ConfigError
from haltwire.gateway.config import parse_config
from haltwire.gateway.issuer import IssuerEdge
from haltwire.refusal import Refusal
from harness import config_dict, connect, running_gateway, running_upstream
from issuer_harness import (
    REFRESH_S,
    LocalIssuer,
    hmac_with,
    issuer_section,
    publishing,
    tampered,
    unsigned,
)
from plane_harness import TOKENS, bearer, full_plane
from ports import free_port

pytestmark = pytest.mark.anyio

#: ops-bot 1.4 (stable) and 1.5 (canary) of tenant acme, from the gateway's own table.
STABLE = {"agent": "ops-bot", "tenant": "acme", "version": "1.4", "token": "tok-stable"}
CANARY = {"agent": "ops-bot", "tenant": "acme", "version": "1.5", "token": "tok-canary"}


def refusal_of(result: CallToolResult) -> dict[str, Any] | None:
    if not result.is_error:
        return None
    error: dict[str, Any] = (result.structured_content or {})["error"]
    return error


async def code_of(client: Client) -> str | None:
    error = refusal_of(await client.call_tool("lookup_order", {"order_id": "A-1"}))
    return None if error is None else str(error["code"])


async def until_code(client: Client, code: str | None, within: float = 10.0) -> None:
    with anyio.fail_after(within):
        while await code_of(client) != code:
            await anyio.sleep(0.05)


async def edge(url: str, token: str) -> httpx2.Response:
    """One ``tools/list`` POST with ``token`` as the bearer token."""
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": "2025-11-25",
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    async with httpx2.AsyncClient(timeout=30) as http:
        return await http.post(url, headers=headers, content=json.dumps(body))


def assert_unauthenticated(response: httpx2.Response, why: str) -> None:
    assert response.status_code == 401, f"{why}: {response.status_code} {response.text}"
    error = response.json()["error"]
    assert error["code"] == "unauthenticated" and error["retryable"] is False, why
    assert response.headers["www-authenticate"].startswith("Bearer"), why


@asynccontextmanager
async def issuer_gateway(
    jwks_url: str, upstream: str, **sections: Any
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """A gateway with the stable and canary tokens and ``[issuer]`` for the local provider."""
    issuer = issuer_section(jwks_url, **sections.pop("issuer", {}))
    config = config_dict(upstream, identities=[STABLE, CANARY], issuer=issuer, **sections)
    async with running_gateway(config) as (_, url):
        yield url, config


async def test_a_version_stop_refuses_the_canary_from_the_config_and_the_issuer_alike(
    tmp_path: Path,
) -> None:
    idp = LocalIssuer()
    idp.add_key("k1", "rsa")
    async with (
        control(tmp_path) as (plane, _),
        running_upstream() as (demo, up),
        publishing(idp) as jwks_url,
    ):
        link = {"url": str(plane.base_url), "token": TOKEN["gateway"]}
        async with (
            issuer_gateway(jwks_url, up, control=link) as (url, _),
            connect(url, "tok-stable") as stable,
            connect(url, "tok-canary") as canary,
            connect(url, idp.token("ops-bot", "1.4")) as stable_jwt,
            connect(url, idp.token("ops-bot", "1.5")) as canary_jwt,
        ):
            clients = (stable, canary, stable_jwt, canary_jwt)
            for client in clients:
                assert await code_of(client) is None

            stop = await issue(plane, "version:ops-bot@1.5")
            await until_code(canary_jwt, "stopped")
            served = demo.served["lookup_order"]
            for client in (canary, canary_jwt):
                error = refusal_of(await client.call_tool("lookup_order", {"order_id": "A-1"}))
                assert error is not None and (error["scope"], error["stop_id"]) == (
                    "version:ops-bot@1.5",
                    stop["stop_id"],
                )
            assert demo.served["lookup_order"] == served, "the stopped canary reached no upstream"
            for client in (stable, stable_jwt):
                assert await code_of(client) is None
            assert demo.served["lookup_order"] == served + 2


async def test_tokens_the_issuer_did_not_vouch_for_get_401_and_reach_nothing() -> None:
    idp = LocalIssuer()
    idp.add_key("k1", "ec")
    idp.add_key("rogue", "ec", publish=False)  # a key of the caller's own, not in the JWKS
    async with running_upstream() as (demo, up), publishing(idp) as jwks_url:
        async with issuer_gateway(jwks_url, up) as (url, _):
            good = idp.claims("ops-bot", "1.5")
            assert (await edge(url, idp.sign(good))).status_code == 200  # the control case
            forged = {
                "expired": idp.sign({**good, "exp": good["iat"] - 1}),
                "not valid yet": idp.sign({**good, "nbf": good["iat"] + 600}),
                "without exp": idp.sign({k: v for k, v in good.items() if k != "exp"}),
                "for another audience": idp.sign({**good, "aud": "https://other.example.test/mcp"}),
                "from another issuer": idp.sign({**good, "iss": "https://evil.example.test"}),
                "unsigned (alg none)": unsigned(good, "k1"),
                "HS256 keyed with the public key": hmac_with(idp.public_pem("k1"), good, "k1"),
                "signed by a key not published": idp.sign(good, "rogue"),
                "with a changed payload": tampered(idp.sign(good), agent_version="1.4"),
                "naming no agent": idp.sign({k: v for k, v in good.items() if k != "agent_id"}),
                "naming an agent no stop could name": idp.sign({**good, "agent_id": "ops\nbot"}),
                "naming its version with a number": idp.sign({**good, "agent_version": 1.5}),
            }
            for why, token in forged.items():
                assert_unauthenticated(await edge(url, token), why)
            # A key id the issuer never published refetches its JWKS, at most once per refresh_s.
            fetches, started = idp.fetches, time.monotonic()
            for n in range(20):
                assert_unauthenticated(await edge(url, idp.sign(good, "rogue")), f"rogue {n}")
            assert idp.fetches - fetches <= 1 + (time.monotonic() - started) / REFRESH_S
    assert demo.served["lookup_order"] == 0


async def test_an_unreachable_jwks_refuses_the_issuers_tokens_until_it_answers() -> None:
    idp = LocalIssuer()
    idp.add_key("k1", "ed25519")
    port = free_port()
    jwks_url = f"http://127.0.0.1:{port}/jwks.json"
    async with (
        running_upstream() as (_, up),
        issuer_gateway(jwks_url, up, issuer={"keys_ttl_s": 2.0}) as (url, _),  # starts without keys
    ):
        token = idp.token("ops-bot", "1.5")
        # Nothing listens there: no key is cached, so the token is refused (fail closed), at
        # once, and the gateway's own identities are served all the same.
        assert_unauthenticated(await edge(url, token), "no JWKS")
        async with connect(url, "tok-stable") as stable:
            assert await code_of(stable) is None

        async with publishing(idp, port):
            with anyio.fail_after(10):  # the next fetch, past refresh_s from the failed one
                while (await edge(url, token)).status_code == 401:
                    await anyio.sleep(0.1)
            async with connect(url, token) as canary:
                assert await code_of(canary) is None
                # The issuer fails: keys fetched within keys_ttl_s still verify.
                idp.failing = True
                assert await code_of(canary) is None
                # Past keys_ttl_s they must be fetched again, and cannot be: refused, and a
                # failed fetch is not retried on every request.
                with anyio.fail_after(10):
                    while (await edge(url, token)).status_code != 401:
                        await anyio.sleep(0.1)
                fetches, started = idp.fetches, time.monotonic()
                for n in range(20):
                    assert_unauthenticated(await edge(url, token), f"down {n}")
                assert idp.fetches - fetches <= 1 + (time.monotonic() - started) / REFRESH_S


async def test_rotated_keys_are_learned_and_withdrawn_ones_expire() -> None:
    idp = LocalIssuer()
    idp.add_key("k1", "ec")
    async with running_upstream() as (_, up), publishing(idp) as jwks_url:
        async with issuer_gateway(jwks_url, up, issuer={"keys_ttl_s": 2.0}) as (url, _):
            old = idp.token("ops-bot", "1.4", kid="k1")
            assert (await edge(url, old)).status_code == 200
            # The issuer rotates: k2 published, k1 withdrawn; a token signed with k2 refetches.
            idp.add_key("k2", "rsa")
            idp.published = ["k2"]
            new = idp.token("ops-bot", "1.4", kid="k2")
            with anyio.fail_after(10):  # refetched once refresh_s has passed since the last fetch
                while (await edge(url, new)).status_code == 401:
                    await anyio.sleep(0.1)
            # k1 is gone from the JWKS: once the set fetched with it expires, k1 verifies nothing.
            with anyio.fail_after(10):
                while (await edge(url, old)).status_code != 401:
                    await anyio.sleep(0.1)
            assert_unauthenticated(await edge(url, old), "withdrawn key")
            assert (await edge(url, new)).status_code == 200


async def test_issuer_identities_count_apart_under_the_issuers_limits_and_may_need_a_lease() -> None:
    idp = LocalIssuer()
    idp.add_key("k1", "ec")
    leases = {"keys": [{"kid": "k1", "secret": "k1-secret-" + "x" * 32}]}
    async with running_upstream() as (_, up), publishing(idp) as jwks_url:
        section = {"limits": {"budget": 2}}
        async with (
            issuer_gateway(jwks_url, up, issuer=section, limits={"budget": 5}) as (url, _),
            connect(url, idp.token("ops-bot", "1.5")) as canary,
            connect(url, idp.token("ops-bot", "1.4")) as stable,
            connect(url, idp.token("ops-bot", "1.4", tenant="globex")) as globex,
        ):
            for client in (canary, stable, globex):
                for _ in range(2):
                    assert await code_of(client) is None
                assert await code_of(client) == "budget_exhausted"
        # With [leases], an issued identity must present a lease like a configured one, unless
        # [issuer] lease = "optional" (the opt-out is per source: the config's entries keep theirs).
        async with (
            issuer_gateway(jwks_url, up, leases=leases) as (url, _),
            connect(url, idp.token("ops-bot", "1.5")) as canary,
            connect(url, "tok-canary") as configured,
        ):
            assert await code_of(canary) == "lease_invalid"
            assert await code_of(configured) == "lease_invalid"
        async with (
            issuer_gateway(jwks_url, up, issuer={"lease": "optional"}, leases=leases) as (url, _),
            connect(url, idp.token("ops-bot", "1.5")) as canary,
            connect(url, "tok-canary") as configured,
        ):
            assert await code_of(canary) is None
            assert await code_of(configured) == "lease_invalid"


@pytest.mark.parametrize(
    ("change", "key", "problem"),
    [
        ({"algorithms": ["RS256", "HS256"]}, "issuer.algorithms", "'HS256' is not a public-key"),
        ({"algorithms": ["none"]}, "issuer.algorithms", "'none' is not a public-key"),
        ({"jwks_url": "file:///etc/jwks.json"}, "issuer.jwks_url", "http:// or https://"),
        ({"audience": ""}, "issuer.audience", "at least 1 character"),
        ({"development": False}, "(top level)", "issuer.jwks_url: keys fetched over plain http"),
        ({"lease": "required"}, "(top level)", "issuer.lease: a lease is required"),
    ],
)
def test_a_bad_issuer_section_names_the_key_and_the_problem(
    change: dict[str, Any], key: str, problem: str
) -> None:
    development = change.pop("development", True)
    data = config_dict(
        "http://127.0.0.1:9",
        issuer={**issuer_section("http://127.0.0.1:9/jwks.json"), **change},
        gateway={"development": development},
    )
    if not development:
        data["identities"] = []  # plain tokens are for development only
    with pytest.raises(ConfigError) as raised:
        parse_config(data, "gw.toml")
    message = str(raised.value)
    assert message.startswith(f"gw.toml: {key}: "), message
    assert problem in message


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_HEADER_VALUES = st.sampled_from(["ES256", "RS256", "EdDSA", "none", "HS256", "k1"]) | _JSON


@settings(max_examples=100, deadline=None)  # no per-example deadline: the machine is shared
@given(
    header=st.dictionaries(st.sampled_from(["alg", "kid", "typ", "crit"]), _HEADER_VALUES, max_size=4),
    payload=_JSON,
    signature=st.text(max_size=40),
)
def test_any_jwt_shaped_token_is_a_refusal_never_an_exception(
    header: dict[str, Any], payload: Any, signature: str
) -> None:
    # Nothing listens at the JWKS URL: a token that gets as far as its key is refused for want of one.
    config = parse_config(config_dict("http://127.0.0.1:9", issuer=issuer_section("http://127.0.0.1:9/jwks")))
    assert config.issuer is not None
    edge = IssuerEdge(config.issuer)

    def part(value: Any) -> str:
        text = json.dumps(value, allow_nan=True)
        return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode()

    for token in (f"{part(header)}.{part(payload)}.{signature}", f"{part(header)}.{signature}"):
        outcome = anyio.run(edge.resolve, token)
        assert isinstance(outcome, Refusal) and outcome.code == "unauthenticated"


async def test_broker_credentials_and_the_issuers_tokens_share_one_gateway(tmp_path: Path) -> None:
    # Both are JWTs: the broker's (iss "haltwire") go to its verifier, the rest to the issuer's.
    idp = LocalIssuer()
    idp.add_key("k1", "ec")
    async with (
        full_plane({"backend": "sqlite", "path": str(tmp_path / "control.db")}) as (plane, _),
        running_upstream() as (_, up),
        publishing(idp) as jwks_url,
    ):
        base = str(plane.base_url).rstrip("/")
        a1 = {"agent": "a1", "tenant": "acme", "version": "2.1", "token": "tok-a1"}
        config = config_dict(
            up,
            identities=[a1],
            control={"url": base, "token": TOKENS["gateway"]},
            broker={"jwks_url": f"{base}/.well-known/jwks.json", "audience": "orders"},
            issuer=issuer_section(jwks_url),
        )
        r = await plane.post("/v1/runs", json={"run_id": "r-1"}, headers=bearer("agent"))
        assert r.status_code == 201, r.text
        r = await plane.post("/v1/runs/r-1/credentials", json={"audience": "orders"}, headers=bearer("agent"))
        assert r.status_code == 201, r.text
        async with (
            running_gateway(config) as (_, url),
            connect(url, r.json()["token"]) as by_credential,
            connect(url, idp.token("a1", "2.1")) as by_issuer,
        ):
            assert await code_of(by_credential) is None and await code_of(by_issuer) is None
            # A stop on the credential's run refuses it; the issuer's token is in no run.
            r = await plane.post(
                "/v1/stops", json={"scope": "run:r-1", "reason": "x"}, headers=bearer("operator")
            )
            assert r.status_code == 201, r.text
            await until_code(by_credential, "stopped")
            assert await code_of(by_issuer) is None
