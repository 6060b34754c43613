"""Model calls through the gateway (issue 14): the scripted provider and the gateway on loopback,
the official ``openai`` client for both endpoints, whole and streamed."""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any

import anyio
import httpx2
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from haltwire.config import ConfigError
from haltwire.demo.stack import CONTROL_TOKENS
from haltwire.gateway import create_app
from haltwire.gateway.config import parse_config
from haltwire.gateway.killswitch import write_suspensions
from haltwire.gateway.usage import Usage
from haltwire.listener import ListenerLimits
from haltwire.runtime import ControlClient, Lease
from harness import TOKENS, config_dict, connect
from model_provider import chat_events
from models_harness import (
    LEASE_SECRET,
    OPS,
    PROVIDER_KEY,
    Stack,
    lease_token,
    model_stack,
    refused,
    until_refused,
)
from redis_process import shared_prefix

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def config_error(models: list[dict[str, Any]], *, development: bool = True) -> str:
    data = config_dict("http://127.0.0.1:1", models=models)
    if not development:
        data = {"upstreams": [{"name": "demo", "url": "http://127.0.0.1:1/mcp"}], "models": models}
    with pytest.raises(ConfigError) as caught:
        create_app(parse_config(data))
    return str(caught.value)


def test_models_config_errors_name_what_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HALTWIRE_NO_SUCH_KEY", raising=False)
    entry = {"name": "p", "base_url": "http://127.0.0.1:1/v1", "api_key_env": "HALTWIRE_NO_SUCH_KEY"}
    unset = config_error([{**entry, "models": ["m"]}])
    assert "models[0].api_key_env" in unset and "HALTWIRE_NO_SUCH_KEY is not set" in unset
    assert "give the model names" in config_error([entry])
    twice = config_error([{**entry, "prefixes": ["gpt-"]}, {**entry, "name": "q", "prefixes": ["gpt-"]}])
    assert "prefix 'gpt-' is routed by 'p' already" in twice
    assert "use https" in config_error([{**entry, "models": ["m"]}], development=False)


