"""The credential broker (stop level 4) through a real control plane and the example downstream service.

Issue for the run's own agent, refusals (another agent's run, an unknown audience, no
``[broker]``), the JWKS verifying what was issued, the credential map (API and CLI), and
revocation: a stop on the run (or its agent, tenant, version, or everything) refuses a new
issue at once and makes ``examples/downstream`` refuse the run's existing, unexpired credential
within the propagation bound, while other runs' credentials still work; after the clear the
old credential stays dead and a new one works. Key rotation, and the verifier refusing
tampered, forged, expired and wrong-audience credentials.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from broker_harness import (
    PROPAGATION_S,
    broker,
    code_of,
    credential,
    downstream,
    gateway_stack,
    issued,
    mcp_client,
    order,
    plane,
    refusal_of,
    until_status,
)
from control_harness import TOKEN, cli
from haltwire.config import ConfigError
from haltwire.control import parse_control_config
from haltwire.control.broker import BrokerKeys
from haltwire.control.config import BrokerSection
from haltwire.credentials import CredentialRefused
from runs_harness import auth, clear, config_dict, issue, register

pytestmark = pytest.mark.anyio

# -- issue, refusals, JWKS ----------------------------------------------------------------------


async def test_a_run_gets_a_credential_the_jwks_verifies(tmp_path: Path, store: dict[str, Any]) -> None:
    async with plane(store, broker(tmp_path)) as client:
        run = (await register(client, run_id="r-1"))["run"]
        before = time.time()
        r = await credential(client, "r-1")
        assert r.status_code == 201, r.text
        body = r.json()
        assert set(body) == {"token", "jti", "audience", "issued_at", "expires_at", "kid"}
        assert (body["audience"], body["kid"]) == ("orders", "k1")
        assert body["expires_at"] - body["issued_at"] == pytest.approx(600)
        assert before - 1 <= body["issued_at"] <= time.time() + 1

        # The JWKS is public and verifies the token with PyJWT alone.
        r = await client.get("/.well-known/jwks.json")
        assert r.status_code == 200
        keys = r.json()["keys"]
        assert [(k["kid"], k["kty"], k["crv"], k["alg"], k["use"]) for k in keys] == [
            ("k1", "OKP", "Ed25519", "EdDSA", "sig")
        ]
        public = jwt.PyJWKSet.from_dict(r.json())["k1"].key
        assert jwt.get_unverified_header(body["token"])["kid"] == "k1"
        claims = jwt.decode(body["token"], public, algorithms=["EdDSA"], audience="orders", issuer="haltwire")
        assert claims["sub"] == claims["run"] == "r-1" and claims["jti"] == body["jti"]
        assert (claims["agent"], claims["tenant"], claims["ver"]) == (
            run["agent"],
            run["tenant"],
            run["version"],
        )
        assert claims["gen"] == 0 and claims["exp"] == body["expires_at"]
        with pytest.raises(jwt.InvalidAudienceError):
            jwt.decode(body["token"], public, algorithms=["EdDSA"], audience="billing")

        # Refusals: another tenant's run (as unknown), an unknown run, an unknown audience, a role.
        r = await credential(client, "r-1", who="agent-2")
        assert (r.status_code, code_of(r)) == (404, "unknown_run")
        r = await credential(client, "r-nope")
        assert (r.status_code, code_of(r)) == (404, "unknown_run")
        r = await credential(client, "r-1", audience="payroll")
        assert (r.status_code, code_of(r)) == (422, "invalid_request") and "payroll" in r.text
        r = await credential(client, "r-1", who="operator")
        assert (r.status_code, r.json()["error"]["needed_roles"]) == (403, ["agent"])
        r = await client.post(
            "/v1/runs/r-1/credentials", json={"audience": "orders", "x": 1}, headers=auth("agent")
        )
        assert r.status_code == 422
        # An ended run gets no more credentials.
        await register(client, run_id="r-ended")
        assert (await client.post("/v1/runs/r-ended/end", headers=auth("agent"))).status_code == 200
        r = await credential(client, "r-ended")
        assert (r.status_code, code_of(r)) == (409, "run_ended")

        # Only the successful issue is in the map; every attempt is in the audit log.
        r = await client.get("/v1/runs/r-1/credentials", headers=auth("viewer"))
        assert [c["jti"] for c in r.json()["credentials"]] == [body["jti"]]
        records = (await client.get("/v1/audit", headers=auth("operator"))).json()["records"]
        issues = [(x["outcome"], x["target"]) for x in records if x["action"] == "credential.issue"]
        assert issues.count(("ok", "r-1")) == 1 and ("refused", "r-nope") in issues
        assert ("refused", "r-ended") in issues and issues.count(
            ("refused", "r-1")
        ) == 4  # agent-2, payroll, operator, bad body


async def test_without_a_broker_the_credential_endpoints_answer_501_and_no_keys_are_published(
    tmp_path: Path,
) -> None:
    async with plane({"backend": "sqlite", "path": str(tmp_path / "c.db")}, None) as client:
        await register(client, run_id="r-1")
        r = await credential(client, "r-1")
        assert (r.status_code, code_of(r)) == (501, "broker_not_configured")
        # Not a server error: the feature is off, and the keys are not there (issue 12, point 7).
        r = await client.get("/.well-known/jwks.json")
        assert (r.status_code, code_of(r)) == (404, "broker_not_configured")
        assert r.json()["error"]["retryable"] is False and "[broker]" in r.json()["error"]["message"]
        # The map still answers (empty): an operator can read it after the broker is removed.
        r = await client.get("/v1/runs/r-1/credentials", headers=auth("operator"))
        assert r.json() == {"credentials": []}


def test_broker_config_is_checked_up_front(tmp_path: Path) -> None:
    base = config_dict({"backend": "sqlite", "path": str(tmp_path / "c.db")})
    production = {**base, "control": {"development": False}, "identities": [], "leases": None}
    for section, problem in (
        ({**broker(tmp_path), "ttl_s": 60}, "300 to 900"),
        ({**broker(tmp_path), "ttl_s": 1000}, "less than or equal to 900"),
        ({"audiences": ["orders"], "generate": True}, "development"),
        ({**broker(tmp_path), "signing_key": "k9"}, "not among the keys"),
        ({"audiences": ["orders"]}, "at least one key"),
    ):
        with pytest.raises(ConfigError, match=problem):
            parse_control_config({**production, "broker": section})
    # Development may go below 5 minutes, and generate a key.
    dev = parse_control_config({**base, "broker": {"ttl_s": 2, "audiences": ["o"], "generate": True}})
    assert dev.broker is not None and len(BrokerKeys.from_config(dev.broker).jwks()["keys"]) == 1
    missing = BrokerSection.model_validate(
        {
            "audiences": ["o"],
            "signing_key": "k1",
            "keys": [{"kid": "k1", "private_key_env": "HW_NO_SUCH_VAR"}],
        }
    )
    with pytest.raises(ConfigError, match="HW_NO_SUCH_VAR"):
        BrokerKeys.from_config(missing)
    (tmp_path / "bad.pem").write_text("not a key")
    bad = BrokerSection.model_validate(
        {
            "audiences": ["o"],
            "signing_key": "k1",
            "keys": [{"kid": "k1", "private_key_file": str(tmp_path / "bad.pem")}],
        }
    )
    with pytest.raises(ConfigError, match="not a PEM private key"):
        BrokerKeys.from_config(bad)


# -- revocation ---------------------------------------------------------------------------------


async def stop_and_clear(client: httpx2.AsyncClient, scope: str, others_survive: bool) -> None:
    """r-1 (agent a1) and r-2 (agent a2, another tenant) hold credentials; a stop on ``scope``
    kills r-1's at the downstream service, r-2's too only when ``others_survive`` is False."""
    await register(client, run_id="r-1")
    await register(client, "agent-2", run_id="r-2")
    old, other = await issued(client, "r-1"), await issued(client, "r-2", who="agent-2")
    async with downstream(client) as (service, _):
        for token in (old, other):
            r = await order(service, token)
            assert r.status_code == 200 and r.json()["order_id"] == "1001", r.text
        assert (await order(service, old)).json()["run"] == "r-1"

        stop = await issue(client, scope)
        # Issuing is refused at once (the control plane's own mirror), and stays refused.
        for _ in range(2):
            r = await credential(client, "r-1")
            assert (r.status_code, code_of(r)) == (409, "stopped"), r.text
            assert (r.json()["error"]["scope"], r.json()["error"]["stop_id"]) == (scope, stop["stop_id"])
        # The downstream service refuses the existing credential (with ~10 minutes left).
        await until_status(service, old, 401, PROPAGATION_S)
        r = await order(service, old)
        assert code_of(r) == "credential_revoked" and r.headers["www-authenticate"].startswith("Bearer")
        assert jwt.decode(old, options={"verify_signature": False})["exp"] > time.time() + 500
        if others_survive:
            assert (await order(service, other)).status_code == 200
            assert (await credential(client, "r-2", who="agent-2")).status_code == 201
        else:
            await until_status(service, other, 401, PROPAGATION_S)

        await clear(client, stop["stop_id"])
        fresh = await issued(client, "r-1")
        await until_status(service, fresh, 200, PROPAGATION_S)
        # Issued before the stop: dead for good, though the stop is cleared and it is unexpired.
        r = await order(service, old)
        assert (r.status_code, code_of(r)) == (401, "credential_revoked"), r.text
        assert "revision" in r.json()["error"]["message"]
        assert (await order(service, other)).status_code == (200 if others_survive else 401)

    # The refused issues are audited once for the run and the stop, not once per attempt.
    records = (await client.get("/v1/audit", headers=auth("operator"))).json()["records"]
    refused = [x for x in records if x["action"] == "credential.issue" and x["outcome"] == "refused"]
    assert [(x["target"], x["detail"]["stop_id"]) for x in refused] == [("r-1", stop["stop_id"])]


async def test_a_run_stop_revokes_the_runs_credentials(tmp_path: Path, store: dict[str, Any]) -> None:
    async with plane(store, broker(tmp_path)) as client:
        await stop_and_clear(client, "run:r-1", others_survive=True)


@pytest.mark.parametrize(
    ("scope", "others_survive"),
    [("agent:a1", True), ("tenant:acme", True), ("version:a1@2.1", True), ("global", False)],
)
async def test_broader_stops_revoke_too(tmp_path: Path, scope: str, others_survive: bool) -> None:
    async with plane({"backend": "sqlite", "path": str(tmp_path / "c.db")}, broker(tmp_path)) as client:
        await stop_and_clear(client, scope, others_survive)


async def test_the_downstream_service_fails_closed_when_the_control_plane_is_gone(tmp_path: Path) -> None:
    registry = {"backend": "sqlite", "path": str(tmp_path / "c.db")}
    up, gone = anyio.Event(), anyio.Event()
    held: dict[str, Any] = {}

    async def control_plane() -> None:  # in its own task: it ends while the service runs on
        async with plane(registry, broker(tmp_path), graceful_s=1) as client:
            await register(client, run_id="r-1")
            held.update(client=client, token=await issued(client, "r-1"))
            up.set()
            await gone.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(control_plane)
        await up.wait()
        async with downstream(held["client"], staleness_s=1.5) as (service, _):
            token = held["token"]
            assert (await order(service, token)).status_code == 200
            gone.set()
            # The control plane is gone: after staleness_s nothing is accepted (a stop may be unseen).
            took = await until_status(service, token, 503, 5.0)
            r = await order(service, token)
            assert code_of(r) == "registry_unreachable" and r.json()["error"]["retryable"] is True
            assert took >= 0.5  # not at once: heartbeats kept it fresh until the plane went


def test_a_gateway_broker_section_needs_control() -> None:
    from haltwire.gateway.config import parse_config
    from harness import config_dict as gateway_dict

    data = {**gateway_dict("http://127.0.0.1:9/mcp"), "broker": {"jwks_url": "http://127.0.0.1:9/jwks"}}
    with pytest.raises(ConfigError, match="needs \\[control\\]"):
        parse_config(data)


# -- the credential map -------------------------------------------------------------------------


async def test_the_credential_map_lists_every_credential_and_the_cli_prints_it(
    tmp_path: Path,
    store: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with plane(store, broker(tmp_path)) as client:
        await register(client, run_id="r-1")
        await register(client, "agent-2", run_id="r-2")
        bodies = []
        for audience in ("orders", "billing", "orders"):  # "renewal" is asking again
            r = await credential(client, "r-1", audience=audience)
            assert r.status_code == 201
            bodies.append(r.json())
        await issued(client, "r-2", who="agent-2")
        r = await client.get("/v1/runs/r-1/credentials", headers=auth("operator"))
        listed = r.json()["credentials"]
        assert [c["jti"] for c in listed] == [b["jti"] for b in bodies]
        assert listed[1] == {k: v for k, v in bodies[1].items() if k != "token"} | {"run_id": "r-1"}
        assert all("token" not in c for c in listed)
        # The owner reads its own run's map; another tenant's agent finds no such run.
        assert (await client.get("/v1/runs/r-1/credentials", headers=auth("agent"))).status_code == 200
        assert (await client.get("/v1/runs/r-1/credentials", headers=auth("agent-2"))).status_code == 404
        assert (await client.get("/v1/runs/r-nope/credentials", headers=auth("viewer"))).status_code == 404

        url = str(client.base_url).rstrip("/")
        monkeypatch.setenv("HALTWIRE_CONTROL_URL", url)
        monkeypatch.setenv("HALTWIRE_TOKEN", TOKEN["viewer"])
        assert await cli("credentials", "r-1") == 0
        lines = capsys.readouterr().out.strip().splitlines()
        assert [line.split()[0] for line in lines] == [b["jti"] for b in bodies]
        assert "billing" in lines[1] and "unexpired" in lines[1]
        assert await cli("credentials", "r-1", "--json") == 0
        assert json.loads(capsys.readouterr().out) == listed
        assert await cli("credentials", "r-nope") == 1
        assert "no run has the id r-nope" in capsys.readouterr().err
        assert await cli("credentials", "r-1", "--token", TOKEN["tripwire"]) == 1
        assert await cli("credentials", "r-1", "--url", "http://127.0.0.1:9") == 3


# -- keys ---------------------------------------------------------------------------------------


async def test_key_rotation_keeps_credentials_of_both_keys_valid(tmp_path: Path) -> None:
    """Rotation: the plane restarts with k2 added and signing; k1 stays published until its
    last credentials expire, so credentials of both keys verify."""
    registry = {"backend": "sqlite", "path": str(tmp_path / "c.db")}
    async with plane(registry, broker(tmp_path, ("k1",), "k1")) as first:
        await register(first, run_id="r-1")
        old = await issued(first, "r-1")
    async with plane(registry, broker(tmp_path, ("k1", "k2"), "k2")) as second:
        new = await issued(second, "r-1")
        assert jwt.get_unverified_header(old)["kid"] == "k1"
        assert jwt.get_unverified_header(new)["kid"] == "k2"
        kids = [k["kid"] for k in (await second.get("/.well-known/jwks.json")).json()["keys"]]
        assert kids == ["k1", "k2"]
        async with downstream(second) as (service, _):
            for token in (old, new):
                assert (await order(service, token)).status_code == 200
        r = await second.get("/v1/runs/r-1/credentials", headers=auth("operator"))
        assert [c["kid"] for c in r.json()["credentials"]] == ["k1", "k2"]
    # Once k1 is dropped, its credentials no longer verify.
    async with plane(registry, broker(tmp_path, ("k2",), "k2")) as third:
        async with downstream(third) as (service, _):
            assert (await order(service, new)).status_code == 200
            r = await order(service, old)
            assert (r.status_code, code_of(r)) == (401, "credential_invalid")


async def test_an_unknown_kid_refetches_the_jwks_at_most_once_per_period(tmp_path: Path) -> None:
    """A verifier that started before k2 existed accepts a k2 credential: the unknown kid
    makes it refetch the JWKS. Unknown kids do not make it refetch more than once per period."""
    registry = {"backend": "sqlite", "path": str(tmp_path / "c.db")}
    async with plane(registry, broker(tmp_path, ("k1", "k2"), "k2")) as client:
        await register(client, run_id="r-1")
        token = await issued(client, "r-1")
        async with downstream(client, jwks_refresh_s=0.5) as (service, verifier):
            verifier.keys.load({"keys": []})  # as if started before any of today's keys existed
            await anyio.sleep(0.6)  # and a refresh period ago
            assert (await order(service, token)).status_code == 200
            assert verifier.keys.fetches == 2 and verifier.keys.kids == {"k1", "k2"}
            forged = jwt.encode(
                {"aud": "orders"}, Ed25519PrivateKey.generate(), algorithm="EdDSA", headers={"kid": "k-evil"}
            )
            for _ in range(3):
                r = await order(service, forged)
                assert (r.status_code, code_of(r)) == (401, "credential_invalid")
            assert verifier.keys.fetches == 2  # within the period: no refetch storm
            await anyio.sleep(0.6)
            assert (await order(service, forged)).status_code == 401
            assert verifier.keys.fetches == 3


async def test_the_verifier_refuses_tampered_forged_expired_and_misaddressed_credentials(
    tmp_path: Path,
) -> None:
    now = [time.time()]
    registry = {"backend": "sqlite", "path": str(tmp_path / "c.db")}
    async with plane(registry, broker(tmp_path)) as client:
        await register(client, run_id="r-1")
        good = await issued(client, "r-1")
        billing = await issued(client, "r-1", audience="billing")
        header, payload, signature = good.split(".")
        claims = jwt.decode(good, options={"verify_signature": False})
        tampered_payload = jwt.utils.base64url_encode(json.dumps({**claims, "run": "r-2"}).encode()).decode()
        impostor = Ed25519PrivateKey.generate()
        cases = {
            "tampered": f"{header}.{tampered_payload}.{signature}",
            "forged with the real kid": jwt.encode(
                claims, impostor, algorithm="EdDSA", headers={"kid": "k1"}
            ),
            "unsigned": jwt.encode(claims, "", algorithm="none", headers={"kid": "k1"}),
            "HMAC with the public key": jwt.encode(
                claims, "x" * 32, algorithm="HS256", headers={"kid": "k1"}
            ),
            "for another audience": billing,
            "not a JWT": "garbage",
            "truncated": f"{header}.{payload}",
        }
        async with downstream(client, clock=lambda: now[0]) as (service, _):
            assert (await order(service, good)).status_code == 200
            for name, token in cases.items():
                r = await order(service, token)
                assert (r.status_code, code_of(r)) == (401, "credential_invalid"), name
            r = await order(service, None)
            assert (r.status_code, code_of(r)) == (401, "credential_missing")
            # Expiry is judged by the service's clock: 10 minutes on, the credential is dead.
            now[0] = claims["exp"]
            r = await order(service, good)
            assert (r.status_code, code_of(r)) == (401, "credential_expired")
            now[0] = claims["exp"] - 1
            assert (await order(service, good)).status_code == 200
        # The billing service takes the billing credential and not the orders one.
        async with downstream(client, audience="billing") as (service, verifier):
            assert (await order(service, billing)).status_code == 200
            assert (await order(service, good)).status_code == 401
            with pytest.raises(CredentialRefused) as refused:
                await verifier.verify(good)
            assert refused.value.code == "credential_invalid" and "udience" in refused.value.message


async def test_broker_responses_match_the_openapi_document(tmp_path: Path) -> None:
    from openapi_harness import conforms

    issue_path, jwks_path = "/v1/runs/{run_id}/credentials", "/.well-known/jwks.json"
    async with plane({"backend": "sqlite", "path": str(tmp_path / "c.db")}, broker(tmp_path)) as client:
        await register(client, run_id="r-1")
        r = await credential(client, "r-1")
        assert r.status_code == 201 and conforms(r, "post", issue_path)["kid"] == "k1"
        for who, run_id, audience, status in (
            ("agent-2", "r-1", "orders", 404),  # another tenant's run
            ("agent", "r-nope", "orders", 404),
            ("agent", "r-1", "payroll", 422),
        ):
            r = await credential(client, run_id, who, audience)
            assert r.status_code == status and conforms(r, "post", issue_path)
        stop = await issue(client, "run:r-1")
        r = await credential(client, "r-1")
        assert r.status_code == 409 and conforms(r, "post", issue_path)["error"]["stop_id"] == stop["stop_id"]
        r = await client.get("/v1/runs/r-1/credentials", headers=auth("viewer"))
        assert len(conforms(r, "get", issue_path)["credentials"]) == 1
        r = await client.get("/v1/runs/r-1/credentials", headers=auth("agent-2"))
        assert r.status_code == 404 and conforms(r, "get", issue_path)
        assert len(conforms(await client.get(jwks_path), "get", jwks_path)["keys"]) == 1
    async with plane({"backend": "sqlite", "path": str(tmp_path / "d.db")}, None) as client:
        await register(client, run_id="r-1")
        r = await credential(client, "r-1")
        assert r.status_code == 501 and conforms(r, "post", issue_path)
        r = await client.get(jwks_path)
        assert r.status_code == 404 and conforms(r, "get", jwks_path)


# -- the gateway accepts broker credentials as bearer tokens -----------------------------------


@pytest.mark.parametrize("path", ["fast", "sdk"])
async def test_the_gateway_serves_a_broker_credential_as_its_identity_in_its_run(
    tmp_path: Path, path: str
) -> None:
    from stops_harness import until

    async with gateway_stack(tmp_path) as (client, url, demo):
        await register(client, run_id="r-1")
        await register(client, run_id="r-2")
        old = await issued(client, "r-1", audience="haltwire-gateway")
        other = await issued(client, "r-2", audience="haltwire-gateway")
        async with mcp_client(url, old, path) as c, mcp_client(url, other, path) as c2:
            before = demo.served["lookup_order"]
            assert await refusal_of(c) is None and await refusal_of(c2) is None
            assert demo.served["lookup_order"] == before + 2

            # The credential carries its run: a stop on r-1 refuses it, not r-2's.
            stop = await issue(client, "run:r-1")

            async def stopped() -> bool:
                error = await refusal_of(c)
                return error is not None and error["code"] == "stopped"

            await until(stopped, PROPAGATION_S)
            error = await refusal_of(c)
            assert error is not None and (error["scope"], error["stop_id"]) == ("run:r-1", stop["stop_id"])
            assert await refusal_of(c2) is None

            # After the clear, the credential issued before the stop stays refused (fenced);
            # a new one is served.
            await clear(client, stop["stop_id"])

            async def fenced() -> bool:
                error = await refusal_of(c)
                return error is not None and error["code"] == "lease_invalid"

            await until(fenced, PROPAGATION_S)
            fresh = await issued(client, "r-1", audience="haltwire-gateway")
            async with mcp_client(url, fresh, path) as c3:
                assert await refusal_of(c3) is None
        # Refused at the edge (401): a credential for another audience, a forged one, and one
        # whose agent has no identity at this gateway.
        r = await client.post(
            "/v1/runs", json={"run_id": "r-x"}, headers={"Authorization": "Bearer tok-stranger"}
        )
        assert r.status_code == 201, r.text
        stranger = (
            await client.post(
                "/v1/runs/r-x/credentials",
                json={"audience": "haltwire-gateway"},
                headers={"Authorization": "Bearer tok-stranger"},
            )
        ).json()["token"]
        forged = jwt.encode(
            jwt.decode(fresh, options={"verify_signature": False}),
            Ed25519PrivateKey.generate(),
            algorithm="EdDSA",
            headers={"kid": "k1"},
        )
        for token, why in (
            (await issued(client, "r-1", audience="orders"), "udience"),
            (forged, "not valid"),
            (stranger, "agent nobody"),
        ):
            async with httpx2.AsyncClient(timeout=10) as http:
                body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
                headers = {
                    "Authorization": f"Bearer {token}",
                    "Accept": "application/json, text/event-stream",
                }
                r = await http.post(url, json=body, headers=headers)
            assert r.status_code == 401 and why in r.text, r.text
