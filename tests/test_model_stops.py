"""A stop on one model (``model:NAME``): it refuses and cuts calls to that model, by every agent,
and nothing else; like a ``tool:`` stop it ends no run (no lease is fenced by it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import openai
import pytest

from control_harness import TOKEN, cli
from haltwire.identity import Identity
from haltwire.scope import Scope, ScopeError, call_scopes, run_scopes
from models_harness import LEASE_SECRET, lease_token, model_stack, refused, until_refused

pytestmark = pytest.mark.anyio

OPS = Identity("ops-bot", "acme", "1.0")


def test_a_model_scope_parses_and_is_in_a_model_calls_scopes_only() -> None:
    assert Scope.parse("model:gpt-5") == Scope("model", "gpt-5")
    with pytest.raises(ScopeError, match="model:NAME"):
        Scope.parse("models:gpt-5")
    with pytest.raises(ScopeError, match="empty or padded"):
        Scope.parse("model: gpt-5")
    model_call = call_scopes(OPS, None, "r-1", "gpt-5")
    assert Scope("model", "gpt-5") in model_call and not any(s.kind == "tool" for s in model_call)
    assert not any(s.kind == "model" for s in call_scopes(OPS, "gpt-5", "r-1"))  # a tool of that name
    assert not any(s.kind == "model" for s in run_scopes("r-1", "ops-bot", "acme", "1.0"))


async def test_a_model_stop_cuts_and_refuses_that_model_only_and_fences_no_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leases = {"keys": [{"kid": "k1", "secret": LEASE_SECRET}]}
    async with model_stack(tmp_path, control=True, leases=leases, limits={"max_in_flight": 4}) as s:
        lease = {"Haltwire-Lease": lease_token("run-7")}
        client = s.client(max_retries=0, default_headers=lease)
        stream: Any = await client.chat.completions.create(
            model="scripted-hang", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        events = aiter(stream)
        await anext(events)  # the provider is generating
        seen = s.provider.seen[-1]

        # The operator's command, as an operator types it.
        monkeypatch.setenv("HALTWIRE_CONTROL_URL", str(s.control))
        monkeypatch.setenv("HALTWIRE_TOKEN", TOKEN["operator"])
        assert await cli("stop", "--model", "scripted-hang", "--reason", "the model leaks prompts") == 0
        with pytest.raises(openai.APIError) as caught:
            async for _ in events:
                pass
        body = caught.value.body
        assert isinstance(body, dict)
        assert (body["code"], body["scope"], body["reason"]) == ("stopped", "model:scripted-hang", "the model leaks prompts")
        with anyio.fail_after(5):
            await seen.disconnected.wait()  # the provider's request was closed
        stop_id = body["stop_id"]

        # New calls to that model are refused; other models are served, in the same run with
        # the same lease.
        said = await refused(s, "ops-bot", "scripted-hang", **lease)
        assert said is not None and (said["code"], said["stop_id"]) == ("stopped", stop_id), said
        assert await refused(s, "ops-bot", "gpt-test", **lease) is None

        # Cleared: the same lease calls the model again (a model stop fences no run).
        await s.clear(stop_id)
        with anyio.fail_after(5):
            while await refused(s, "ops-bot", "scripted-hang", **lease) is not None:
                await anyio.sleep(0.05)
        assert await refused(s, "ops-bot", "gpt-test", **lease) is None


async def test_a_model_stop_reaches_every_agent_and_the_broadest_stop_is_named(tmp_path: Path) -> None:
    """Every agent's calls to the model are refused, no other model's. Under both a model stop
    and an agent stop, a call is refused naming the agent's (the one an operator clears last)."""
    async with model_stack(tmp_path, control=True) as s:
        model = await s.stop("model:gpt-test", "one model")
        await until_refused(s, "stopped")
        for agent in ("ops-bot", "billing-bot"):
            said = await refused(s, agent)
            assert said is not None and (said["scope"], said["stop_id"]) == ("model:gpt-test", model["stop_id"])
            assert await refused(s, agent, "scripted-other") is None
        agent_stop = await s.stop("agent:ops-bot", "the agent")
        with anyio.fail_after(5):
            while ((await refused(s)) or {}).get("stop_id") != agent_stop["stop_id"]:
                await anyio.sleep(0.05)
        said = await refused(s)
        assert said is not None and said["scope"] == "agent:ops-bot"