async def test_whole_answers_arrive_unchanged_and_the_provider_gets_its_key_not_the_agents(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with model_stack(tmp_path) as s:
        client = s.client()
        chat = await client.chat.completions.with_raw_response.create(model="gpt-test", messages=MESSAGES)
        resp = await client.responses.with_raw_response.create(model="scripted-1", input="hi")
        for raw, path in ((chat, CHAT), (resp, RESPONSES)):
            seen = s.provider.on(path)[-1]
            assert raw.http_response.content == seen.sent[0]  # byte for byte
            assert raw.headers["x-request-id"] == "req_scripted"
            assert raw.headers["openai-processing-ms"] == "7"
            assert seen.headers["authorization"] == f"Bearer {PROVIDER_KEY}"
            assert TOKENS["ops-bot"] not in json.dumps(seen.headers)
            assert PROVIDER_KEY not in raw.http_response.text + json.dumps(dict(raw.headers))
        assert chat.parse().choices[0].message.content == "Hello there."
        assert resp.parse().output_text == "Hello there."
        assert s.provider.on(CHAT)[-1].body == {"model": "gpt-test", "messages": MESSAGES}
    assert "HTTP Request: POST" in caplog.text  # the clients' logs were captured, at every level
    assert PROVIDER_KEY not in caplog.text


async def test_an_answer_compressed_anyway_is_relayed_decoded_and_counted(tmp_path: Path) -> None:
    async with model_stack(tmp_path) as s:
        raw = await s.client().chat.completions.with_raw_response.create(model="scripted-gzip", messages=MESSAGES)
        seen = s.provider.on(CHAT)[-1]
        assert seen.headers["accept-encoding"] == "identity"
        assert raw.http_response.content == seen.sent[0] and "content-encoding" not in raw.headers
        assert (await s.app.models.usage.read(OPS) if s.app.models else {})["identity"].input == 11


async def test_a_providers_error_is_passed_on_as_it_came(tmp_path: Path) -> None:
    async with model_stack(tmp_path) as s:
        with pytest.raises(openai.BadRequestError) as caught:
            await s.client().chat.completions.create(model="scripted-fail", messages=MESSAGES)
        assert caught.value.body == {"message": "scripted failure", "type": "invalid_request_error", "param": None, "code": "bad"}
        assert s.counted.requests[CHAT] == 1  # a 400 is not retried


async def _streamed_bytes(s: Stack, path: str, **kwargs: Any) -> bytes:
    client = s.client()
    if path == CHAT:
        create: Any = client.chat.completions.with_streaming_response.create
        cm = create(model="scripted-s", messages=MESSAGES, stream=True, **kwargs)
    else:
        cm = client.responses.with_streaming_response.create(model="scripted-s", input="hi", stream=True)
    async with cm as raw:
        return b"".join([chunk async for chunk in raw.iter_bytes()])


@pytest.mark.parametrize("asks_usage", [True, False], ids=["asks-usage", "no-usage"])
async def test_a_chat_stream_arrives_unchanged_but_for_the_usage_chunk_the_gateway_asked_for(
    tmp_path: Path, asks_usage: bool
) -> None:
    async with model_stack(tmp_path) as s:
        options = {"stream_options": {"include_usage": True}} if asks_usage else {}
        got = await _streamed_bytes(s, CHAT, **options)
        seen = s.provider.on(CHAT)[-1]
        assert seen.body["stream_options"] == {"include_usage": True}  # asked for, either way
        expected = chat_events("scripted-s", 1, include_usage=True)
        if not asks_usage:
            expected = [e for e in expected if b'"choices": []' not in e]
        assert got == b"".join(expected)
        assert seen.sent == chat_events("scripted-s", 1, include_usage=True)
        # The official client reads it as a stream of chunks.
        stream = await s.client().chat.completions.create(model="scripted-s", messages=MESSAGES, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == "Hello there."


async def test_a_responses_stream_arrives_unchanged(tmp_path: Path) -> None:
    async with model_stack(tmp_path) as s:
        got = await _streamed_bytes(s, RESPONSES)
        assert got == b"".join(s.provider.on(RESPONSES)[-1].sent)
        stream = await s.client().responses.create(model="scripted-s", input="hi", stream=True)
        kinds = [event.type async for event in stream]
        assert kinds == ["response.created", *["response.output_text.delta"] * 2, "response.completed"]


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_usage_is_counted_exactly_for_both_endpoints_whole_and_streamed(tmp_path: Path, backend: str) -> None:
    with contextlib.ExitStack() as redis:
        counters: dict[str, Any] = {"backend": "memory"}
        if backend == "redis":
            url, prefix = redis.enter_context(shared_prefix("hwmodels"))
            # A generous timeout: the first round trip (connect, load the script) on a busy machine.
            counters = {"backend": "redis", "url": url, "prefix": prefix, "timeout_s": 5.0}
        await _count_usage(tmp_path, counters)


#: Per million tokens: scripted-s's own price, and every other model's.
PRICES = {
    "scripted-s": {"input_per_mtok": 2.0, "output_per_mtok": 8.0},
    "*": {"input_per_mtok": 1.0, "output_per_mtok": 4.0},
}


async def _count_usage(tmp_path: Path, counters: dict[str, Any]) -> None:
    async with model_stack(tmp_path, counters=counters, prices=PRICES) as s:
        client = s.client()
        await client.chat.completions.create(model="gpt-test", messages=MESSAGES)
        await client.responses.create(model="gpt-test", input="hi")
        stream = await client.chat.completions.create(model="scripted-s", messages=MESSAGES, stream=True)
        async for _ in stream:
            pass
        stream2 = await client.responses.create(model="scripted-s", input="hi", stream=True)
        async for _ in stream2:
            pass
        # The provider's n-th request answers usage n times its unit (chat 11/3, responses 13/5).
        tokens = [(11, 3), (26, 10), (33, 9), (52, 20)]
        money = (11 * 1 + 3 * 4) + (26 * 1 + 10 * 4) + (33 * 2 + 9 * 8) + (52 * 2 + 20 * 8)
        expected = Usage(sum(i for i, _ in tokens), sum(o for _, o in tokens), money)
        assert s.app.models is not None
        with anyio.fail_after(5):  # counted once each call has ended, after its client has the answer
            while await s.app.models.usage.read(OPS) != {"identity": expected, "tenant": expected}:
                await anyio.sleep(0.02)


async def test_unknown_model_and_bad_token_are_refused_once(tmp_path: Path) -> None:
    async with model_stack(tmp_path) as s:
        with pytest.raises(openai.NotFoundError) as caught:
            await s.client().chat.completions.create(model="other", messages=MESSAGES)
        assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "unknown_model"
        with pytest.raises(openai.AuthenticationError) as denied:
            await s.client(token="not-a-token").responses.create(model="gpt-test", input="hi")
        assert isinstance(denied.value.body, dict) and denied.value.body["code"] == "unauthenticated"
        assert denied.value.response.headers["x-should-retry"] == "false"
        assert s.counted.requests == {CHAT: 1, RESPONSES: 1}
        assert s.provider.seen == []


async def test_a_suspended_agent_is_refused_403_once_without_retry(tmp_path: Path) -> None:
    kill = tmp_path / "suspended.json"
    write_suspensions(kill, ["ops-bot"])
    async with model_stack(tmp_path, gateway={"development": True, "suspended_file": str(kill)}) as s:
        for path in (CHAT, RESPONSES):
            with pytest.raises(openai.PermissionDeniedError) as caught:
                if path == CHAT:
                    await s.client().chat.completions.create(model="gpt-test", messages=MESSAGES)
                else:
                    await s.client().responses.create(model="gpt-test", input="hi", stream=True)
            body = caught.value.body
            assert isinstance(body, dict) and body["code"] == "agent_suspended" and body["retryable"] is False
            assert caught.value.response.headers["x-should-retry"] == "false"
            assert s.counted.requests[path] == 1
        assert s.provider.seen == []


async def test_provider_unreachable_is_transient_503_with_retry_after(tmp_path: Path) -> None:
    async with model_stack(tmp_path, provider_url="http://127.0.0.1:9") as s:
        with pytest.raises(openai.InternalServerError) as caught:
            await s.client(max_retries=0).chat.completions.create(model="gpt-test", messages=MESSAGES)
        body = caught.value.body
        assert isinstance(body, dict) and body["code"] == "upstream_unavailable" and body["retryable"] is True
        assert caught.value.response.status_code == 503
        assert caught.value.response.headers["retry-after"] == "5"
        assert PROVIDER_KEY not in caught.value.response.text


async def _wait(event: anyio.Event, within: float = 5.0) -> None:
    with anyio.fail_after(within):
        await event.wait()


# -- stops, leases and ceilings (a control plane on loopback) ---------------------------------------


@pytest.mark.parametrize("path", [CHAT, RESPONSES])
async def test_a_stop_refuses_model_calls_of_its_scope_once_and_a_tool_stop_does_not(
    tmp_path: Path, path: str
) -> None:
    async with model_stack(tmp_path, control=True) as s:
        tool_stop = await s.stop("tool:lookup_order")
        stop = await s.stop("agent:ops-bot", "refund storm")
        await until_refused(s, "stopped")
        before = dict(s.counted.requests)
        for stream in (False, True):
            with pytest.raises(openai.PermissionDeniedError) as caught:
                if path == CHAT:
                    await s.client().chat.completions.create(model="gpt-test", messages=MESSAGES, stream=stream)
                else:
                    await s.client().responses.create(model="gpt-test", input="hi", stream=stream)
            body = caught.value.body
            assert isinstance(body, dict)
            assert (body["code"], body["scope"], body["stop_id"], body["reason"]) == (
                "stopped",
                "agent:ops-bot",
                stop["stop_id"],
                "refund storm",
            )
            assert body["retryable"] is False and body["type"] == "haltwire_refusal"
            assert caught.value.response.headers["x-should-retry"] == "false"
        assert s.counted.requests[path] - before.get(path, 0) == 2  # one request each: no retry
        assert await refused(s, "billing-bot") is None  # another agent; the tool stop is no model stop
        await s.clear(stop["stop_id"])
        with anyio.fail_after(5):
            while await refused(s) is not None:
                await anyio.sleep(0.05)
        await s.clear(tool_stop["stop_id"])


@pytest.mark.parametrize("path", [CHAT, RESPONSES])
async def test_a_stop_cuts_an_open_stream_and_the_provider_sees_the_close(tmp_path: Path, path: str) -> None:
    async with model_stack(tmp_path, control=True, limits={"max_in_flight": 1}) as s:
        client = s.client()
        if path == CHAT:
            stream: Any = await client.chat.completions.create(model="scripted-hang", messages=MESSAGES, stream=True)
        else:
            stream = await client.responses.create(model="scripted-hang", input="hi", stream=True)
        events = aiter(stream)
        await anext(events)  # the provider is generating
        seen = s.provider.on(path)[-1]
        assert len(s.app.gateway.inflight or ()) == 1
        stop = await s.stop("agent:ops-bot", "runaway")
        issued = anyio.current_time()
        with pytest.raises(openai.APIError) as caught:
            async for _ in events:
                pass
        ended = anyio.current_time() - issued
        body = caught.value.body
        assert isinstance(body, dict) and (body["code"], body["stop_id"]) == ("stopped", stop["stop_id"])
        await _wait(seen.disconnected)  # the provider's request was closed
        assert not seen.finished
        assert ended < 2.0, f"stop to stream end: {ended * 1000:.0f} ms"
        assert len(s.app.gateway.inflight or ()) == 0
        await s.clear(stop["stop_id"])
        with anyio.fail_after(5):  # the slot was given back: the one allowed call is served
            while await refused(s) is not None:
                await anyio.sleep(0.05)


@pytest.mark.parametrize("listener", [ListenerLimits(), None], ids=["haltwire-listener", "uvicorn"])
async def test_a_client_that_hangs_up_closes_the_providers_stream(
    tmp_path: Path, listener: ListenerLimits | None
) -> None:
    async with model_stack(tmp_path, listener=listener) as s:
        stream = await s.client().chat.completions.create(model="scripted-hang", messages=MESSAGES, stream=True)
        events = aiter(stream)
        await anext(events)
        await stream.close()
        await _wait(s.provider.on(CHAT)[-1].disconnected)


async def test_a_model_call_needs_a_lease_names_its_run_and_a_run_stop_refuses_it(tmp_path: Path) -> None:
    leases = {"keys": [{"kid": "k1", "secret": LEASE_SECRET}]}
    async with model_stack(tmp_path, control=True, leases=leases) as s:
        missing = await refused(s)
        assert missing is not None and missing["code"] == "lease_invalid"
        lease = {"Haltwire-Lease": lease_token("run-7")}
        assert await refused(s, **lease) is None
        assert "haltwire-lease" not in s.provider.seen[-1].headers
        assert s.app.models is not None
        counts = await s.app.models.usage.read(OPS, "run-7")
        assert counts["run"] == Usage(11, 3)  # no price: no money counted
        stop = await s.stop("run:run-7")
        with anyio.fail_after(5):
            while ((await refused(s, **lease)) or {}).get("code") != "stopped":
                await anyio.sleep(0.05)
        said = await refused(s, **lease)
        assert said is not None and said["stop_id"] == stop["stop_id"]
        assert await refused(s, **{"Haltwire-Lease": lease_token("run-8")}) is None  # another run


async def test_a_model_call_is_one_step_of_the_budget_refused_once_past_it(tmp_path: Path) -> None:
    async with model_stack(tmp_path, limits={"budget": 1, "window_s": 1_000_000_000}) as s:
        await s.client().responses.create(model="gpt-test", input="hi")
        with pytest.raises(openai.PermissionDeniedError) as caught:
            await s.client().responses.create(model="gpt-test", input="hi")
        assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "budget_exhausted"
        assert s.counted.requests[RESPONSES] == 2
        assert len(s.provider.seen) == 1


async def test_a_model_configured_to_count_as_no_step_spends_no_step_of_the_tool_budget(tmp_path: Path) -> None:
    limits = {"budget": 1, "window_s": 1_000_000_000}
    async with model_stack(tmp_path, limits=limits, model_options={"counts_as_step": False}) as s:
        for _ in range(3):
            await s.client().responses.create(model="gpt-test", input="hi")
        async with connect(s.base_url.removesuffix("/v1") + "/mcp", TOKENS["ops-bot"]) as mcp:
            served = await mcp.call_tool("lookup_order", {"order_id": "A-1"})
            assert not served.is_error, served
            refused_ = await mcp.call_tool("lookup_order", {"order_id": "A-1"})
            assert refused_.is_error and (refused_.structured_content or {})["error"]["code"] == "budget_exhausted"


async def test_too_many_in_flight_is_transient_429_with_retry_after(tmp_path: Path) -> None:
    async with model_stack(tmp_path, limits={"max_in_flight": 1}) as s:
        stream = await s.client().chat.completions.create(model="scripted-hang", messages=MESSAGES, stream=True)
        events = aiter(stream)
        await anext(events)
        with pytest.raises(openai.RateLimitError) as caught:
            await s.client(max_retries=0).chat.completions.create(model="gpt-test", messages=MESSAGES)
        body = caught.value.body
        assert isinstance(body, dict) and body["code"] == "too_many_in_flight" and body["retryable"] is True
        assert caught.value.response.headers["retry-after"] == "1"
        assert "x-should-retry" not in caught.value.response.headers
        await stream.close()


async def test_a_cut_model_call_is_in_the_run_report(tmp_path: Path) -> None:
    async with (
        model_stack(tmp_path, runs=True) as s,
        ControlClient(s.control or "", CONTROL_TOKENS["ops-bot"]) as control,
        Lease.start(control, push=False) as lease,
    ):
        client = s.client(default_headers={"Haltwire-Lease": lease.token})
        stream = await client.responses.create(model="scripted-hang", input="hi", stream=True)
        events = aiter(stream)
        await anext(events)
        stop = await s.stop(f"run:{lease.run_id}")
        with pytest.raises(openai.APIError) as caught:
            async for _ in events:
                pass
        assert isinstance(caught.value.body, dict) and caught.value.body["stop_id"] == stop["stop_id"]
        await _wait(s.provider.on(RESPONSES)[-1].disconnected)
        async with httpx2.AsyncClient(base_url=s.control or "", timeout=10) as http:
            with anyio.fail_after(15):
                while not (calls := await _report_calls(http, s, lease.run_id)):
                    await anyio.sleep(0.1)
    assert len(calls) == 1
    call = calls[0]
    assert (call["tool"], call["label"], call["outcome"], call["stop_id"]) == (
        "model:scripted-hang",
        "cancellable",
        "cancelled",
        stop["stop_id"],
    )


async def _report_calls(http: httpx2.AsyncClient, s: Stack, run_id: str) -> list[dict[str, Any]]:
    r = await http.get(f"/v1/runs/{run_id}/report", headers=s.operator)
    assert r.status_code == 200, r.text
    calls: list[dict[str, Any]] = r.json()["calls"]
    return calls


async def test_models_routed_by_a_prefix_share_one_count_and_named_ones_have_their_own(tmp_path: Path) -> None:
    limits = {"window_s": 1_000_000_000, "tools": {"model:scripted-*": {"budget": 1}}}
    async with model_stack(tmp_path, limits=limits) as s:
        await s.client().responses.create(model="scripted-a", input="hi")
        with pytest.raises(openai.PermissionDeniedError) as caught:
            await s.client().responses.create(model="scripted-made-up", input="hi")
        assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "budget_exhausted"
        await s.client().responses.create(model="gpt-test", input="hi")  # routed by name: its own count
        assert [seen.body["model"] for seen in s.provider.seen] == ["scripted-a", "gpt-test"]


async def test_a_stream_past_its_deadline_is_cut_and_ended_with_deadline_exceeded(tmp_path: Path) -> None:
    async with model_stack(tmp_path, limits={"deadline_s": 1.0}) as s:
        stream = await s.client().chat.completions.create(model="scripted-hang", messages=MESSAGES, stream=True)
        with pytest.raises(openai.APIError) as caught:
            async for _ in stream:
                pass
        body = caught.value.body
        assert isinstance(body, dict) and body["code"] == "deadline_exceeded" and body["retryable"] is False
        await _wait(s.provider.on(CHAT)[-1].disconnected)


async def test_a_body_too_large_or_naming_no_model_is_refused_in_openais_shape(tmp_path: Path) -> None:
    async with model_stack(tmp_path) as s, httpx2.AsyncClient(timeout=10) as http:
        auth = {"authorization": f"Bearer {TOKENS['ops-bot']}"}
        url = f"{s.base_url}/chat/completions"
        big = await http.post(url, content=b'{"model": "gpt-test", "x": "' + b"a" * 1_100_000 + b'"}', headers=auth)
        assert big.status_code == 413 and big.json()["error"]["code"] == "payload_too_large"
        for body in (b"[1]", b'{"model": 7}', b"not json", b'{"model": "gpt-test", "n": NaN}'):
            r = await http.post(url, content=body, headers=auth)
            assert r.status_code == 422, body
            error = r.json()["error"]
            assert (error["code"], error["type"]) == ("invalid_request", "invalid_request_error")
            assert r.headers["x-should-retry"] == "false"
        assert s.provider.seen == []
